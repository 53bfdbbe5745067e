"""The node measures its own GPUs: device constants per GPU model, published in ``GPUStatus.measured``.

Why: the operator plans a job's memory with a context and cuBLAS/cuBLASLt workspaces per GPU model, and the
catalogue's values are per architecture and mostly never measured (the H100's context was 30 % low); a board the
catalogue does not know has none at all, so its jobs run alone. The node has the GPU, the driver and the torch its
jobs run, so it measures them (``gnnsched.gpu.constants_probe``) and the operator takes its figures
(``gnnsched.gpu.measured.device_model``).

When: at agent start and whenever NVML reports another driver version, once per distinct GPU model (NVML name) on the
node, applied to every GPU of that model. A measurement is kept in the state directory keyed by model, driver and
torch version, so a restart with the same driver reuses it; another driver or torch drops it. Until a measurement
exists, or after one failed, the GPU is published with ``measured: null``: admission never waits for it. A failed or
timed-out probe is logged with its reason, counted (``gnnsched_gpu_constants_measurements_total{result}``) and
retried with exponential backoff.

How: on a real GPU the probe is a subprocess, ``python -m gnnsched.gpu.constants_probe --json``, set up as a gated
job is (``CUDA_VISIBLE_DEVICES`` = the GPU's UUID, the MPS pipe directory and active-thread share the gate hands out,
the jobs' UID: an MPS server serves one user at a time), under a timeout and a 4 GiB MPS memory limit. Fake GPUs go
through the same path with a stand-in (:class:`FakeProber`): the agent's ``--fake-gpu-constants``, else the
catalogue's constants for a catalogued model (the default entry's for the unnamed ``Fake-GPU`` test board); an
uncatalogued fake GPU without the flag stays unmeasured.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal, Protocol

from pydantic import ValidationError

from gnnsched.contract import GPUMeasurement
from gnnsched.gpu.backend import DEFAULT_FAKE_MODEL, GPUInfo
from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, get_gpu_model, match_device_name
from gnnsched.gpu.constants_probe import ProbeOutputError, parse_output

log = logging.getLogger("gnnsched.node_agent.constants")

STATE_FILE_NAME = "gpu-constants.json"
"""The measurements kept in the agent's state directory (``{"entries": {KEY: GPUMeasurement}}``)."""
PROBE_MODULE = "gnnsched.gpu.constants_probe"
PROBE_MEM_LIMIT = "0=4096M"
"""The probe's MPS memory limit: it needs about 1 GiB; the limit bounds what it could take from running jobs."""
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_RETRY_S = 30.0
MAX_RETRY_S = 1800.0
_OUTPUT_TAIL = 400  # characters of a failed probe's stderr kept in the log line

Result = Literal["ok", "reused", "failed", "timeout"]


class ProbeFailed(Exception):
    """A measurement that did not come: ``result`` is ``failed`` or ``timeout``, the message says why."""

    def __init__(self, result: Literal["failed", "timeout"], reason: str) -> None:
        super().__init__(reason)
        self.result: Literal["failed", "timeout"] = result
        self.reason = reason


class Prober(Protocol):
    """Measures one GPU model on one of its GPUs."""

    async def measure(self, gpu: GPUInfo, driver: str | None) -> GPUMeasurement | None:
        """The measurement; None when this GPU cannot be measured at all (nothing to retry); raises
        :class:`ProbeFailed` when an attempt failed."""
        ...


# --- fake GPUs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FakeConstants:
    """The stand-in measurement of ``--fake-gpu-constants``."""

    context_bytes: int
    cublas_workspace_bytes: int
    cublaslt_workspace_bytes: int
    delay_s: float = 0.0
    compute_capability: str | None = None


_FAKE_KEYS = {"context", "cublas", "cublaslt", "delay", "cc"}
FAKE_CONSTANTS_FORMAT = "context=742Mi,cublas=32Mi,cublaslt=1Mi[,delay=SECONDS][,cc=9.0]"


def parse_fake_constants(text: str) -> FakeConstants:
    """Parse ``context=742Mi,cublas=32Mi,cublaslt=1Mi[,delay=SECONDS][,cc=9.0]`` (quantities as Kubernetes writes
    them). Raises ``ValueError`` saying which part is wrong (the CLI prefixes the flag)."""
    from gnnsched.quantity import QuantityError, parse_bytes

    values: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip().lower()
        if not eq or key not in _FAKE_KEYS:
            raise ValueError(f"{part!r} is not one of {', '.join(sorted(_FAKE_KEYS))} as KEY=VALUE "
                             f"(expected {FAKE_CONSTANTS_FORMAT})")
        if key in values:
            raise ValueError(f"{key} is given twice")
        values[key] = value.strip()
    missing = [k for k in ("context", "cublas", "cublaslt") if k not in values]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (expected {FAKE_CONSTANTS_FORMAT})")
    sizes: dict[str, int] = {}
    for key in ("context", "cublas", "cublaslt"):
        try:
            sizes[key] = parse_bytes(values[key])
        except QuantityError as exc:
            raise ValueError(f"{key}: {exc}") from None
        if sizes[key] < 0:
            raise ValueError(f"{key}: must be >= 0, got {values[key]!r}")
    delay = 0.0
    if "delay" in values:
        try:
            delay = float(values["delay"])
        except ValueError:
            raise ValueError(f"delay: {values['delay']!r} is not a number of seconds") from None
        if not 0.0 <= delay <= 3600.0:
            raise ValueError(f"delay: must be within 0-3600 seconds, got {values['delay']!r}")
    cc = values.get("cc")
    if cc is not None:
        major, dot, minor = cc.partition(".")
        if not (dot and major.isdigit() and minor.isdigit()):
            raise ValueError(f"cc: {cc!r} is not a compute capability like 9.0")
    return FakeConstants(sizes["context"], sizes["cublas"], sizes["cublaslt"], delay, cc)


@dataclass(slots=True)
class FakeProber:
    """A fake GPU's stand-in measurement (``source: fake``): ``constants`` when given, else the catalogue entry's
    constants for a catalogued model; an uncatalogued model without ``constants`` has nothing to stand in."""

    constants: FakeConstants | None = None
    active_thread_percentage: int | None = None
    torch_version: str | None = None
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(tz=timezone.utc))

    async def measure(self, gpu: GPUInfo, driver: str | None) -> GPUMeasurement | None:
        c = self.constants
        if c is None:
            model = match_device_name(gpu.name)
            if model is None and gpu.name == DEFAULT_FAKE_MODEL:
                # The test board of ``fake:NxSIZE`` has no datasheet: it stands in with the default entry's
                # constants (what every fake cluster was planned with before nodes measured), so local clusters
                # share as they did; a board named ``nvml:NAME`` stays unmeasured until the flag gives it values.
                model = get_gpu_model(DEFAULT_GPU_MODEL)
            if model is None:
                return None
            cc = model.compute_capability
            c = FakeConstants(model.context_bytes, model.cublas_workspace_bytes, model.cublaslt_workspace_bytes,
                              compute_capability=f"{cc[0]}.{cc[1]}")
            detail = f"fake GPU: the catalogue's constants of {model.name}"
        else:
            detail = "fake GPU: values from --fake-gpu-constants"
        if c.delay_s > 0:
            await asyncio.sleep(c.delay_s)
        return GPUMeasurement(
            source="fake", measured_at=self.clock(), context_bytes=c.context_bytes,
            cublas_workspace_bytes=c.cublas_workspace_bytes, cublaslt_workspace_bytes=c.cublaslt_workspace_bytes,
            allocator_matches_model=True, allocator_detail=detail,
            active_thread_percentage=self.active_thread_percentage or 100, driver_version=driver,
            torch_version=self.torch_version, compute_capability=c.compute_capability,
        )


# --- real GPUs ---------------------------------------------------------------------------------------------------


def default_probe_command() -> tuple[str, ...]:
    """The probe in this agent's Python (the image the jobs run: the same torch)."""
    return (sys.executable, "-m", PROBE_MODULE, "--json")


@dataclass(slots=True)
class SubprocessProber:
    """Runs the probe as an MPS client the way the gate starts a job, under a timeout, off the event loop."""

    pipe_directory: str
    active_thread_percentage: int | None = None
    jobs_uid: int | None = None
    command: Sequence[str] = field(default_factory=default_probe_command)
    timeout_s: float = DEFAULT_TIMEOUT_S
    base_env: Mapping[str, str] | None = None

    def env(self, gpu: GPUInfo) -> dict[str, str]:
        """The probe's environment: what a gated job of this node gets (the gate client's ``Admitted`` env). The
        share is the configured one, or 100 % with ``auto``: a job alone on its GPU gets all of it, the largest
        context (it scales with the share), so a plan with it is never short."""
        env = dict(os.environ if self.base_env is None else self.base_env)
        for key in [k for k in env if k.startswith("GNNSCHED_")]:
            del env[key]  # nothing of the agent's own configuration leaks into the probe
        env.update({
            "CUDA_VISIBLE_DEVICES": gpu.uuid,
            "CUDA_MPS_PIPE_DIRECTORY": self.pipe_directory,
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(self.active_thread_percentage or 100),
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": PROBE_MEM_LIMIT,
        })
        return env

    def _user(self) -> int | None:
        """Run as the jobs' UID when the agent may switch to it: MPS serves one user at a time, and a client of
        another user waits behind the jobs' server (or holds it up while it runs). Switching needs CAP_SETUID, which
        the chart's agent does not have (it drops every capability): there the probe runs as the agent's own user and
        briefly owns the node's MPS server, and a re-measure while jobs run waits for them (or times out and is
        retried). docs/real-cluster.md says what to grant to avoid that."""
        if self.jobs_uid is None or self.jobs_uid == os.geteuid() or not may_set_uid():
            return None
        return self.jobs_uid

    async def measure(self, gpu: GPUInfo, driver: str | None) -> GPUMeasurement | None:
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=self.env(gpu), start_new_session=True, user=self._user())
        except OSError as exc:
            raise ProbeFailed("failed", f"cannot start {' '.join(self.command)}: {exc}") from None
        try:
            out, err = await asyncio.wait_for(proc.communicate(), self.timeout_s)
        except asyncio.TimeoutError:
            _kill_group(proc)
            await proc.wait()
            raise ProbeFailed("timeout", f"no answer within {self.timeout_s:g} s (killed)") from None
        except asyncio.CancelledError:
            _kill_group(proc)
            with contextlib.suppress(Exception):
                await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-_OUTPUT_TAIL:] or "no output on stderr"
            raise ProbeFailed("failed", f"exit status {proc.returncode}: {tail}")
        try:
            return parse_output(out.decode(errors="replace"))
        except ProbeOutputError as exc:
            raise ProbeFailed("failed", str(exc)) from None


CAP_SETUID = 7
"""The capability's bit in ``CapEff`` (linux/capability.h)."""


def may_set_uid(status: str | None = None) -> bool:
    """Whether this process holds CAP_SETUID in its effective set (``/proc/self/status``'s ``CapEff``; ``status``:
    that file's text, for tests). Root is not enough: a container's root usually has its capabilities dropped."""
    if status is None:
        try:
            status = Path("/proc/self/status").read_text(encoding="ascii")
        except OSError:
            return False
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            try:
                return bool(int(line.split(":", 1)[1].strip(), 16) >> CAP_SETUID & 1)
            except ValueError:
                return False
    return False


def _kill_group(proc: asyncio.subprocess.Process) -> None:
    """The probe and whatever it started (it runs in a session of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def torch_version() -> str | None:
    """The installed torch's version without importing it (the agent never imports torch), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch")
    except PackageNotFoundError:
        return None


# --- the keeper --------------------------------------------------------------------------------------------------


def state_key(model: str, driver: str | None, torch: str | None) -> str:
    """What a kept measurement is valid for: the model (NVML's name), the driver and the torch of the probe."""
    return f"{model}|{driver or '?'}|{torch or '?'}"


def read_state(path: Path) -> dict[str, GPUMeasurement]:
    """The kept measurements by :func:`state_key`; an unreadable or invalid file counts as none (logged)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return {}
    out: dict[str, GPUMeasurement] = {}
    entries = raw.get("entries", {}) if isinstance(raw, dict) else {}
    for key, value in entries.items() if isinstance(entries, dict) else ():
        try:
            out[str(key)] = GPUMeasurement.model_validate(value)
        except ValidationError as exc:
            log.warning("ignoring the kept measurement %s in %s: %s", key, path, exc.errors()[0].get("msg"))
    return out


def write_state(path: Path, entries: Mapping[str, GPUMeasurement]) -> None:
    """Atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"entries": {k: m.wire() for k, m in sorted(entries.items())}}, indent=1),
                   encoding="utf-8")
    tmp.replace(path)


@dataclass(slots=True)
class ConstantsKeeper:
    """The node's measurements per GPU model, on the agent's loop: what to (re)measure, when to retry, what is
    published. :meth:`check` is called at start and at every sample; it never waits for a probe."""

    prober: Prober
    state_path: Path | None = None
    torch: str | None = None
    on_result: Callable[[Result], None] = lambda result: None
    on_change: Callable[[], None] = lambda: None
    retry_s: float = DEFAULT_RETRY_S
    max_retry_s: float = MAX_RETRY_S
    clock: Callable[[], float] = time.monotonic
    measured: dict[str, GPUMeasurement] = field(default_factory=dict)  # NVML name -> the current measurement
    _driver: str | None = None
    _checked: bool = False
    _kept: dict[str, GPUMeasurement] | None = None  # the state file, read once
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)
    _next_try: dict[str, float] = field(default_factory=dict)
    _unmeasurable: set[str] = field(default_factory=set)

    def busy(self) -> bool:
        """A probe is running."""
        return bool(self._tasks)

    async def check(self, devices: Sequence[GPUInfo], driver: str | None) -> None:
        """Start what needs measuring: each model without a measurement for this driver, unless a probe of it
        runs or its retry is not due. A changed driver drops every measurement (and stops running probes)."""
        if self._kept is None:
            self._kept = await asyncio.to_thread(read_state, self.state_path) if self.state_path else {}
        if self._checked and driver != self._driver:
            log.warning("the GPU driver changed from %s to %s: measuring the GPUs' device constants again",
                        self._driver, driver)
            for task in self._tasks.values():
                task.cancel()
            self._tasks.clear()
            self._failures.clear()
            self._next_try.clear()
            self._unmeasurable.clear()
            if self.measured:
                self.measured.clear()
                self.on_change()
        self._driver, self._checked = driver, True
        reused = False
        models: dict[str, GPUInfo] = {}
        for d in sorted(devices, key=lambda d: (not d.healthy, d.index)):  # a healthy GPU of the model first
            if d.name and d.name != "unknown":
                models.setdefault(d.name, d)
        for name, gpu in models.items():
            if name in self.measured or name in self._tasks or name in self._unmeasurable:
                continue
            kept = self._kept.get(state_key(name, driver, self.torch))
            if kept is not None:
                self.measured[name] = kept
                reused = True
                self.on_result("reused")
                log.info("GPU model %s: device constants kept from %s (driver %s, torch %s): context %d MiB",
                         name, kept.measured_at.isoformat(), driver, self.torch, kept.context_bytes >> 20)
                continue
            if self.clock() < self._next_try.get(name, 0.0) or not gpu.healthy:
                continue
            self._tasks[name] = asyncio.create_task(self._measure(name, gpu, driver),
                                                    name=f"gpu-constants-{name}")
        if reused:
            self.on_change()
            await self._persist()

    async def _measure(self, name: str, gpu: GPUInfo, driver: str | None) -> None:
        started = self.clock()
        try:
            try:
                m = await self.prober.measure(gpu, driver)
            except ProbeFailed as exc:
                n = self._failures[name] = self._failures.get(name, 0) + 1
                wait = min(self.max_retry_s, self.retry_s * 2 ** (n - 1))
                self._next_try[name] = self.clock() + wait
                self.on_result(exc.result)
                log.warning("GPU model %s (GPU %d, %s): measuring the device constants failed (%s): %s; it stays "
                            "unmeasured, next try in %.0f s", name, gpu.index, gpu.uuid, exc.result, exc.reason, wait)
                return
            if m is None:
                self._unmeasurable.add(name)
                log.info("GPU model %s: nothing to measure its device constants with (an uncatalogued fake GPU "
                         "without --fake-gpu-constants): it stays unmeasured", name)
                return
            if driver is not None and m.driver_version is None:
                m = m.model_copy(update={"driver_version": driver})
            self._failures.pop(name, None)
            self._next_try.pop(name, None)
            self.measured[name] = m
            self.on_result("ok")
            log.info("GPU model %s (GPU %d): device constants measured in %.1f s (%s): context %d MiB at %s %% active "
                     "threads, cuBLAS workspace %d KiB, cuBLASLt %d KiB, allocator %s", name, gpu.index,
                     self.clock() - started, m.source, m.context_bytes >> 20, m.active_thread_percentage or 100,
                     m.cublas_workspace_bytes >> 10, m.cublaslt_workspace_bytes >> 10,
                     "as modelled" if m.allocator_matches_model else f"NOT as modelled: {m.allocator_detail}")
            self.on_change()
            await self._persist()
        finally:
            if self._tasks.get(name) is asyncio.current_task():
                del self._tasks[name]

    async def _persist(self) -> None:
        """Keep this driver's measurements (those of another driver or torch are dropped with the rewrite)."""
        entries = {state_key(name, self._driver, self.torch): m for name, m in self.measured.items()}
        self._kept = dict(entries)
        if self.state_path is None:
            return
        try:
            await asyncio.to_thread(write_state, self.state_path, entries)
        except OSError as exc:
            log.warning("keeping the GPU measurements in %s failed: %s", self.state_path, exc)

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
