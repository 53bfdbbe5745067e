"""Fatal faults on a fake GPU: the hardware boundary where a test (or an admin trying gnnsched on one machine) makes a
GPU fail, and both sides of the node see it as they would on real hardware.

Why: MPS's fault domain (one fatal error on a GPU terminates every MPS client on it; the node agent drains the GPU,
marks the clients victims or suspect, and the operator requeues the victims) must be exercised end to end on machines
without a GPU. On a real GPU the driver reports an Xid through NVML to the node agent, and every MPS client's next
CUDA call fails with ``cudaErrorMpsClientTerminated``. Here a *fault directory* plays the GPU: a file named after a
GPU's UUID whose content is an Xid number (``79``, or ``31`` for an application-caused page fault) is that fault.

* The node agent's fake backend (``gnnsched.gpu.backend.FakeGPUBackend``, ``node-agent --fake-gpu-faults DIR``)
  reports each new file as the driver's Xid event for that GPU, once.
* Every gated worker on that GPU (the agent hands ``GNNSCHED_FAKE_GPU_FAULTS=DIR`` to admitted workloads; the worker
  knows its GPU from ``CUDA_VISIBLE_DEVICES``) fails its next step with the error a CUDA client gets from that Xid
  (:func:`client_error_message`), which ``gnnsched worker`` reports as a ``fault`` outcome. A worker admitted after
  the fault (the GPU released by the agent) runs normally: only a fault written after its admission
  (``GNNSCHED_ADMITTED_AT``, set by the gate) terminates it.

* A deterministic bug (``GNNSCHED_FAKE_FAULT_AT_STEP=STEP[:XID]``, read only with ``GNNSCHED_FAKE_GPU_FAULTS``): the
  worker makes its own GPU fail when it reaches step ``STEP`` (counted over the job, resumed steps included): it
  writes the Xid (13, an application Xid, by default) into the fault directory, as a faulty kernel makes the driver
  raise one, and fails with the client's error. Every attempt faults at the same step, as a buggy job does.

Never a production code path: only a node agent with ``--gpus fake:...`` sets the variable.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from gnnsched.attempts.fault_classes import is_hardware_xid
from gnnsched.contract import ENV_ADMITTED_AT, ENV_FAKE_GPU_FAULTS
from gnnsched.errors import FieldError

CHECK_INTERVAL_S = 0.05
"""How often a worker looks at its fault file at most (a stat per step is cheap; this bounds it for tiny steps)."""


def fault_path(directory: str | Path, uuid: str) -> Path:
    """The file that, when it exists, is a fatal fault on GPU ``uuid``."""
    return Path(directory) / uuid


def read_xid(path: Path) -> int | None:
    """The Xid written in a fault file; None when the file is missing or still being written (empty)."""
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if not text:
        return None
    try:
        return int(text.split()[0])
    except ValueError:
        raise FieldError(str(path), f"a fake GPU fault file holds an Xid number, got {text[:40]!r}") from None


def client_error_message(uuid: str, xid: int) -> str:
    """What every CUDA client on the GPU prints after Xid ``xid``.

    An application Xid (``gnnsched.attempts.fault_classes.APPLICATION_XIDS``) gives every client its own fatal error,
    ``cudaErrorIllegalAddress`` (700): on the H100 every client of an MPS fault got 700 and none got 810
    (docs/gpu-measurements.md), so a lone client is the suspect and several cannot be told apart. A hardware Xid
    terminates the clients as MPS does (``cudaErrorMpsClientTerminated``, 810); the rule charges none of them either
    way."""
    if is_hardware_xid(xid):
        return (f"CUDA error: cudaErrorMpsClientTerminated: the MPS client has been terminated by the server "
                f"(fake GPU {uuid}: Xid {xid})")
    return f"CUDA error: an illegal memory access was encountered (fake GPU {uuid}: Xid {xid})"


@dataclass
class FakeGPUFaultWatch:
    """The worker's side: raises the client's CUDA error (:func:`client_error_message`) once a fault is written for
    its GPU after the gate admitted it there (``since``, from ``GNNSCHED_ADMITTED_AT``; the watch's creation when
    unknown).

    A fault written before belongs to an earlier fault the agent has drained (it admits nothing to a draining GPU);
    comparing with the admission, not with the worker's start, keeps a fault that lands while the worker is still
    importing torch from being missed."""

    directory: Path
    uuid: str
    since: float | None = None
    fault_at: tuple[int, int] | None = None
    """``GNNSCHED_FAKE_FAULT_AT_STEP``: (step, Xid) at which this worker's own GPU fails."""
    _baseline: float | None = field(default=None, repr=False)
    _next_check: float = field(default=0.0, repr=False)

    def __post_init__(self) -> None:
        if self.since is None:
            self._baseline = self._mtime()

    def _mtime(self) -> float | None:
        try:
            return os.stat(fault_path(self.directory, self.uuid)).st_mtime
        except OSError:
            return None

    def check(self, step: int | None = None) -> None:
        """Called between steps (``step``: steps done so far, when the caller counts them): raises ``RuntimeError``
        (CUDA's text) when the GPU had a fatal fault meanwhile, or when this worker's own bug strikes at ``step``."""
        if self.fault_at is not None and step is not None and step >= self.fault_at[0]:
            path = fault_path(self.directory, self.uuid)
            tmp = path.with_name(f".{path.name}.{os.getpid()}")
            tmp.write_text(f"{self.fault_at[1]}\n", encoding="utf-8")
            os.replace(tmp, path)  # whole at once: the agent's backend never reads it half-written
            raise RuntimeError(client_error_message(self.uuid, self.fault_at[1]))
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + CHECK_INTERVAL_S
        mtime = self._mtime()
        if mtime is None or mtime == self._baseline or (self.since is not None and mtime < self.since):
            return
        xid = read_xid(fault_path(self.directory, self.uuid))
        if xid is None:  # being written: look again next step
            return
        raise RuntimeError(client_error_message(self.uuid, xid))


def watch_from_env(environ: dict[str, str] | os._Environ[str]) -> FakeGPUFaultWatch | None:
    """The watch ``GNNSCHED_FAKE_GPU_FAULTS`` asks for (None when unset); :class:`FieldError` naming the variable when
    it is set without a GPU to watch or names no directory."""
    raw = environ.get(ENV_FAKE_GPU_FAULTS, "").strip()
    if not raw:
        return None
    if not Path(raw).is_dir():
        raise FieldError(ENV_FAKE_GPU_FAULTS, f"{raw!r} is not a directory")
    uuid = environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not uuid or "," in uuid:
        raise FieldError(ENV_FAKE_GPU_FAULTS, "needs exactly one GPU UUID in CUDA_VISIBLE_DEVICES (the gate sets it)")
    since = None
    admitted = environ.get(ENV_ADMITTED_AT, "").strip()
    if admitted:
        try:
            since = datetime.fromisoformat(admitted.replace("Z", "+00:00")).timestamp()
        except ValueError:
            raise FieldError(ENV_ADMITTED_AT, f"not an RFC 3339 time: {admitted!r}") from None
    return FakeGPUFaultWatch(Path(raw), uuid, since, _fault_at(environ.get(ENV_FAKE_FAULT_AT_STEP, "")))


ENV_FAKE_FAULT_AT_STEP = "GNNSCHED_FAKE_FAULT_AT_STEP"


def _fault_at(raw: str) -> tuple[int, int] | None:
    """``STEP[:XID]`` of ``GNNSCHED_FAKE_FAULT_AT_STEP`` (Xid 13 when left out); None when unset."""
    raw = raw.strip()
    if not raw:
        return None
    step, _, xid = raw.partition(":")
    try:
        at, code = int(step), int(xid or "13")
    except ValueError:
        raise FieldError(ENV_FAKE_FAULT_AT_STEP, f"expected STEP[:XID], got {raw!r}") from None
    if at < 1 or code < 1:
        raise FieldError(ENV_FAKE_FAULT_AT_STEP, f"STEP and XID must be positive, got {raw!r}")
    return at, code
