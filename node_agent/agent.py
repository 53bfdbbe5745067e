"""The node agent daemon: GPUs + MPS + gate + status + metrics, wired together on one asyncio loop.

Blocking work (the driver, the MPS control client, the API server) runs in worker threads; every change to the books
happens on the loop thread, so the gate needs no locks. The agent never stops the MPS daemon on exit: workloads that
are running keep using it, and the next agent adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from gnnsched.contract import MPS_MAX_CLIENTS_PER_GPU, MPSStatus
from gnnsched.gpu_backend import GPUBackend
from gnnsched.gpus import match_device_name
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.gate import GateConfig, GateServer
from gnnsched.node_agent.identity import PeerVerifier, PodLookup
from gnnsched.node_agent.metrics import AgentMetrics
from gnnsched.node_agent.mps import MPSManager
from gnnsched.node_agent.mps_external import ExternalMPS
from gnnsched.node_agent.node_conflicts import NodeReader, OtherPluginWatch
from gnnsched.node_agent.status import StatusSink, build_status
from gnnsched.policies import DEFAULT_BYPASS_LIMIT
from gnnsched.node_status_file import status_file_path, write_status_file

log = logging.getLogger("gnnsched.node_agent")


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
    #: Node state directory for the device plugin's copy of the status (None: no local copy). Not the pipe dir.
    state_dir: str | None = None
    jobs_uid: int | None = None  # the one UID the gate admits (None: any)
    node_check_interval: float = 30.0  # seconds between reads of the Node (another GPU device plugin?)


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
    metrics_server: object | None = None
    _dirty: asyncio.Event | None = None
    _stop_threads: threading.Event = field(default_factory=threading.Event)
    _heartbeat: float = field(default_factory=time.monotonic)

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
                      bypass_limit=self.opts.bypass_limit)
        self._dirty = asyncio.Event()
        cfg = GateConfig(
            node_name=self.opts.node_name, pipe_directory=self.opts.pipe_directory,
            active_thread_percentage=self.opts.active_thread_percentage, recovery_grace=self.opts.recovery_grace,
            reconcile_seconds=self.opts.reconcile_interval, jobs_uid=self.opts.jobs_uid,
        )
        self.gate = GateServer(books, cfg, pods=self.pods, verifier=self.verifier, metrics=self.metrics,
                               event_log=self.opts.event_log, on_change=self._dirty.set)
        if self.mps is not None:
            await asyncio.to_thread(self.mps.check)
        if self.nodes is not None:
            self.other_plugin = OtherPluginWatch(self.opts.node_name, self.nodes, self.metrics.registry)
            await asyncio.to_thread(self.other_plugin.check)
        await self._sample()
        await self.gate.start(self.opts.gate_socket)
        if self.opts.metrics_port is not None:
            self.metrics_server = self.metrics.serve(self.opts.metrics_port, self.opts.metrics_addr, self.alive,
                                                     self.ready)
        await self._publish()
        return self.gate

    async def _publish(self) -> None:
        assert self.gate is not None
        devices = await asyncio.to_thread(self.backend.devices)
        status = build_status(self.opts.node_name, self.gate.books, devices, self._mps_status(), time.time())
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

    async def _sample(self) -> None:
        """Driver + MPS health into the books (an unhealthy GPU or MPS admits nothing new) and into the metrics."""
        devices = await asyncio.to_thread(self.backend.devices)
        procs = {}
        for d in devices:
            try:
                procs[d.index] = await asyncio.to_thread(self.backend.processes, d.index)
            except Exception as exc:
                log.debug("processes(%d): %s", d.index, exc)
        mps_ok = self.mps.healthy if self.mps is not None else True
        if self.mps is not None:
            self.metrics.mps(self.mps.healthy, self.mps.restarts)
        if self.gate is None:
            return
        books = self.gate.books
        became_healthy = False
        changed = False
        freed = False
        for d in devices:
            if d.index in books.gpus:
                freed |= d.used_bytes < books.gpus[d.index].used_bytes
                books.set_used(d.index, d.used_bytes)
                ok = d.healthy and mps_ok
                if books.gpus[d.index].healthy != ok:
                    changed = True
                    became_healthy |= ok
                    books.set_health(d.index, ok)
        self.metrics.sample(devices, procs, books, self.gate.pids)
        if changed and self._dirty is not None:
            self._dirty.set()
        if became_healthy or (freed and books.live_memory_check):
            self.gate.decide()

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set."""
        await self.start()
        assert self._dirty is not None
        loop_tasks = [
            asyncio.create_task(self._status_loop()),
            asyncio.create_task(self._sample_loop()),
        ]
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
        if self.gate is not None:
            await self.gate.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()  # type: ignore[attr-defined]
            self.metrics_server.server_close()  # type: ignore[attr-defined]
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
