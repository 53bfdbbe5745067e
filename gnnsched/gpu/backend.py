"""GPU backend: the one place gnnsched touches the GPU driver.

Why an interface: the node agent and the device plugin must run (and be tested) on machines without an NVIDIA
driver. Everything above this module talks to a :class:`GPUBackend`; the real one wraps NVML through
``nvidia-ml-py`` (imported as ``pynvml``), the fake one is an in-memory model of N GPUs whose state tests can
change (mark a GPU unhealthy, set used bytes, add processes, inject Xid errors).

Choose one with :func:`open_backend`, whose ``spec`` is what the CLIs take as ``--gpus``:

* ``"nvml"`` (default): the real driver. If NVML cannot be loaded (no driver, no library) it raises
  :class:`NVMLUnavailableError`, which the CLIs print as one line and exit non-zero.
* ``"fake:NxSIZE[xMODEL]"``, e.g. ``"fake:2x80Gi"`` or ``"fake:4x40GixA100-40GB"``: N fake GPUs of SIZE bytes
  (a Kubernetes quantity) named MODEL (default ``"Fake-GPU"``). MODEL is a catalogue name, alias or NVML name; or
  ``nvml:NAME`` (``"fake:1x96Gixnvml:NVIDIA Z100"``) for a board the catalogue does not know: NAME is reported as
  NVML would, unchecked, so the uncatalogued path (``GPUStatus.catalogued`` false, measured constants only) can be
  exercised without such a GPU. Their UUIDs are derived from the node's name
  (``--node-name``, else ``$NODE_NAME``, else the hostname): two nodes' fake GPUs have distinct UUIDs, as real GPUs do,
  while the agent, the device plugin and the MPS daemon of one node, which each open the backend, agree.

Health: :meth:`GPUBackend.health_events` blocks up to a timeout for Xid (hardware/driver) errors; a GPU that had
a critical Xid stays unhealthy until the process restarts or forgets the mark (:meth:`GPUBackend.forget_xid`, when an
admin returned the repaired GPU to service: a human has to look at it). Xids that an application
causes by itself (see :data:`APPLICATION_XIDS`) are reported but do not mark the GPU unhealthy, otherwise one
buggy job could take a whole GPU out of the cluster.

Heavy import: ``pynvml`` is imported only when the NVML backend is opened, so ``gnnsched --help`` stays fast.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from gnnsched.attempts.fault_classes import APPLICATION_XIDS
from gnnsched.contract import ENV_NODE_NAME

__all__ = [
    "APPLICATION_XIDS",
    "BackendSpecError",
    "FakeGPUBackend",
    "GPUBackend",
    "GPUBackendError",
    "GPUInfo",
    "GPUProcess",
    "HealthEvent",
    "NVMLBackend",
    "NVMLUnavailableError",
    "fake_uuid",
    "open_backend",
    "parse_fake_spec",
]

DEFAULT_FAKE_MODEL = "Fake-GPU"
RAW_NAME_PREFIX = "nvml:"
"""``fake:NxSIZExnvml:NAME``: fake GPUs reporting NAME verbatim (not looked up in the catalogue)."""
DEFAULT_FAKE_DRIVER = "555.42.06-fake"
"""The driver version fake GPUs report until a test changes it (:meth:`FakeGPUBackend.set_driver_version`)."""
FAULT_POLL_S = 0.2
"""How often a fake backend with a fault directory looks for new faults while a watcher waits for health events."""


class GPUBackendError(Exception):
    """Base class of everything this module raises on purpose."""


class NVMLUnavailableError(GPUBackendError):
    """NVML could not be loaded or initialised (no driver, no ``libnvidia-ml.so.1``, no ``pynvml``).

    The message is one line, fit to print as-is before exiting non-zero.
    """


class BackendSpecError(GPUBackendError, ValueError):
    """The ``--gpus`` spec is malformed; ``field`` names the flag, ``message`` says what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class GPUInfo:
    """A snapshot of one GPU. Immutable so it can be compared (did anything change?) and shared across threads."""

    index: int
    uuid: str
    name: str
    total_bytes: int
    used_bytes: int
    healthy: bool = True
    #: Why the GPU is unhealthy ("" when healthy).
    health_reason: str = ""
    #: The critical Xid that made the GPU unhealthy, and when (Unix time); None when healthy or another cause.
    unhealthy_xid: int | None = None
    unhealthy_since: float | None = None
    #: Percent of time a kernel ran over the last sample period; None when the driver does not say.
    utilization_gpu_percent: int | None = None
    #: Percent of time device memory was read or written; None when the driver does not say.
    utilization_memory_percent: int | None = None

    @property
    def free_bytes(self) -> int:
        return max(0, self.total_bytes - self.used_bytes)


@dataclass(frozen=True)
class GPUProcess:
    """A process holding a CUDA context on a GPU.

    ``used_bytes`` is None when the driver cannot attribute memory to the process (it cannot under MPS on some
    drivers, or without permission): callers must not read None as zero.
    """

    pid: int
    used_bytes: int | None
    kind: Literal["compute", "mps"] = "compute"


@dataclass(frozen=True)
class HealthEvent:
    """A driver health event (today: an Xid error) on one GPU."""

    index: int
    uuid: str
    xid: int
    #: True when the event made (or keeps) the GPU unhealthy; False for application-caused Xids.
    critical: bool
    message: str = ""
    at: float = field(default_factory=time.time)


@runtime_checkable
class GPUBackend(Protocol):
    """What gnnsched needs from a GPU driver. Implementations must be safe to call from several threads."""

    def devices(self) -> list[GPUInfo]:
        """All GPUs, ordered by index, with current memory use and health."""
        ...

    def processes(self, index: int) -> list[GPUProcess]:
        """Compute and MPS client processes on GPU ``index`` (deduplicated by pid)."""
        ...

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        """Block up to ``timeout_s`` for health events; return those that arrived (possibly none).

        The fake also returns early (with no events) whenever a test changes its state, so a poller built on
        this call reacts to changes at once instead of at the next tick.
        """
        ...

    def driver_version(self) -> str | None:
        """The driver's version as NVML reports it (``580.159.04``), or None when it cannot be read. The node agent
        re-measures its GPUs' device constants when it changes (``gnnsched.node_agent.constants``)."""
        ...

    def forget_xid(self, uuid: str, up_to: float) -> bool:
        """Drop this process's hardware Xid mark on GPU ``uuid`` if it came at or before ``up_to`` (Unix time): an
        admin returned the GPU to service after that (``gnnsched.return_to_service``). A later mark stays. Returns
        whether a mark was dropped; the next critical Xid marks the GPU again."""
        ...

    def close(self) -> None:
        """Release driver resources. Idempotent."""
        ...


# ---------------------------------------------------------------------------------------------------------------
# spec parsing

_FAKE_RE = re.compile(r"^fake:(?P<count>[^x]+)x(?P<size>[^x]+)(?:x(?P<model>.+))?$")


def parse_fake_spec(spec: str, field: str = "--gpus") -> tuple[int, int, str]:
    """Parse ``fake:NxSIZE[xMODEL]`` into ``(count, total_bytes, model)``; raise :class:`BackendSpecError`."""
    from gnnsched.quantity import QuantityError, parse_bytes

    m = _FAKE_RE.match(spec.strip())
    if not m:
        raise BackendSpecError(field, f"expected 'nvml' or 'fake:NxSIZE[xMODEL]' (e.g. fake:2x80Gi), got {spec!r}")
    try:
        count = int(m.group("count"))
    except ValueError:
        raise BackendSpecError(field, f"GPU count {m.group('count')!r} is not an integer") from None
    if not 1 <= count <= 64:
        raise BackendSpecError(field, f"GPU count must be between 1 and 64, got {count}")
    try:
        total = parse_bytes(m.group("size"))
    except QuantityError:
        raise BackendSpecError(field, f"GPU memory {m.group('size')!r} is not a quantity (e.g. 80Gi)") from None
    if total <= 0:
        raise BackendSpecError(field, f"GPU memory must be positive, got {m.group('size')!r}")
    model = DEFAULT_FAKE_MODEL
    raw = m.group("model")
    if raw is not None and raw.startswith(RAW_NAME_PREFIX):
        name = raw[len(RAW_NAME_PREFIX):].strip()
        if not name or len(name) > 96:
            raise BackendSpecError(field, f"{RAW_NAME_PREFIX}NAME needs a device name of 1-96 characters, got {raw!r}")
        return count, total, name
    if m.group("model") is not None:
        from gnnsched.gpu.catalogue import get_gpu_model, gpu_models

        try:
            model = get_gpu_model(m.group("model")).name  # canonical catalogue name, so the agent can look it up
        except KeyError:
            known = ", ".join(g.name for g in gpu_models())
            raise BackendSpecError(field, f"unknown GPU model {m.group('model')!r} (known: {known}; or "
                                          f"{RAW_NAME_PREFIX}NAME for a board the catalogue does not know)") from None
    return count, total, model


def open_backend(spec: str = "nvml", node_name: str | None = None, fault_dir: str | Path | None = None,
                 usage_dir: str | Path | None = None) -> GPUBackend:
    """Open the backend named by ``spec`` (the ``--gpus`` flag); ``node_name`` names the node whose fake GPUs these
    are (default: :func:`local_node_name`), so that fake UUIDs differ between nodes.

    ``fault_dir``: fake GPUs only, a directory whose files are fatal faults (``gnnsched.gpu.fake_faults``).
    Raises :class:`BackendSpecError` for a malformed spec (or a fault directory with real GPUs) and
    :class:`NVMLUnavailableError` when ``"nvml"`` is asked for on a machine where NVML does not load.
    """
    s = (spec or "").strip()
    if s == "nvml":
        if fault_dir is not None:
            raise BackendSpecError("--fake-gpu-faults", "only with --gpus fake:NxSIZE (a real GPU faults by itself)")
        if usage_dir is not None:
            raise BackendSpecError("--fake-gpu-usage", "only with --gpus fake:NxSIZE (NVML reports real usage)")
        return NVMLBackend()
    if s.startswith("fake:"):
        count, total, model = parse_fake_spec(s)
        prefix = fake_uuid_prefix(node_name or local_node_name())
        return FakeGPUBackend(count=count, total_bytes=total, name=model, uuid_prefix=prefix,
                              fault_dir=Path(fault_dir) if fault_dir is not None else None,
                              usage_dir=Path(usage_dir) if usage_dir is not None else None)
    raise BackendSpecError("--gpus", f"expected 'nvml' or 'fake:NxSIZE[xMODEL]' (e.g. fake:2x80Gi), got {spec!r}")


# ---------------------------------------------------------------------------------------------------------------
# fake


def local_node_name() -> str:
    """This node's name as the node-side processes know it: ``$NODE_NAME`` (the chart sets it from the downward
    API's ``spec.nodeName`` in every node container), else the hostname."""
    return os.environ.get(ENV_NODE_NAME) or socket.gethostname()


def fake_uuid_prefix(node_name: str) -> str:
    """The first UUID group of ``node_name``'s fake GPUs: 8 hex digits of the name's SHA-256.

    Why: GPU UUIDs are unique cluster-wide on real hardware, and the extender's cache, the operator's records and
    the GNNJob status name a GPU by its UUID alone; fake GPUs with one UUID on every node made two nodes' GPUs look
    like one. A hash (not a counter) needs no coordination, so each process of a node derives the same value."""
    return hashlib.sha256(node_name.encode()).hexdigest()[:8]


def fake_uuid(index: int, prefix: str = "00000000") -> str:
    """Deterministic NVML-shaped UUID for fake GPU ``index`` (``GPU-`` + 8-4-4-4-12 hex)."""
    return f"GPU-{prefix[:8]:0>8}-0000-4000-8000-{index:012x}"


@dataclass
class _FakeGPU:
    info: GPUInfo
    processes: dict[int, GPUProcess] = field(default_factory=dict)
    sticky_unhealthy: bool = False


class FakeGPUBackend:
    """In-memory GPUs for machines without a driver, and for tests that need to steer GPU state.

    Every mutator wakes threads blocked in :meth:`health_events`, so watchers see changes immediately.
    """

    def __init__(self, count: int, total_bytes: int, name: str = DEFAULT_FAKE_MODEL, uuid_prefix: str = "00000000",
                 fault_dir: Path | None = None, usage_dir: Path | None = None):
        """``fault_dir``: a directory whose files named after a GPU's UUID, holding an Xid number, are that GPU's
        fatal faults (``gnnsched.gpu.fake_faults``): :meth:`health_events` reports each new or rewritten file once,
        as :meth:`inject_xid` would. Files present at start are old faults and are not reported again."""
        if count < 1:
            raise ValueError("count must be >= 1")
        self._fault_dir = fault_dir
        # Per-process usage of processes outside this one (gnnsched.gpu.fake_memory.write_usage): a file per pid
        # holding "<gpu uuid> <bytes>" lines, read at every query, as NVML lists the running processes.
        self._usage_dir = usage_dir
        self._fault_seen: dict[str, float] = {}
        self._cond = threading.Condition()
        self._gpus = [
            _FakeGPU(GPUInfo(index=i, uuid=fake_uuid(i, uuid_prefix), name=name, total_bytes=total_bytes, used_bytes=0))
            for i in range(count)
        ]
        self._events: list[HealthEvent] = []
        self._driver: str | None = DEFAULT_FAKE_DRIVER
        self._changes = 0
        self._closed = False
        if fault_dir is not None:
            for g in self._gpus:
                with contextlib.suppress(OSError):
                    self._fault_seen[g.info.uuid] = (fault_dir / g.info.uuid).stat().st_mtime

    # -- GPUBackend ------------------------------------------------------------------------------------------
    def devices(self) -> list[GPUInfo]:
        with self._cond:
            self._check_open()
            if self._usage_dir is None:
                return [g.info for g in self._gpus]
            usage = read_usage_dir(self._usage_dir)
            return [replace(g.info, used_bytes=min(g.info.total_bytes, g.info.used_bytes + sum(
                n for n in usage.get(g.info.uuid, {}).values()))) for g in self._gpus]

    def processes(self, index: int) -> list[GPUProcess]:
        """The processes tests registered (:meth:`add_process`) and, with a usage directory, the live processes that
        report memory on this GPU there (``nvmlDeviceGetMPSComputeRunningProcesses``: pid and used bytes)."""
        with self._cond:
            self._check_open()
            g = self._gpu(index)
            found = dict(g.processes)
            if self._usage_dir is not None:
                for pid, used in read_usage_dir(self._usage_dir).get(g.info.uuid, {}).items():
                    found.setdefault(pid, GPUProcess(pid=pid, used_bytes=used, kind="mps"))
            return sorted(found.values(), key=lambda p: p.pid)

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            seen = self._changes
            self._poll_faults()
            while not self._events and self._changes == seen and not self._closed:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining if self._fault_dir is None else min(remaining, FAULT_POLL_S))
                self._poll_faults()
            events, self._events = self._events, []
            return events

    def _poll_faults(self) -> None:
        """New or rewritten files in the fault directory become Xid events (under ``self._cond``)."""
        if self._fault_dir is None or self._closed:
            return
        for index, g in enumerate(self._gpus):
            path = self._fault_dir / g.info.uuid
            try:
                mtime = path.stat().st_mtime
                text = path.read_text(encoding="utf-8").strip()
            except OSError:
                continue
            if not text or self._fault_seen.get(g.info.uuid) == mtime:
                continue  # absent, being written, or already reported
            self._fault_seen[g.info.uuid] = mtime
            try:
                xid = int(text.split()[0])
            except ValueError:
                continue  # not an Xid: nothing a driver would report
            self.inject_xid(index, xid, "fake GPU fault file")

    def driver_version(self) -> str | None:
        with self._cond:
            return self._driver

    def forget_xid(self, uuid: str, up_to: float) -> bool:
        with self._cond:
            for g in self._gpus:
                if g.info.uuid != uuid or not g.sticky_unhealthy or (g.info.unhealthy_since or 0.0) > up_to:
                    continue
                g.sticky_unhealthy = False
                g.info = replace(g.info, healthy=True, health_reason="", unhealthy_xid=None, unhealthy_since=None)
                self._changed()
                return True
            return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- test controls ---------------------------------------------------------------------------------------
    def set_healthy(self, index: int, healthy: bool, reason: str = "") -> None:
        """Mark GPU ``index`` healthy or not (clears a sticky Xid mark too: the test is the operator here)."""
        with self._cond:
            g = self._gpu(index)
            g.sticky_unhealthy = False
            g.info = replace(g.info, healthy=healthy, health_reason="" if healthy else (reason or "marked unhealthy"),
                             unhealthy_xid=None, unhealthy_since=None if healthy else time.time())
            self._changed()

    def set_driver_version(self, version: str | None) -> None:
        """What a driver upgrade looks like to the agent: NVML reports another version from now on."""
        with self._cond:
            self._driver = version
            self._changed()

    def set_used_bytes(self, index: int, used_bytes: int) -> None:
        with self._cond:
            g = self._gpu(index)
            if not 0 <= used_bytes <= g.info.total_bytes:
                raise ValueError(f"used_bytes must be within 0..{g.info.total_bytes}, got {used_bytes}")
            g.info = replace(g.info, used_bytes=used_bytes)
            self._changed()

    def set_utilization(self, index: int, gpu_percent: int | None, memory_percent: int | None = None) -> None:
        with self._cond:
            g = self._gpu(index)
            g.info = replace(g.info, utilization_gpu_percent=gpu_percent, utilization_memory_percent=memory_percent)
            self._changed()

    def add_process(
        self, index: int, pid: int, used_bytes: int | None, kind: Literal["compute", "mps"] = "mps"
    ) -> None:
        """Register a process on GPU ``index``; its bytes count towards ``used_bytes`` (as the driver's would)."""
        with self._cond:
            g = self._gpu(index)
            old = g.processes.get(pid)
            delta = (used_bytes or 0) - ((old.used_bytes or 0) if old else 0)
            new_used = g.info.used_bytes + delta
            if new_used > g.info.total_bytes:
                raise ValueError(f"GPU {index} would use {new_used} of {g.info.total_bytes} bytes")
            g.processes[pid] = GPUProcess(pid=pid, used_bytes=used_bytes, kind=kind)
            g.info = replace(g.info, used_bytes=new_used)
            self._changed()

    def remove_process(self, index: int, pid: int) -> None:
        with self._cond:
            g = self._gpu(index)
            old = g.processes.pop(pid, None)
            if old is not None:
                g.info = replace(g.info, used_bytes=max(0, g.info.used_bytes - (old.used_bytes or 0)))
                self._changed()

    def inject_xid(self, index: int, xid: int, message: str = "") -> HealthEvent:
        """Simulate an Xid error; a critical one makes the GPU unhealthy until :meth:`set_healthy` is called."""
        with self._cond:
            g = self._gpu(index)
            critical = xid not in APPLICATION_XIDS
            ev = HealthEvent(index=index, uuid=g.info.uuid, xid=xid, critical=critical, message=message)
            if critical and not g.sticky_unhealthy:  # the first critical Xid is what took the GPU out
                g.sticky_unhealthy = True
                g.info = replace(
                    g.info, healthy=False, health_reason=f"Xid {xid}" + (f": {message}" if message else ""),
                    unhealthy_xid=xid, unhealthy_since=time.time(),
                )
            self._events.append(ev)
            self._changed()
            return ev

    # -- internals -------------------------------------------------------------------------------------------
    def _gpu(self, index: int) -> _FakeGPU:
        if not 0 <= index < len(self._gpus):
            raise IndexError(f"no GPU with index {index} (have {len(self._gpus)})")
        return self._gpus[index]

    def _check_open(self) -> None:
        if self._closed:
            raise GPUBackendError("backend is closed")

    def _changed(self) -> None:
        self._changes += 1
        self._cond.notify_all()


def read_usage_dir(usage_dir: Path) -> dict[str, dict[int, int]]:
    """A fake GPU usage directory: GPU uuid -> {pid: used bytes} of the processes still alive (a dead process's
    memory is freed by the driver, so its file no longer counts)."""
    out: dict[str, dict[int, int]] = {}
    try:
        entries = list(usage_dir.iterdir())
    except OSError:
        return out
    for path in entries:
        if not path.name.isdigit():
            continue
        pid = int(path.name)
        if not Path(f"/proc/{pid}").exists():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                out.setdefault(parts[0], {})[pid] = int(parts[1])
    return out


# ---------------------------------------------------------------------------------------------------------------
# NVML


class NVMLBackend:
    """The real driver through ``pynvml`` (``nvidia-ml-py``).

    NVML is process-global and reference counted (``nvmlInit``/``nvmlShutdown``); each backend holds one
    reference. Xid health comes from an NVML event set registered for critical Xid errors on every GPU that
    supports events; a GPU whose registration fails for another reason than "not supported" is marked unhealthy,
    since we could not watch it.
    """

    def __init__(self) -> None:
        try:
            import pynvml  # noqa: PLC0415 - heavy and driver-dependent; imported only when asked for
        except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
            raise NVMLUnavailableError(
                f"NVML unavailable: cannot import pynvml ({exc}); use --gpus fake:NxSIZE"
            ) from None
        self._nvml = pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NVMLUnavailableError(
                f"NVML unavailable: {_nvml_str(exc)} (is the NVIDIA driver installed and libnvidia-ml.so.1 on the "
                "library path?); use --gpus fake:NxSIZE to run without a GPU"
            ) from None
        except OSError as exc:  # pragma: no cover - odd loader failures
            raise NVMLUnavailableError(f"NVML unavailable: {exc}") from None
        self._lock = threading.Lock()
        self._closed = False
        self._sticky: dict[str, str] = {}  # uuid -> reason, for GPUs with a critical Xid
        self._sticky_xid: dict[str, tuple[int, float]] = {}  # uuid -> (the first critical Xid, when it came)
        try:
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self._uuids = [_s(pynvml.nvmlDeviceGetUUID(h)) for h in self._handles]
        except pynvml.NVMLError as exc:
            pynvml.nvmlShutdown()
            raise NVMLUnavailableError(f"NVML unavailable: cannot enumerate GPUs: {_nvml_str(exc)}") from None
        self._event_set = None
        self._init_events()

    def _init_events(self) -> None:
        nv = self._nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError:
            self._event_set = None
            return
        for h, uuid in zip(self._handles, self._uuids, strict=True):
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._event_set)
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) != nv.NVML_ERROR_NOT_SUPPORTED:
                    self._sticky[uuid] = f"cannot watch Xid events: {_nvml_str(exc)}"

    def devices(self) -> list[GPUInfo]:
        nv = self._nvml
        out: list[GPUInfo] = []
        with self._lock:
            self._check_open()
            for i, (h, uuid) in enumerate(zip(self._handles, self._uuids, strict=True)):
                try:
                    name = _s(nv.nvmlDeviceGetName(h))
                    mem = nv.nvmlDeviceGetMemoryInfo(h)
                    total, used = int(mem.total), int(mem.used)
                except nv.NVMLError as exc:  # e.g. GPU fell off the bus
                    out.append(GPUInfo(i, uuid, "unknown", 0, 0, healthy=False, health_reason=_nvml_str(exc)))
                    continue
                util_gpu = util_mem = None
                try:
                    u = nv.nvmlDeviceGetUtilizationRates(h)
                    util_gpu, util_mem = int(u.gpu), int(u.memory)
                except nv.NVMLError:
                    pass  # not supported on this GPU / driver: leave None
                reason = self._sticky.get(uuid, "")
                xid, since = self._sticky_xid.get(uuid, (None, None))
                out.append(
                    GPUInfo(i, uuid, name, total, used, healthy=not reason, health_reason=reason,
                            unhealthy_xid=xid, unhealthy_since=since,
                            utilization_gpu_percent=util_gpu, utilization_memory_percent=util_mem)
                )
        return out

    def processes(self, index: int) -> list[GPUProcess]:
        nv = self._nvml
        with self._lock:
            self._check_open()
            if not 0 <= index < len(self._handles):
                raise IndexError(f"no GPU with index {index} (have {len(self._handles)})")
            h = self._handles[index]
            found: dict[int, GPUProcess] = {}
            for kind, fn in (("compute", nv.nvmlDeviceGetComputeRunningProcesses),
                             ("mps", nv.nvmlDeviceGetMPSComputeRunningProcesses)):
                try:
                    procs = fn(h)
                except nv.NVMLError:
                    continue  # MPS query unsupported (old driver) or no permission
                for p in procs:
                    used = p.usedGpuMemory
                    found[int(p.pid)] = GPUProcess(int(p.pid), None if used is None else int(used), kind)  # type: ignore[arg-type]
            return sorted(found.values(), key=lambda p: p.pid)

    def health_events(self, timeout_s: float) -> list[HealthEvent]:
        nv = self._nvml
        if self._event_set is None:
            time.sleep(max(0.0, timeout_s))
            return []
        events: list[HealthEvent] = []
        wait_ms = max(0, int(timeout_s * 1000))
        while True:
            try:
                data = nv.nvmlEventSetWait(self._event_set, wait_ms)  # blocks outside our lock on purpose
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) == nv.NVML_ERROR_TIMEOUT:
                    return events
                raise GPUBackendError(f"NVML event wait failed: {_nvml_str(exc)}") from None
            xid = int(data.eventData)
            with self._lock:
                uuid = _s(nv.nvmlDeviceGetUUID(data.device))
                index = self._uuids.index(uuid) if uuid in self._uuids else -1
                critical = xid not in APPLICATION_XIDS
                if critical and uuid not in self._sticky_xid:
                    self._sticky[uuid] = f"Xid {xid}"
                    self._sticky_xid[uuid] = (xid, time.time())
            events.append(HealthEvent(index=index, uuid=uuid, xid=xid, critical=critical))
            wait_ms = 0  # drain what is already queued, then return

    def driver_version(self) -> str | None:
        nv = self._nvml
        with self._lock:
            self._check_open()
            try:
                return _s(nv.nvmlSystemGetDriverVersion())
            except nv.NVMLError:
                return None

    def forget_xid(self, uuid: str, up_to: float) -> bool:
        with self._lock:
            mark = self._sticky_xid.get(uuid)
            if mark is None or mark[1] > up_to:
                return False
            del self._sticky_xid[uuid]
            self._sticky.pop(uuid, None)
            return True

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._event_set is not None:
                    self._nvml.nvmlEventSetFree(self._event_set)
            except self._nvml.NVMLError:
                pass
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise GPUBackendError("backend is closed")


def _s(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_str(exc: BaseException) -> str:
    try:
        return str(exc) or type(exc).__name__
    except Exception:  # pynvml's __str__ itself calls into the library, which may be missing
        return type(exc).__name__
