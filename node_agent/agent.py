"""The node agent daemon: GPUs + MPS + gate + status + metrics, wired together on one asyncio loop.

Blocking work (the driver, the MPS control client, the API server) runs in worker threads; every change to the books
happens on the loop thread, so the gate needs no locks. The agent never stops the MPS daemon on exit: workloads that
are running keep using it, and the next agent adopts them.

The closed loop's node side lives here too: every sample attributes the driver's per-process memory to the gated pods
(``observe``) and raises their ``observed-peak-bytes``; a gated container that fails is classified from its pod's
container status (``observe.gate_attempt_result``); and MPS's fault domain (``quarantine``) drains a GPU after a fatal
fault (a critical Xid from the driver's event stream, a client that died with error 810 or with a fatal error of its
own) until its clients are gone and MPS answers, then annotates the affected pods as victims or suspect.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from gnnsched.attempts.fault_classes import (
    REASON_CLIENT_FAULT,
    REASON_CLIENT_TERMINATED,
    counted_class,
    is_hardware_xid,
)
from gnnsched.colocation.learned import SlowdownBook
from gnnsched.contract import (
    ANN_ATTEMPT_RESULT,
    ANN_FAULT,
    ANN_STOPPED,
    MPS_MAX_CLIENTS_PER_GPU,
    MPSStatus,
)
from gnnsched.gpu.backend import FakeGPUBackend, GPUBackend, GPUInfo, GPUProcess, HealthEvent
from gnnsched.gpu.catalogue import match_device_name
from gnnsched.node_agent.books import Books, Entry, GPUSlot
from gnnsched.node_agent.constants import (
    DEFAULT_RETRY_S,
    DEFAULT_TIMEOUT_S,
    STATE_FILE_NAME,
    ConstantsKeeper,
    FakeConstants,
    FakeProber,
    Prober,
    SubprocessProber,
    torch_version,
)
from gnnsched.node_agent.gate import GateConfig, GateServer
from gnnsched.node_agent.gate_checks import MAX_CONNECTIONS_PER_POD, load_seal_key
from gnnsched.node_agent.identity import PeerVerifier, PodLookup
from gnnsched.node_agent.metrics import AgentMetrics
from gnnsched.node_agent.mps import MPSManager
from gnnsched.node_agent.mps_external import ExternalMPS
from gnnsched.node_agent.node_conflicts import NodeReader, OtherPluginWatch
from gnnsched.node_agent.observe import (
    Client,
    Observer,
    ProcessTable,
    attribute,
    container_end,
    gate_attempt_result,
    write_peak,
)
from gnnsched.node_agent.overrun import (
    DEFAULT_MARGIN_BYTES,
    DEFAULT_MARGIN_FRACTION,
    Booked,
    Overrun,
    Stopper,
    belongs_to,
    find_overruns,
)
from gnnsched.node_agent.quarantine import (
    REASON_XID,
    ClientEnd,
    Quarantine,
    is_critical_xid,
)
from gnnsched.node_agent.status import StatusSink, build_status
from gnnsched.node_status_file import (
    StatusFileError,
    read_status_file,
    status_file_path,
    write_json_atomic,
    write_status_file,
)
from gnnsched.policies import DEFAULT_BYPASS_LIMIT, STARTUP_SECONDS
from gnnsched.return_to_service import (
    PendingReturn,
    consume_request,
    judge_return,
    pending_requests,
    reject_request,
    when,
)
from gnnsched.trust.domain import DEFAULT_TRUST_DOMAIN, DomainResolver

log = logging.getLogger("gnnsched.node_agent")

SLOWDOWNS_FILE_NAME = "colocation-slowdowns.json"
"""The learned co-location slowdowns (``gnnsched.colocation.learned.SlowdownBook``) in ``--state-dir``, kept across
agent restarts."""
STOPPED_MEMORY_S = 600.0  # how long a stopped pod is remembered after its entries ended (its exit is judged by then)


@dataclass(slots=True)
class AgentOptions:
    node_name: str
    gate_socket: Path
    policy: str = "base"
    reserve_bytes: int = 0
    reserve_fraction: float = 0.0
    max_clients_per_gpu: int = MPS_MAX_CLIENTS_PER_GPU
    pipe_directory: str = "/var/run/gnnsched/mps"
    active_thread_percentage: int | None = None
    status_interval: float = 5.0
    sample_interval: float = 2.0
    mps_probe_interval: float = 10.0
    recovery_grace: float = 5.0
    reconcile_interval: float = 5.0
    event_log: Path | None = None
    metrics_port: int | None = None
    metrics_addr: str = "0.0.0.0"
    live_memory_check: bool = True
    bypass_limit: int = DEFAULT_BYPASS_LIMIT  # 0: strict prefix of the policy's order; N: bounded-bypass backfill
    spread: bool = True  # plan in rounds of one task per GPU, least loaded first (gnnsched.policies.plan_decision)
    share_when_pays: bool = False  # join running clients only when that pays (gnnsched.policies.share_pays)
    startup_seconds: float = STARTUP_SECONDS  # a pod's start-up after admission, as the spread rule assumes it
    trust_domain: str = DEFAULT_TRUST_DOMAIN  # whose pods may share a GPU (gnnsched.trust.domain)
    end_wait: float = 30.0  # seconds to wait for a pod's container status after its gated process exited
    fault_window: float = 30.0  # a client that exited this recently on a GPU shares a fault found after it exited
    peak_write_growth: float = 0.01  # rewrite a pod's observed peak once it grew by this fraction (and at its end)
    workload_env: dict[str, str] = field(default_factory=dict)  # extra env for admitted workloads (fake GPU only)
    #: Node state directory for the device plugin's copy of the status (None: no local copy). Not the pipe dir.
    state_dir: str | None = None
    jobs_uid: int | None = None  # the one UID the gate admits (None: any)
    node_check_interval: float = 30.0  # seconds between reads of the Node (another GPU device plugin?)
    # The node measures its GPUs' device constants (gnnsched.node_agent.constants): at start and on a driver change.
    measure_constants: bool = True
    fake_gpu_constants: FakeConstants | None = None  # fake GPUs' stand-in (--fake-gpu-constants); None: the catalogue's
    constants_probe_command: tuple[str, ...] | None = None  # the probe's command (None: python -m ...constants_probe)
    constants_timeout: float = DEFAULT_TIMEOUT_S  # seconds a probe may take before it is killed and counted
    constants_retry: float = DEFAULT_RETRY_S  # first wait after a failed probe (doubles each time, at most 30 min)
    # seconds between reads of the driver version (a change measures the GPUs again); a driver changes with a module
    # reload, not between two samples, so the sample loop that also watches for Xids skips the NVML call otherwise
    driver_check_interval: float = 30.0
    # A gated pod over its admitted bytes plus this margin (the larger of the two), or on a GPU it was not admitted to,
    # is stopped (node_agent.overrun: why the margin). stop_overruns False: only the metric and the event.
    stop_overruns: bool = True
    overrun_margin: float = DEFAULT_MARGIN_FRACTION
    overrun_margin_bytes: int = DEFAULT_MARGIN_BYTES
    max_gate_connections_per_pod: int = MAX_CONNECTIONS_PER_POD


def gpu_slots(backend: GPUBackend, opts: AgentOptions) -> list[GPUSlot]:
    """The GPUs the gate manages, with their reserve and client cap (the smaller of the flag and the model's)."""
    slots = []
    for d in backend.devices():
        model = match_device_name(d.name, d.total_bytes)
        cap = min(opts.max_clients_per_gpu, model.max_mps_clients if model else MPS_MAX_CLIENTS_PER_GPU)
        reserve = max(opts.reserve_bytes, math.ceil(opts.reserve_fraction * d.total_bytes))
        slots.append(GPUSlot(index=d.index, uuid=d.uuid, model=model.name if model else d.name,
                             total_bytes=d.total_bytes, reserve_bytes=min(reserve, d.total_bytes), max_clients=cap,
                             healthy=d.healthy))
    return slots


@dataclass(slots=True)
class NodeAgent:
    opts: AgentOptions
    backend: GPUBackend
    pods: PodLookup
    sink: StatusSink
    verifier: PeerVerifier
    mps: MPSManager | ExternalMPS | None = None
    nodes: NodeReader | None = None  # reads this node's Node object; None: no check for another device plugin
    metrics: AgentMetrics = field(default_factory=AgentMetrics)
    other_plugin: OtherPluginWatch | None = None
    gate: GateServer | None = None
    metrics_server: WSGIServer | None = None
    _dirty: asyncio.Event | None = None
    _stop_threads: threading.Event = field(default_factory=threading.Event)
    _heartbeat: float = field(default_factory=time.monotonic)
    processes: ProcessTable = field(default_factory=ProcessTable)
    observer: Observer = field(default_factory=Observer)
    quarantine: Quarantine = field(default_factory=Quarantine)
    # Entries that ended lately, per key: (monotonic end, namespace, name, gpu index, how it ended or None yet).
    _recent: dict[str, tuple[float, str, str, int, ClientEnd | None]] = field(default_factory=dict)
    _recent_jobs: dict[str, str] = field(default_factory=dict)  # a recently exited client's GNNJob (fault peers)
    # GPUs whose roles wait for an Xid: the re-check scheduled for when the wait ends (cancelled by close())
    _xid_waits: dict[str, asyncio.TimerHandle] = field(default_factory=dict)
    # GPUs a hardware Xid took out of service before this agent started (its last status file): uuid -> (reason,
    # Xid, since). NVML's own mark is per process, so without these a restart would put a failed GPU back in service.
    _held: dict[str, tuple[str, int, float]] = field(default_factory=dict)
    # The latest hardware Xid this agent saw per GPU (uuid -> (Xid, when)): a return-to-service request made before it
    # is refused (the GPU was struck again after the admin looked at it).
    _hardware_xids: dict[str, tuple[int, float]] = field(default_factory=dict)
    # When an admin last returned each GPU to service (uuid -> the request's time), published in the status so that
    # the device plugin drops its own NVML's mark of the same Xid; kept across restarts through the status file.
    _returned: dict[str, float] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _bg: set[asyncio.Task[Any]] = field(default_factory=set)
    _adopted: bool = False  # the gate has booked what the last agent left running (drains may end only after)
    prober: Prober | None = None  # measures the GPUs' device constants (None: chosen from the backend and options)
    constants: ConstantsKeeper | None = None
    _driver: str | None = None  # the driver version last read (for the constants' re-measure on a change)
    _driver_read_at: float | None = None
    stopper: Stopper = field(default_factory=Stopper)
    # pod uid -> (monotonic time, why) of the pods stopped lately: stopped once, and no attempt-result of theirs is
    # written after (their reason is the stop, not memory-exceeded, which would grow their next reservation)
    _stopped: dict[str, tuple[float, Overrun]] = field(default_factory=dict)
    _saved_slowdowns: SlowdownBook | None = None  # the learned slowdowns last written to state_dir

    def alive(self) -> bool:
        """Liveness for ``/healthz``: the status loop has run recently (the event loop is not stuck)."""
        return time.monotonic() - self._heartbeat < max(30.0, 3 * self.opts.status_interval)

    def ready(self) -> tuple[bool, str]:
        """Readiness for ``/readyz``: the gate serves and MPS is up (a gated pod started now could be admitted)."""
        if self.gate is None:
            return False, "not ready: the gate is not serving yet"
        if self.mps is not None and not self.mps.healthy:
            return False, f"not ready: MPS is down: {self.mps.message}"
        if not self.alive():
            return False, "not ready: the agent's loop has stalled"
        return True, "ready"

    def _mps_status(self) -> MPSStatus:
        if self.mps is None:
            return MPSStatus(healthy=True, restarts=0, message="not managed by this agent (--mps off)")
        last = getattr(self.mps, "last", None)  # what `gnnsched mps-daemon` published (--mps external)
        return MPSStatus(healthy=self.mps.healthy, restarts=self.mps.restarts, message=self.mps.message[:500],
                         compute_mode=(last.compute_mode or None) if last is not None else None,
                         shm_shared=last.shm_shared if last is not None else None)

    async def start(self) -> GateServer:
        books = Books(gpu_slots(self.backend, self.opts), self.opts.policy, self.opts.live_memory_check,
                      bypass_limit=self.opts.bypass_limit, spread=self.opts.spread,
                      share_when_pays=self.opts.share_when_pays, startup_seconds=self.opts.startup_seconds)
        self._dirty = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        restored = await asyncio.to_thread(self._restore_drains, books)
        await asyncio.to_thread(self._restore_slowdowns, books)
        seal_key = await asyncio.to_thread(load_seal_key, self.opts.state_dir)
        cfg = GateConfig(
            node_name=self.opts.node_name, pipe_directory=self.opts.pipe_directory,
            active_thread_percentage=self.opts.active_thread_percentage, recovery_grace=self.opts.recovery_grace,
            reconcile_seconds=self.opts.reconcile_interval, jobs_uid=self.opts.jobs_uid,
            workload_env=dict(self.opts.workload_env), seal_key=seal_key,
            max_connections_per_pod=self.opts.max_gate_connections_per_pod,
            domains=DomainResolver(self.opts.trust_domain, getattr(self.pods, "namespace_labels", None)),
        )
        self.gate = GateServer(books, cfg, pods=self.pods, verifier=self.verifier, metrics=self.metrics,
                               event_log=self.opts.event_log, on_change=self._dirty.set,
                               on_release=self._on_release)
        if self.mps is not None:
            await asyncio.to_thread(self.mps.check)
        if self.nodes is not None:
            self.other_plugin = OtherPluginWatch(self.opts.node_name, self.nodes, self.metrics.registry)
            await asyncio.to_thread(self.other_plugin.check)
        if self.opts.measure_constants:
            self.constants = ConstantsKeeper(
                self.prober or self._default_prober(),
                Path(self.opts.state_dir) / STATE_FILE_NAME if self.opts.state_dir else None, torch_version(),
                on_result=lambda result: self.metrics.constants_measurements.labels(result).inc(),
                on_change=self._mark_dirty, retry_s=self.opts.constants_retry)
        await self._sample()
        await self.gate.start(self.opts.gate_socket)
        for uuid in restored:  # the clients still booked there (adopted or reconnecting) are the ones it waits for
            gpu = books.gpu_by_uuid(uuid)
            clients = [(e.key, e.namespace, e.name) for e in books.running.values() if gpu and e.gpu_index == gpu.index]
            jobs = {e.key: e.job for e in books.running.values() if gpu and e.gpu_index == gpu.index and e.job}
            self.quarantine.trigger(uuid, self.quarantine.drains[uuid].reason, time.time(), clients, jobs=jobs)
        self._adopted = True
        if self.opts.metrics_port is not None:
            self.metrics_server = self.metrics.serve(self.opts.metrics_port, self.opts.metrics_addr, self.alive,
                                                     self.ready)
        await self._publish()
        return self.gate

    def _default_prober(self) -> Prober:
        """Fake GPUs get the stand-in measurement; real ones (or an injected probe command) the probe process."""
        if isinstance(self.backend, FakeGPUBackend) and self.opts.constants_probe_command is None:
            return FakeProber(self.opts.fake_gpu_constants, self.opts.active_thread_percentage, torch_version())
        prober = SubprocessProber(self.opts.pipe_directory, self.opts.active_thread_percentage, self.opts.jobs_uid,
                                  timeout_s=self.opts.constants_timeout)
        if self.opts.constants_probe_command:
            prober.command = self.opts.constants_probe_command
        return prober

    def _mark_dirty(self) -> None:
        if self._dirty is not None:
            self._dirty.set()

    async def _check_constants(self, devices: list[GPUInfo]) -> None:
        """Start measuring the GPU models that need it (never waits for a probe); see ``constants``. The driver
        version is read again at most every ``driver_check_interval`` seconds."""
        if self.constants is None:
            return
        now = time.monotonic()
        if self._driver_read_at is None or now - self._driver_read_at >= self.opts.driver_check_interval:
            try:
                self._driver = await asyncio.to_thread(self.backend.driver_version)
            except Exception as exc:
                log.debug("driver_version: %s", exc)
                self._driver = None
            self._driver_read_at = now
        await self.constants.check(devices, self._driver)

    async def _publish(self) -> None:
        assert self.gate is not None
        devices = await asyncio.to_thread(self._devices)
        measured = dict(self.constants.measured) if self.constants is not None else {}
        status = build_status(self.opts.node_name, self.gate.books, devices, self._mps_status(), time.time(),
                              self.quarantine.drains, self._returned, measured)
        for g in status.gpus:
            self.metrics.constants_measured.labels(str(g.index), g.uuid).set(1 if g.measured is not None else 0)
        if self.other_plugin is not None and self.other_plugin.condition is not None:
            status.conditions = [self.other_plugin.condition]
        try:
            await asyncio.to_thread(self.sink.publish, status)
        except Exception as exc:  # a down API server must not stop the gate
            log.warning("publishing GPUNode status failed: %s", exc)
        # The same status for the node's device plugin (slot health follows MPS/GPU health), in the node state
        # directory: only the agent and the MPS daemon write there (the pipe directory is writable by every client).
        if self.opts.state_dir is None:
            return
        local = status_file_path(self.opts.state_dir)
        try:
            await asyncio.to_thread(local.parent.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(write_status_file, local, status)
        except OSError as exc:
            log.warning("writing %s failed: %s", local, exc)
        book = self.gate.books.slowdowns
        if book is not self._saved_slowdowns:  # the book is a plain value: a new one means new samples
            path = Path(self.opts.state_dir) / SLOWDOWNS_FILE_NAME
            try:
                await asyncio.to_thread(write_json_atomic, path, book.model_dump(mode="json"))
                self._saved_slowdowns = book
            except OSError as exc:
                log.warning("writing %s failed: %s", path, exc)

    def _restore_slowdowns(self, books: Books) -> None:
        """The co-location slowdowns the previous agent learned (``SLOWDOWNS_FILE_NAME`` in ``state_dir``): a
        restart (an upgrade, a crash) keeps what progress taught, instead of trusting the prior again until every
        class pair has had its samples anew. A file that does not parse is left aside with a warning."""
        if self.opts.state_dir is None:
            return
        path = Path(self.opts.state_dir) / SLOWDOWNS_FILE_NAME
        try:
            books.slowdowns = SlowdownBook.model_validate_json(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            log.warning("the learned co-location slowdowns in %s are not usable (%s): starting from the model", path,
                        exc)
            return
        self._saved_slowdowns = books.slowdowns
        log.info("restored %d learned co-location class pair(s) from %s", len(books.slowdowns.table.classes()), path)

    async def _sample(self) -> None:
        """Driver + MPS health into the books (an unhealthy GPU or MPS admits nothing new) and into the metrics; and
        first, an admin's return-to-service requests (so a GPU returned now is healthy in this very sample)."""
        await self._serve_returns()
        devices = await asyncio.to_thread(self._devices)
        await self._check_constants(devices)
        procs = {}
        for d in devices:
            try:
                procs[d.index] = await asyncio.to_thread(self.backend.processes, d.index)
            except Exception as exc:
                log.debug("processes(%d): %s", d.index, exc)
        if self.gate is not None:
            await self._end_drains(devices, procs)  # may probe MPS: before its health is read below
        mps_ok = self.mps.healthy if self.mps is not None else True
        if self.mps is not None:
            self.metrics.mps(self.mps.healthy, self.mps.restarts)
        if self.gate is None:
            return
        books = self.gate.books
        usage = await asyncio.to_thread(self._attribute, procs)
        await self._record_peaks(usage)
        await self._stop_overruns(procs)
        became_healthy = False
        changed = False
        freed = False
        for d in devices:
            if d.index in books.gpus:
                freed |= d.used_bytes < books.gpus[d.index].used_bytes
                books.set_used(d.index, d.used_bytes)
                ok = d.healthy and mps_ok and not self.quarantine.draining(d.uuid)
                if books.gpus[d.index].healthy != ok:
                    changed = True
                    became_healthy |= ok
                    books.set_health(d.index, ok)
        self.metrics.sample(devices, books, usage, set(self.quarantine.drains))
        if changed and self._dirty is not None:
            self._dirty.set()
        if became_healthy or (freed and books.live_memory_check):
            self.gate.decide()

    # --- observation ----------------------------------------------------------------------------------------------

    def _attribute(self, procs: dict[int, list[GPUProcess]]) -> dict[str, int]:
        assert self.gate is not None
        clients = [Client(e.key, e.pod_uid, e.gpu_index, self.gate.pids.get(e.key))
                   for e in list(self.gate.books.running.values())]
        return attribute(procs, clients, self.processes)

    async def _record_peaks(self, usage: dict[str, int]) -> None:
        """Raise each running pod's observed-peak annotation once its peak grew (never lowering a recorded value)."""
        assert self.gate is not None
        self.observer.update(usage)
        growth = 1.0 + self.opts.peak_write_growth
        for key, peak in list(self.observer.peaks.items()):
            written = self.observer.written.get(key, 0)
            e = self.gate.books.running.get(key)
            if e is None or (written and peak <= written * growth) or peak <= written:
                continue
            await self._write_peak(e, peak)

    async def _stop_overruns(self, procs: dict[int, list[GPUProcess]]) -> None:
        """Stop each gated pod whose processes hold more than it was admitted with (plus the margin) or hold memory
        on a GPU it was not admitted to; the offender alone, with the reason on its pod (``node_agent.overrun``)."""
        assert self.gate is not None
        running = list(self.gate.books.running.values())
        live = {e.pod_uid.lower() for e in running}
        now = time.monotonic()
        self._stopped = {uid: v for uid, v in self._stopped.items() if uid in live or now - v[0] < STOPPED_MEMORY_S}
        booked = [Booked(e.key, e.pod_uid, e.namespace, e.name, e.gpu_index, e.bytes, self.gate.pids.get(e.key))
                  for e in running]
        found = await asyncio.to_thread(find_overruns, procs, booked, self.processes, self.opts.overrun_margin,
                                        self.opts.overrun_margin_bytes)
        for o in found:
            if o.pod_uid not in self._stopped:
                self._stopped[o.pod_uid] = (now, o)
                self.metrics.stopped.labels(o.reason).inc()
                self.gate.event("stopped", pod=o.pod_uid, keys=list(o.keys), reason=o.reason, used=o.used_bytes,
                                allowed=o.allowed_bytes, gpus=list(o.gpus), enforced=self.opts.stop_overruns)
                log.warning("pod %s/%s: %s%s", o.namespace, o.name, o.message(),
                            "" if self.opts.stop_overruns else " (not stopped: --no-stop-overruns)")
                if self.opts.stop_overruns:
                    self.gate.annotate_pod(o.namespace, o.name, {ANN_STOPPED: o.annotation()})
            if not self.opts.stop_overruns:
                continue
            gated = {self.gate.pids[k] for k in o.keys if k in self.gate.pids}
            await asyncio.to_thread(self.stopper.stop, o.pids, belongs_to(o.pod_uid, gated, self.processes))

    async def _write_peak(self, e: Entry, peak: int) -> None:
        if not e.namespace or not e.name:
            return
        try:
            recorded = await asyncio.to_thread(write_peak, self.pods, e.namespace, e.name, e.pod_uid, peak)
        except Exception as exc:  # the API server being down must not stop sampling
            log.warning("recording the observed peak of %s/%s failed: %s", e.namespace, e.name, exc)
            return
        self.observer.mark_written(e.key, recorded)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    def _on_release(self, e: Entry, why: str) -> int | None:
        """The gate freed ``e`` (its process exited, or its pod is gone): close its observation, and follow its pod
        until the container status says how it ended (custom-container outcome, fault domain)."""
        written = self.observer.written.get(e.key, 0)
        peak = self.observer.forget(e.key)
        assert self.gate is not None
        gpu = self.gate.books.gpus.get(e.gpu_index) if e.gpu_index is not None else None
        if gpu is None:
            return peak
        now = time.monotonic()
        self._recent = {k: v for k, v in self._recent.items() if now - v[0] <= self.opts.fault_window}
        self._recent[e.key] = (now, e.namespace, e.name, gpu.index, None)
        self._recent_jobs = {k: j for k, j in self._recent_jobs.items() if k in self._recent}
        if e.job:
            self._recent_jobs[e.key] = e.job
        self.quarantine.client_gone(gpu.uuid, e.key)
        if e.namespace and e.name:
            if peak is not None and peak > written:
                self._spawn(self._write_peak(e, peak))
            self._spawn(self._after_exit(e, gpu.uuid, gpu.index, peak))
        return peak

    async def _after_exit(self, e: Entry, uuid: str, index: int, peak: int | None) -> None:
        assert self.gate is not None
        end = None
        delay = 0.25
        deadline = time.monotonic() + self.opts.end_wait
        while True:
            try:
                pod = await asyncio.to_thread(self.pods.get, e.namespace, e.name)
            except Exception as exc:
                log.debug("reading pod %s/%s after its exit: %s", e.namespace, e.name, exc)
                pod = None
                if time.monotonic() < deadline:
                    await asyncio.sleep(delay)
                    continue
            if pod is None or pod.uid != e.pod_uid:
                break
            end = container_end(pod.ended, e.key)
            if end is not None or time.monotonic() >= deadline:
                break
            await asyncio.sleep(delay)
            delay = min(4.0, delay * 2)
        client_end = ClientEnd(end.exit_code, end.message) if end is not None else ClientEnd(None, None)
        if e.key in self._recent:
            self._recent[e.key] = (*self._recent[e.key][:4], client_end)
        if end is not None and e.pod_uid.lower() not in self._stopped:  # a stopped pod's reason is its stop
            result = gate_attempt_result(end, peak, e.bytes)
            if result is not None:
                self.gate.annotate(e, {ANN_ATTEMPT_RESULT: result.line()})
                self.metrics.gate_outcomes.labels(result.outcome).inc()
                self.gate.event("attempt-result", key=e.key, outcome=result.outcome, peak=peak, limit=e.bytes)
            if not self.quarantine.draining(uuid):
                if client_end.victim_of_810:
                    self._trigger(uuid, index, REASON_CLIENT_TERMINATED)
                elif client_end.own_fault:
                    self._trigger(uuid, index, REASON_CLIENT_FAULT)
        self.quarantine.client_ended(uuid, e.key, client_end)
        self._record_roles(uuid)

    # --- the MPS fault domain -------------------------------------------------------------------------------------

    def _devices(self) -> list[GPUInfo]:
        """The backend's GPUs, with those a hardware Xid took out of service before this agent started still out
        (``_held``), whatever the driver's fresh view says."""
        devices = self.backend.devices()
        if not self._held:
            return devices
        out = []
        for d in devices:
            held = self._held.get(d.uuid)
            if held is not None and d.healthy:
                reason, xid, since = held
                d = replace(d, healthy=False, health_reason=reason, unhealthy_xid=xid, unhealthy_since=since)
            out.append(d)
        return out

    def _restore_held(self, books: Books, gpus: list[Any]) -> None:
        """Keep out of service the GPUs the last agent showed unhealthy by a hardware Xid (an admin's request to
        return one is served by the first sample, :meth:`_serve_returns`), and remember the last return of each GPU
        (the device plugin may still hold its own mark of that Xid)."""
        for g in gpus:
            gpu = books.gpu_by_uuid(g.uuid)
            if gpu is None:
                continue
            if g.returned_to_service_at is not None:
                self._returned[g.uuid] = g.returned_to_service_at.timestamp()
            if g.healthy or g.unhealthy_xid is None or not is_hardware_xid(g.unhealthy_xid):
                continue
            since = g.unhealthy_since.timestamp() if g.unhealthy_since else time.time()
            self._held[g.uuid] = (g.unhealthy_reason or f"Xid {g.unhealthy_xid}", g.unhealthy_xid, since)
            books.set_health(gpu.index, False)
            log.warning("GPU %d (%s) is still out of service after Xid %d (since %s); to return it once repaired, run "
                        "`gnnsched node-agent return-to-service %d` in this container (docs/faults.md)", gpu.index,
                        g.uuid, g.unhealthy_xid, g.unhealthy_since, gpu.index)

    async def _serve_returns(self) -> None:
        """An admin's return-to-service requests (``<state dir>/return-to-service/<uuid>``), each returned or refused
        by :func:`gnnsched.return_to_service.judge_return`, at the sampling cadence: a restart is not needed (it
        would re-adopt every running pod). A returned GPU's hold is dropped here (the agent's, from its status file,
        and the driver view's Xid mark); the sample that follows finds it healthy, and the next publish tells the
        GPUNode, the device plugin (slots Healthy) and the metrics."""
        if self.opts.state_dir is None:
            return
        requests = await asyncio.to_thread(pending_requests, self.opts.state_dir)
        if not requests:
            return
        devices = {d.uuid: d for d in await asyncio.to_thread(self.backend.devices)}
        for req in requests:
            held = self._held.get(req.uuid)
            verdict = judge_return(req, devices.get(req.uuid), (held[1], held[2]) if held else None,
                                   self._hardware_xids.get(req.uuid))
            if verdict.accepted:
                forgot = await asyncio.to_thread(self.backend.forget_xid, req.uuid, req.requested_at)
                if not forgot and held is None:  # the driver's mark came after the request: an Xid just now
                    d = devices[req.uuid]
                    verdict = replace(verdict, code="new-xid", message=f"GPU {d.index} ({d.uuid}): a new Xid reached "
                                      "the driver while the request was served: repair the GPU, then ask again")
            if not verdict.accepted:
                await self._refuse_return(req, verdict.message, verdict.code or "")
                continue
            self._held.pop(req.uuid, None)
            self._returned[req.uuid] = req.requested_at
            await asyncio.to_thread(consume_request, req)
            index = devices[req.uuid].index
            self.metrics.returned.labels(str(index), req.uuid).inc()
            if self.gate is not None:
                self.gate.event("returned-to-service", gpu=index, uuid=req.uuid, xid=verdict.xid,
                                requested_by=req.requested_by, requested_at=when(req.requested_at))
            log.warning("GPU %d (%s): returned to service at the request of %s made at %s%s: it clears Xid %s (out "
                        "since %s)", index, req.uuid, req.requested_by, when(req.requested_at),
                        f" ({req.note})" if req.note else "", verdict.xid, when(verdict.since))
            if self._dirty is not None:
                self._dirty.set()

    async def _refuse_return(self, req: PendingReturn, message: str, code: str) -> None:
        try:
            path = await asyncio.to_thread(reject_request, req, message)
        except OSError as exc:  # the request stays; the next sample tries again
            log.warning("return-to-service request %s: refused (%s), but writing the refusal failed: %s", req.path,
                        message, exc)
            return
        self.metrics.return_refused.labels(code).inc()
        log.warning("return-to-service request for %s by %s made at %s: refused: %s (the reason is in %s)", req.uuid,
                    req.requested_by, when(req.requested_at), message, path)

    def _restore_drains(self, books: Books) -> list[str]:
        """GPUs the previous agent left draining (its last node status file in ``state_dir``): they stay draining;
        and GPUs it showed out of service by a hardware Xid stay out (:meth:`_restore_held`)."""
        if self.opts.state_dir is None:
            return []
        try:
            previous = read_status_file(status_file_path(self.opts.state_dir))
        except StatusFileError:
            return []
        self._restore_held(books, previous.gpus)
        out = []
        for g in previous.gpus:
            gpu = books.gpu_by_uuid(g.uuid)
            if g.draining and gpu is not None:
                since = g.draining_since.timestamp() if g.draining_since else time.time()
                self.quarantine.restore(g.uuid, g.draining_reason or REASON_XID, since, g.draining_xid, [])
                books.set_health(gpu.index, False)
                log.warning("GPU %d (%s) is still draining after a fatal MPS fault (%s): nothing is admitted there",
                            gpu.index, g.uuid, g.draining_reason)
                out.append(g.uuid)
        return out

    def on_health_event(self, ev: HealthEvent) -> None:
        """A driver event (from the health thread, on the loop): a critical Xid puts its GPU into quarantine."""
        if is_hardware_xid(ev.xid):
            self._hardware_xids[ev.uuid] = (ev.xid, ev.at)
        if self.gate is None or not is_critical_xid(ev.xid):
            return
        gpu = self.gate.books.gpu_by_uuid(ev.uuid)
        if gpu is not None:
            self._trigger(gpu.uuid, gpu.index, REASON_XID, ev.xid)

    def _trigger(self, uuid: str, index: int, reason: str, xid: int | None = None) -> None:
        assert self.gate is not None
        books = self.gate.books
        now = time.monotonic()
        clients = [(e.key, e.namespace, e.name) for e in books.running.values() if e.gpu_index == index]
        recent = [(k, v[1], v[2]) for k, v in self._recent.items()
                  if v[3] == index and now - v[0] <= self.opts.fault_window]
        jobs = {e.key: e.job for e in books.running.values() if e.gpu_index == index and e.job}
        jobs.update((k, self._recent_jobs[k]) for k, _, _ in recent if k in self._recent_jobs)
        drain = self.quarantine.trigger(uuid, reason, time.time(), clients + recent, xid, jobs)
        for key, v in self._recent.items():
            if key in dict.fromkeys(k for k, _, _ in recent):
                self.quarantine.client_gone(uuid, key)
                if v[4] is not None:
                    self.quarantine.client_ended(uuid, key, v[4])
        if drain is None:
            self._record_roles(uuid)  # the same fault: its Xid may be what the roles were waiting for
            return
        books.set_health(index, False)
        self.metrics.faults.labels(str(index), reason).inc()
        self.gate.event("fault", gpu=index, uuid=uuid, reason=reason, xid=xid, clients=[k for k, _, _ in clients],
                        exited=[k for k, _, _ in recent])
        log.warning("GPU %d (%s): fatal MPS fault (%s): draining, nothing is admitted there until its %d client(s) "
                    "have exited and MPS answers", index, uuid, drain.label(), len(drain.affected))
        if self._dirty is not None:
            self._dirty.set()
        self._record_roles(uuid)

    def _record_roles(self, uuid: str) -> None:
        """Write the fault records once every affected client has ended and the Xid is known, or once
        ``quarantine.XID_GRACE_S`` has passed without one: then this runs again by itself."""
        assert self.gate is not None
        now = time.time()
        records = self.quarantine.decide_roles(uuid, datetime.now(tz=timezone.utc), now)
        left = self.quarantine.xid_wait_left(uuid, now)
        if not records and left and not self.quarantine.pending(uuid) and self._loop is not None \
                and uuid not in self._xid_waits:

            def again() -> None:
                self._xid_waits.pop(uuid, None)
                self._record_roles(uuid)

            self._xid_waits[uuid] = self._loop.call_later(left, again)
        for affected, record in records:
            self.gate.annotate_pod(affected.namespace, affected.name, {ANN_FAULT: record.model_dump_json()})
            self.metrics.fault_pods.labels(record.role).inc()
            self.gate.event("fault-role", key=affected.key, gpu=uuid, role=record.role, reason=record.reason)
            log.warning("pod %s/%s: %s of the MPS fault on %s (%s)", affected.namespace, affected.name, record.role,
                        uuid, record.reason)

    async def _end_drains(self, devices: list[Any], procs: dict[int, list[GPUProcess]]) -> None:
        """Release a draining GPU once no client is left on it (neither booked nor seen by the driver) and the MPS
        control daemon answers its probe."""
        assert self.gate is not None
        if not self._adopted:
            return
        books = self.gate.books
        for uuid, drain in list(self.quarantine.drains.items()):
            gpu = books.gpu_by_uuid(uuid)
            if gpu is None:
                continue
            left = books.clients(gpu.index) + sum(1 for p in procs.get(gpu.index, []) if p.kind == "mps")
            if left:
                continue
            answers = await asyncio.to_thread(self.mps.check) if self.mps is not None else True
            if not self.quarantine.may_release(uuid, left, answers, time.time()):
                continue
            self._record_roles(uuid)  # the wait for an Xid is over: roles not written yet are written now
            self.quarantine.release(uuid)
            for key in drain.affected:
                # judged with this fault: a client that exited moments ago belongs to it, never to a later fault on
                # the GPU (its next attempt, admitted after the drain, would otherwise share a fault it never saw)
                self._recent.pop(key, None)
            waited = max(0.0, time.time() - drain.since)
            self.metrics.drain_seconds.observe(waited)
            self.metrics.faults_by_class.labels(counted_class(drain.xid)).inc()  # the Xid is final now
            self.gate.event("drained", gpu=gpu.index, uuid=uuid, reason=drain.reason, seconds=round(waited, 3))
            log.warning("GPU %d (%s): every client of the fault has exited and MPS answers: admitting again after "
                        "%.1f s", gpu.index, uuid, waited)
            if self._dirty is not None:
                self._dirty.set()

    def _health_events(self) -> None:
        """The driver's event stream (a thread: NVML's wait blocks), handed to the loop."""
        while not self._stop_threads.is_set():
            try:
                events = self.backend.health_events(1.0)
            except Exception as exc:
                log.warning("reading GPU health events failed: %s", exc)
                self._stop_threads.wait(1.0)
                continue
            for ev in events:
                if self._loop is not None:
                    self._loop.call_soon_threadsafe(self.on_health_event, ev)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        await self.start()
        assert self._dirty is not None
        loop_tasks = [
            asyncio.create_task(self._status_loop()),
            asyncio.create_task(self._sample_loop()),
        ]
        health_thread = threading.Thread(target=self._health_events, daemon=True, name="gpu-health-events")
        health_thread.start()
        if self.other_plugin is not None:
            loop_tasks.append(asyncio.create_task(self._node_loop()))
        mps_thread = None
        if self.mps is not None:
            mps_thread = threading.Thread(
                target=self.mps.run_forever, args=(self.opts.mps_probe_interval, self._stop_threads), daemon=True,
                name="mps-supervisor",
            )
            mps_thread.start()
        try:
            await stop.wait()
        finally:
            self._stop_threads.set()
            for t in loop_tasks:
                t.cancel()
            for t in loop_tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self.close()

    async def close(self) -> None:
        for task in list(self._bg):
            task.cancel()
        if self.constants is not None:
            await self.constants.close()
        for timer in self._xid_waits.values():  # a closed agent writes no more records
            timer.cancel()
        self._xid_waits.clear()
        if self.gate is not None:
            await self.gate.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()
            self.metrics_server.server_close()
            self.metrics_server = None
        with contextlib.suppress(Exception):
            self.backend.close()

    async def _status_loop(self) -> None:
        """Publish every ``status_interval`` and within ~0.2 s of a change (coalescing bursts)."""
        assert self._dirty is not None
        while True:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.opts.status_interval)
                await asyncio.sleep(0.2)
            self._dirty.clear()
            self._heartbeat = time.monotonic()
            await self._publish()

    async def _node_loop(self) -> None:
        """Re-read the Node: a second device plugin can appear (or go) at any time."""
        assert self.other_plugin is not None and self._dirty is not None
        while True:
            await asyncio.sleep(self.opts.node_check_interval)
            before = self.other_plugin.condition
            now = await asyncio.to_thread(self.other_plugin.check)
            if before is None or before.status != now.status:
                self._dirty.set()

    async def _sample_loop(self) -> None:
        while True:
            await asyncio.sleep(self.opts.sample_interval)
            try:
                await self._sample()
            except Exception as exc:
                log.warning("sampling GPUs failed: %s", exc)
