"""The kubelet device plugin for ``gnnsched.io/gpu-share``: gRPC server, health watcher and kubelet registration.

Life cycle (kubelet device plugin API v1beta1):

1. Serve ``DevicePlugin`` on ``<plugin dir>/<endpoint>`` (a unix socket) *first*: during ``Register`` kubelet dials
   that socket and calls ``GetDevicePluginOptions`` before it answers.
2. Call ``Registration.Register`` on ``<plugin dir>/kubelet.sock`` with our endpoint, resource name and options.
3. Kubelet opens ``ListAndWatch``; every message carries the full slot list, sent again on every change (a GPU or
   MPS health flip). Kubelet asks ``GetPreferredAllocation`` (we pack onto one GPU) and ``Allocate``.
4. A supervisor thread watches the directory: when ``kubelet.sock`` is recreated (kubelet restarted) it registers
   again; when our own socket disappears (kubelet wipes the directory on start) it serves a fresh one first.

Why threads and a sync gRPC server: the GPU backend (NVML) is blocking; one watcher thread turns it into change
notifications that each ``ListAndWatch`` stream waits on with a condition variable. No work happens per request
beyond dictionary look-ups, so ``Allocate`` never blocks kubelet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from gnnsched.contract import (
    CONTAINER_SHM_DIR,
    DEFAULT_GATE_SOCKET,
    DEFAULT_MPS_PIPE_DIR,
    DEFAULT_MPS_SHM_DIR,
    ENV_GATE_SOCKET,
    GPU_SHARE_RESOURCE,
    MPS_MAX_CLIENTS_PER_GPU,
)
from gnnsched.gpu.backend import GPUBackend, GPUBackendError, GPUInfo
from gnnsched.return_to_service import when

from .mps_health import MPSHealthSource, assume_mps_healthy
from .slots import HEALTHY, UNHEALTHY, AllocationError, MPSHealth, Slot, build_slots, preferred_allocation
from .v1beta1 import api_pb2 as pb
from .v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger("gnnsched.device_plugin")

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
DEFAULT_ENDPOINT = "gnnsched-gpu-share.sock"
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
#: NVIDIA's ``--device-list-strategy`` values this plugin implements: ``envvar`` (``NVIDIA_VISIBLE_DEVICES``, read by
#: the ``nvidia`` runtime) and ``cdi-cri`` (CDI device names in the Allocate response's ``cdi_devices``, which
#: containerd >= 1.7 / CRI-O inject from the node's CDI spec, no special runtime needed).
DEVICE_LIST_STRATEGIES = ("envvar", "cdi-cri")
#: NVIDIA's ``--device-id-strategy``: how a GPU is named in ``NVIDIA_VISIBLE_DEVICES`` and in CDI device names.
DEVICE_ID_STRATEGIES = ("uuid", "index")
#: CDI kind of NVIDIA's GPUs (``nvidia-ctk cdi generate`` names devices ``nvidia.com/gpu=<index|uuid|all>``).
CDI_GPU_KIND = "nvidia.com/gpu"


def cdi_device_name(gpu: GPUInfo, id_strategy: str) -> str:
    """The fully qualified CDI name of one GPU, as NVIDIA's plugin builds it (vendor/class=id)."""
    return f"{CDI_GPU_KIND}={gpu.uuid if id_strategy == 'uuid' else gpu.index}"


@dataclass(frozen=True)
class PluginConfig:
    """Everything the plugin needs besides the GPU backend and the MPS health source."""

    plugin_dir: Path
    slots_per_gpu: int = MPS_MAX_CLIENTS_PER_GPU
    mps_pipe_dir: str = DEFAULT_MPS_PIPE_DIR
    #: Host tmpfs the MPS daemon uses as /dev/shm; mounted at /dev/shm in every gated container (None: not mounted).
    mps_shm_dir: str | None = DEFAULT_MPS_SHM_DIR
    gate_socket: str = DEFAULT_GATE_SOCKET
    device_list_strategy: str = "envvar"
    device_id_strategy: str = "uuid"
    endpoint: str = DEFAULT_ENDPOINT
    resource_name: str = GPU_SHARE_RESOURCE
    #: Longest time a health change can go unseen (the fake backend wakes the watcher at once).
    poll_interval_s: float = 1.0
    #: How often the supervisor checks the plugin directory for a restarted kubelet.
    watch_interval_s: float = 0.5
    register_timeout_s: float = 5.0
    max_register_backoff_s: float = 10.0

    @property
    def socket_path(self) -> Path:
        return Path(self.plugin_dir) / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return Path(self.plugin_dir) / KUBELET_SOCKET


@dataclass
class _State:
    gpus: tuple[GPUInfo, ...] = ()
    slots: tuple[Slot, ...] = ()
    by_id: dict[str, Slot] = field(default_factory=dict)
    mps: MPSHealth = field(default_factory=lambda: MPSHealth(True))
    generation: int = 0


class DevicePlugin:
    """Owns the gRPC server and the two background threads. ``start()``, then ``stop()``; not restartable."""

    def __init__(self, backend: GPUBackend, config: PluginConfig, mps_health: MPSHealthSource | None = None) -> None:
        if config.slots_per_gpu < 1:
            raise ValueError("slots_per_gpu must be >= 1")
        if config.device_list_strategy not in DEVICE_LIST_STRATEGIES:
            raise ValueError(f"device_list_strategy must be one of {', '.join(DEVICE_LIST_STRATEGIES)}")
        if config.device_id_strategy not in DEVICE_ID_STRATEGIES:
            raise ValueError(f"device_id_strategy must be one of {', '.join(DEVICE_ID_STRATEGIES)}")
        self.backend = backend
        self.config = config
        self.mps_health = mps_health or assume_mps_healthy
        self._cond = threading.Condition()
        self._state = _State()
        self._stop = threading.Event()
        self._server: grpc.Server | None = None
        self._socket_id: tuple[int, int, int] | None = None
        self._threads: list[threading.Thread] = []
        self._registrations = 0
        self._servings = 0

    # -- public ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        Path(self.config.plugin_dir).mkdir(parents=True, exist_ok=True)
        self.refresh()
        self._serve()
        for name, target in (("health-watch", self._watch_health), ("kubelet-watch", self._supervise)):
            t = threading.Thread(target=target, name=f"gnnsched-dp-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, grace_s: float = 1.0) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        # Threads first: the supervisor may be re-serving, and a server it created after we stopped ours would leak.
        for t in self._threads:
            t.join(timeout=self.config.register_timeout_s + self.config.poll_interval_s + 1.0)
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
        try:
            if self._socket_id is not None and _file_id(self.config.socket_path) == self._socket_id:
                self.config.socket_path.unlink()
        except FileNotFoundError:
            pass

    @property
    def registrations(self) -> int:
        """Successful ``Register`` calls so far (one per kubelet instance seen)."""
        with self._cond:
            return self._registrations

    def wait_registered(self, count: int = 1, timeout_s: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: self._registrations >= count, timeout_s)

    def snapshot(self) -> tuple[Slot, ...]:
        with self._cond:
            return self._state.slots

    def refresh(self) -> bool:
        """Re-read GPUs and MPS health; publish a new list if anything changed. Returns whether it did."""
        try:
            mps = self.mps_health()
        except Exception as exc:  # a broken health source must not kill the watcher
            mps = MPSHealth(False, f"MPS health source failed: {exc}")
        self._forget_returned(mps)
        try:
            gpus = tuple(self.backend.devices())
        except GPUBackendError as exc:
            log.error("cannot read GPUs: %s; marking every slot unhealthy", exc)
            with self._cond:
                gpus = tuple(_unhealthy(g, f"backend error: {exc}") for g in self._state.gpus)
        slots = build_slots(gpus, self.config.slots_per_gpu, mps)
        with self._cond:
            old = self._state
            if slots == old.slots and mps.healthy == old.mps.healthy:
                return False
            self._log_transitions(old, gpus, mps)
            self._state = _State(gpus, slots, {s.id: s for s in slots}, mps, old.generation + 1)
            self._cond.notify_all()
        return True

    def _forget_returned(self, mps: MPSHealth) -> None:
        """This plugin's NVML saw the hardware Xid the agent saw and keeps its own mark: once the agent reports that
        an admin returned the GPU to service, drop the mark from before that request (a later Xid's stays)."""
        for uuid, up_to in (mps.returned or {}).items():
            try:
                if self.backend.forget_xid(uuid, up_to):
                    log.info("GPU %s: the node agent returned it to service; its Xid mark from before %s is cleared",
                             uuid, when(up_to))
            except GPUBackendError as exc:
                log.error("GPU %s: clearing its Xid mark after a return to service failed: %s", uuid, exc)

    # -- gRPC ------------------------------------------------------------------------------------------------
    def _serve(self) -> None:
        path = self.config.socket_path
        if self._server is not None:
            # Stop the old server before binding: gRPC unlinks its unix socket *path* on shutdown, which would
            # delete the new socket if it were already bound there.
            self._server.stop(0).wait()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="gnnsched-dp-rpc"))
        pb_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        server.add_insecure_port(f"unix://{path}")
        server.start()
        self._server = server
        self._socket_id = _file_id(path)
        self._servings += 1
        log.info("serving %s on %s", self.config.resource_name, path)

    def _register(self) -> None:
        req = pb.RegisterRequest(
            version=API_VERSION,
            endpoint=self.config.endpoint,
            resource_name=self.config.resource_name,
            options=pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True),
        )
        with grpc.insecure_channel(f"unix://{self.config.kubelet_socket}") as channel:
            pb_grpc.RegistrationStub(channel).Register(req, timeout=self.config.register_timeout_s)

    # -- threads ---------------------------------------------------------------------------------------------
    def _watch_health(self) -> None:
        while not self._stop.is_set():
            try:
                for ev in self.backend.health_events(self.config.poll_interval_s):
                    (log.error if ev.critical else log.warning)(
                        "GPU %s (%s): Xid %d %s", ev.index, ev.uuid, ev.xid, ev.message
                    )
            except GPUBackendError as exc:
                log.error("health events: %s", exc)
                self._stop.wait(self.config.poll_interval_s)
            if not self._stop.is_set():
                self.refresh()

    def _supervise(self) -> None:
        """Keep our socket served and registered with whichever kubelet currently owns ``kubelet.sock``."""
        registered_with: tuple[int, int, int] | None = None
        backoff = 0.0
        last_error = ""
        delay = 0.0  # try to register at once, then every watch interval (or backoff after a failure)
        while not self._stop.wait(delay):
            if _file_id(self.config.socket_path) != self._socket_id:
                log.warning("plugin socket %s vanished or was replaced; serving a new one", self.config.socket_path)
                self._serve()
                registered_with = None
            kubelet = _file_id(self.config.kubelet_socket)
            if kubelet is None or kubelet == registered_with:
                backoff = 0.0
                delay = self.config.watch_interval_s
                continue
            try:
                self._register()
            except grpc.RpcError as exc:
                msg = f"{exc.code().name}: {exc.details()}"
                if msg != last_error:
                    log.warning("registration with kubelet at %s failed: %s", self.config.kubelet_socket, msg)
                    last_error = msg
                backoff = min(self.config.max_register_backoff_s, max(self.config.watch_interval_s, backoff * 2))
                delay = backoff
                continue
            registered_with, backoff, last_error, delay = kubelet, 0.0, "", self.config.watch_interval_s
            with self._cond:
                self._registrations += 1
                self._cond.notify_all()
            log.info("registered %s with kubelet (%s)", self.config.resource_name, self.config.kubelet_socket)

    def _log_transitions(self, old: _State, gpus: tuple[GPUInfo, ...], mps: MPSHealth) -> None:
        if mps.healthy != old.mps.healthy:
            (log.info if mps.healthy else log.error)("MPS %s%s", "healthy" if mps.healthy else "unhealthy",
                                                     f": {mps.message}" if mps.message else "")
        before = {g.uuid: g.healthy for g in old.gpus}
        for g in gpus:
            if before.get(g.uuid, True) != g.healthy:
                (log.info if g.healthy else log.error)("GPU %d (%s) %s %s", g.index, g.uuid,
                                                       "healthy" if g.healthy else "unhealthy:", g.health_reason)

    # -- request handling (called by the servicer) -----------------------------------------------------------
    def _device_list(self) -> tuple[int, pb.ListAndWatchResponse]:
        with self._cond:
            st = self._state
        return st.generation, pb.ListAndWatchResponse(
            devices=[pb.Device(ID=s.id, health=HEALTHY if s.healthy else UNHEALTHY) for s in st.slots]
        )

    def _allocate_one(
        self, ids: list[str], by_id: dict[str, Slot], gpus: tuple[GPUInfo, ...]
    ) -> pb.ContainerAllocateResponse:
        if not ids:
            raise AllocationError("container request lists no device IDs")
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise AllocationError(f"unknown device IDs: {', '.join(unknown)}", unknown)
        cfg = self.config
        # Every GPU the agent manages is made visible: the gate picks the GPU at container start and narrows
        # CUDA_VISIBLE_DEVICES (by UUID, which CUDA accepts whatever the container's numbering) in its reply.
        # Kubelet calls Allocate at pod admission, before that choice, and names slots, not the pod, so nothing here
        # can narrow it; the node agent's NVML check stops a pod on a GPU it was not admitted to (node_agent/overrun).
        envs = {
            ENV_GATE_SOCKET: cfg.gate_socket,
            ENV_MPS_PIPE_DIRECTORY: cfg.mps_pipe_dir,
            ENV_CUDA_VISIBLE_DEVICES: ",".join(g.uuid for g in gpus),
        }
        cdi: list[pb.CDIDevice] = []
        if cfg.device_list_strategy == "envvar":
            ids = [g.uuid if cfg.device_id_strategy == "uuid" else str(g.index) for g in gpus]
            envs[ENV_NVIDIA_VISIBLE_DEVICES] = ",".join(ids)
        else:  # cdi-cri: as NVIDIA's plugin, no NVIDIA_VISIBLE_DEVICES; the runtime injects the named devices
            cdi = [pb.CDIDevice(name=cdi_device_name(g, cfg.device_id_strategy)) for g in gpus]
        gate_dir = str(Path(self.config.gate_socket).parent)
        mounts = {
            # Read-only: a client can still connect to the socket, but cannot replace it or plant files.
            gate_dir: pb.Mount(container_path=gate_dir, host_path=gate_dir, read_only=True),
            # Read-write: MPS clients talk to the daemon through the pipes in this directory.
            self.config.mps_pipe_dir: pb.Mount(
                container_path=self.config.mps_pipe_dir, host_path=self.config.mps_pipe_dir, read_only=False
            ),
        }
        if cfg.mps_shm_dir is not None:
            # MPS clients and the server share POSIX shared memory as well as the pipes; each container has its own
            # /dev/shm, so hand every client the daemon's (NVIDIA: <mps root>/shm at /dev/shm, read-write).
            mounts[CONTAINER_SHM_DIR] = pb.Mount(container_path=CONTAINER_SHM_DIR, host_path=cfg.mps_shm_dir,
                                                 read_only=False)
        # Parents before children, so a nested directory is not hidden by its parent's mount.
        ordered = [mounts[p] for p in sorted(mounts, key=lambda p: (len(Path(p).parts), p))]
        return pb.ContainerAllocateResponse(envs=envs, mounts=ordered, cdi_devices=cdi)


class _Servicer(pb_grpc.DevicePluginServicer):
    """The ``DevicePlugin`` service; every method answers from the plugin's current state without blocking."""

    def __init__(self, plugin: DevicePlugin) -> None:
        self.p = plugin

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method names
        return pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:  # noqa: N802
        p = self.p
        sent = -1
        while context.is_active() and not p._stop.is_set():
            with p._cond:
                if p._state.generation == sent:
                    p._cond.wait(0.5)
                if p._state.generation == sent:
                    continue
            sent, resp = p._device_list()
            yield resp

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.p._cond:
            by_id = self.p._state.by_id
        out = pb.PreferredAllocationResponse()
        for i, creq in enumerate(request.container_requests):
            try:
                ids = preferred_allocation(
                    by_id, list(creq.available_deviceIDs), list(creq.must_include_deviceIDs), creq.allocation_size
                )
            except AllocationError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container_requests[{i}]: {exc}")
            out.container_responses.add(deviceIDs=ids)
        return out

    def Allocate(self, request: Any, context: Any) -> Any:  # noqa: N802
        with self.p._cond:
            by_id, gpus = self.p._state.by_id, self.p._state.gpus
        out = pb.AllocateResponse()
        for i, creq in enumerate(request.container_requests):
            try:
                out.container_responses.append(self.p._allocate_one(list(creq.devices_ids), by_id, gpus))
            except AllocationError as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container_requests[{i}]: {exc}")
        return out

    def PreStartContainer(self, request: Any, context: Any) -> Any:  # noqa: N802
        return pb.PreStartContainerResponse()


def _file_id(path: Path) -> tuple[int, int, int] | None:
    """Identity of a file across delete-and-recreate: inode numbers can be reused, change times do not repeat."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino, st.st_ctime_ns)


def _unhealthy(g: GPUInfo, reason: str) -> GPUInfo:
    from dataclasses import replace

    return replace(g, healthy=False, health_reason=reason)
