"""The start-up-first gate's hand-off: how a workload that started before its admission learns it was admitted.

Why: a pod's process start-up (interpreter, torch and PyG imports, loading the graph, building the model) is CPU work
that needs no GPU; the plain gate (``gnnsched gate -- CMD``) runs it only after the node agent admits the job, so a
job that waited at the gate then pays its whole start-up on top of the wait. ``gnnsched gate --prestart -- CMD`` starts
the workload at once and lets a keeper process wait at the gate for it; the workload does its CPU-side start-up, then
blocks on :func:`await_admission` before it touches a GPU. The reservation semantics do not change: nothing reaches a
GPU before admission, the keeper holds the gate connection (its end is the release) exactly as after a plain gate.

The hand-off is one JSON line (:class:`Handoff`) on a pipe whose descriptor number is in ``$GNNSCHED_GATE_HANDOFF_FD``
(``gnnsched.contract.ENV_GATE_HANDOFF_FD``). Until it arrives the workload runs with ``CUDA_VISIBLE_DEVICES`` empty and
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` (set by the gate): a library that probes CUDA during its import sees no GPU and does
not initialise the driver (``torch.cuda.is_available()`` asks NVML instead of calling ``cuInit``). The CUDA driver
reads ``CUDA_VISIBLE_DEVICES`` when it initialises and MPS reads its limits when the context is created, so applying
the admitted environment to ``os.environ`` (which calls ``putenv``) before either happens puts the admitted GPU and
limits in force exactly as an ``exec`` with them would. :func:`apply_admission` refuses when torch has already
initialised CUDA in this process, since the limits could then no longer apply.

Torch-free: the worker imports this before it knows whether it needs torch at all.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from gnnsched.contract import ENV_GATE_HANDOFF_FD

NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""torch's switch that makes ``torch.cuda.is_available()`` ask NVML instead of initialising the CUDA driver."""

EXIT_NO_ADMISSION = 4
"""The keeper ended without an admission (no agent, or the keeper died): the same status as the gate's no-agent."""

MAX_HANDOFF = 64 * 1024


class Handoff(BaseModel):
    """The keeper's one line to the workload.

    ``admitted``: apply ``env`` (the admitted GPU, MPS limits, group; what the plain gate would have exec'd with) and
    remove the names in ``unset`` (the pre-admission guards the gate added). Anything else: exit with ``exit_code``
    after printing ``message``."""

    model_config = ConfigDict(extra="forbid")

    status: Literal["admitted", "rejected", "no-agent"]
    env: dict[str, str] = {}
    unset: list[str] = []
    exit_code: int = 0
    message: str = ""

    def line(self) -> bytes:
        return self.model_dump_json().encode() + b"\n"


class NotAdmitted(Exception):
    """The gate did not admit this workload; ``exit_code`` is the status to exit with, the message says why."""

    def __init__(self, exit_code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def handoff_fd(environ: dict[str, str] | None = None) -> int | None:
    """The hand-off descriptor when this process was started by ``gnnsched gate --prestart``, else None.

    Raises :class:`NotAdmitted` (exit 2) when the variable is set but not a descriptor number: a workload that cannot
    hear its admission must not run."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_GATE_HANDOFF_FD, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise NotAdmitted(2, f"{ENV_GATE_HANDOFF_FD}: not a file descriptor number: {raw!r}")
    return int(raw)


def read_handoff(fd: int) -> Handoff:
    """Block until the keeper's line arrives on ``fd`` (closing it). A keeper that ended without one (EOF) or wrote
    something else means no admission: :class:`NotAdmitted`."""
    buf = b""
    try:
        while b"\n" not in buf and len(buf) <= MAX_HANDOFF:
            try:
                chunk = os.read(fd, 4096)
            except InterruptedError:
                continue
            except OSError as exc:
                raise NotAdmitted(EXIT_NO_ADMISSION, f"{ENV_GATE_HANDOFF_FD}: cannot read the gate's hand-off: {exc}"
                                  ) from None
            if not chunk:
                break
            buf += chunk
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    if b"\n" not in buf:
        raise NotAdmitted(EXIT_NO_ADMISSION, "gate: the keeper ended before the node agent admitted this workload")
    try:
        return Handoff.model_validate_json(buf.split(b"\n", 1)[0])
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "handoff"
        raise NotAdmitted(EXIT_NO_ADMISSION, f"gate hand-off: {where}: {err.get('msg', 'invalid')}") from None


def apply_admission(handoff: Handoff) -> None:
    """Put the admitted environment in force in this process (before CUDA initialises), or raise
    :class:`NotAdmitted` for a rejection."""
    if handoff.status != "admitted":
        raise NotAdmitted(handoff.exit_code or EXIT_NO_ADMISSION, handoff.message or f"gate: {handoff.status}")
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        raise NotAdmitted(EXIT_NO_ADMISSION, "gate: CUDA was initialised before admission; the admitted GPU and MPS "
                                             "limits cannot apply to this process")
    for name in handoff.unset:
        os.environ.pop(name, None)
    os.environ.update(handoff.env)
    os.environ.pop(ENV_GATE_HANDOFF_FD, None)


def await_admission(fd: int) -> Handoff:
    """Wait for the gate and apply what it says: returns the admission (its environment now in ``os.environ``), or
    raises :class:`NotAdmitted`."""
    handoff = read_handoff(fd)
    apply_admission(handoff)
    return handoff
