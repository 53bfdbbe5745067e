"""Device plugin against a test kubelet over real gRPC on unix sockets (see dp_test_kubelet.py).

Covers the "must be true" list of issue 5 item 7: registration after serving, ListAndWatch, preferred allocations,
Allocate (and INVALID_ARGUMENT for unknown IDs), health flips from the GPU backend and from the node agent's MPS
status file, and re-registration after kubelet's socket is recreated.
"""

from __future__ import annotations

import threading
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import grpc
import pytest
from dp_test_kubelet import TestKubelet

from gnnsched.contract import ENV_GATE_SOCKET, GPU_SHARE_RESOURCE, GPUNodeStatus, GPUStatus, MPSStatus
from gnnsched.device_plugin.mps_health import StatusFileMPSHealth
from gnnsched.device_plugin.server import DevicePlugin, PluginConfig
from gnnsched.device_plugin.slots import MPSHealth, parse_slot_id
from gnnsched.device_plugin.v1beta1 import api_pb2 as pb
from gnnsched.device_plugin.v1beta1 import api_pb2_grpc as pb_grpc
from gnnsched.gpu.backend import FakeGPUBackend
from gnnsched.node_status_file import status_file_path, write_status_file

GI = 1024**3
SLOTS = 4


class SettableMPS:
    """An injectable MPS health source whose answer the test sets."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.value = MPSHealth(True)

    def set(self, value: MPSHealth) -> None:
        with self._lock:
            self.value = value

    def __call__(self) -> MPSHealth:
        with self._lock:
            return self.value


def _config(d: Path, **kw) -> PluginConfig:
    base: dict[str, Any] = dict(
        plugin_dir=d, slots_per_gpu=SLOTS, mps_pipe_dir="/var/run/gnnsched/mps",
        gate_socket="/var/run/gnnsched/gate.sock", poll_interval_s=0.1, watch_interval_s=0.05,
    )
    base.update(kw)
    return PluginConfig(**base)


@pytest.fixture
def rig(tmp_path):
    backend = FakeGPUBackend(2, 80 * GI)
    mps = SettableMPS()
    kubelet = TestKubelet(tmp_path)
    kubelet.start()
    plugin = DevicePlugin(backend, _config(tmp_path), mps)
    plugin.start()
    assert kubelet.wait_for(lambda: kubelet.lists), "plugin never registered / streamed"
    yield backend, mps, kubelet, plugin
    plugin.stop(0)
    kubelet.stop()


def _by_gpu(devices: dict[str, str]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for did, health in devices.items():
        uuid, _ = parse_slot_id(did)
        out.setdefault(uuid, {})[did] = health
    return out


def test_registers_after_serving_and_lists_slots(rig):
    backend, _, kubelet, plugin = rig
    req = kubelet.registrations[0]
    assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", "gnnsched-gpu-share.sock", GPU_SHARE_RESOURCE)
    assert req.options.get_preferred_allocation_available and not req.options.pre_start_required
    # the test kubelet dialled the plugin and got its options before answering Register
    assert kubelet.options[0].get_preferred_allocation_available
    devices = kubelet.latest()
    assert len(devices) == 2 * SLOTS and set(devices.values()) == {"Healthy"}
    groups = _by_gpu(devices)
    assert set(groups) == {g.uuid for g in backend.devices()}
    assert all(len(v) == SLOTS for v in groups.values())
    assert all(len(d) <= 63 for d in devices)
    # kubelet may stream before the plugin's Register call has returned: wait for the plugin's side too
    assert plugin.wait_registered(1, timeout_s=20) and plugin.registrations == 1


def test_preferred_allocation_packs_one_gpu(rig):
    backend, _, kubelet, _ = rig
    stub = kubelet.plugin
    devices = sorted(kubelet.latest())
    uuids = [g.uuid for g in backend.devices()]
    on = {u: [d for d in devices if parse_slot_id(d)[0] == u] for u in uuids}

    def ask(available, must, size):
        req = pb.PreferredAllocationRequest(container_requests=[pb.ContainerPreferredAllocationRequest(
            available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size)])
        return list(stub.GetPreferredAllocation(req, timeout=10).container_responses[0].deviceIDs)

    got = ask(devices, [], 3)
    assert len(got) == 3 and len({parse_slot_id(d)[0] for d in got}) == 1
    # must_include on GPU 1 keeps the request on GPU 1
    got = ask(devices, [on[uuids[1]][2]], 3)
    assert on[uuids[1]][2] in got and {parse_slot_id(d)[0] for d in got} == {uuids[1]}
    # best fit: GPU 1 has 2 free slots, GPU 0 has 4; a 2-slot request fills GPU 1 instead of opening GPU 0
    avail = on[uuids[0]] + on[uuids[1]][:2]
    assert sorted(ask(avail, [], 2)) == sorted(on[uuids[1]][:2])
    # too big for one GPU: the fullest-free GPU first, then the rest
    got = ask(avail, [], 5)
    assert set(on[uuids[0]]) <= set(got) and len(got) == 5
    with pytest.raises(grpc.RpcError) as ei:
        ask(devices + ["GPU-nope-slot-00"], [], 1)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "GPU-nope-slot-00" in ei.value.details()
    with pytest.raises(grpc.RpcError) as ei:
        ask(devices[:2], [], 3)
    assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_allocate_mounts_and_env(rig):
    backend, _, kubelet, _ = rig
    stub = kubelet.plugin
    devices = sorted(kubelet.latest())
    resp = stub.Allocate(pb.AllocateRequest(container_requests=[
        pb.ContainerAllocateRequest(devices_ids=devices[:1]),
        pb.ContainerAllocateRequest(devices_ids=devices[-2:]),
    ]), timeout=10)
    assert len(resp.container_responses) == 2
    uuids = ",".join(g.uuid for g in backend.devices())
    for c in resp.container_responses:
        assert dict(c.envs) == {
            ENV_GATE_SOCKET: "/var/run/gnnsched/gate.sock",
            "CUDA_MPS_PIPE_DIRECTORY": "/var/run/gnnsched/mps",
            "NVIDIA_VISIBLE_DEVICES": uuids,
            "CUDA_VISIBLE_DEVICES": uuids,
        }
        mounts = [(m.container_path, m.host_path, m.read_only) for m in c.mounts]
        # the gate dir (parent) is mounted before the MPS pipe dir nested in it; the MPS daemon's shm at /dev/shm
        assert mounts == [("/dev/shm", "/var/run/gnnsched/mps-shm", False),
                          ("/var/run/gnnsched", "/var/run/gnnsched", True),
                          ("/var/run/gnnsched/mps", "/var/run/gnnsched/mps", False)]
        assert list(c.cdi_devices) == []  # envvar strategy: the nvidia runtime reads NVIDIA_VISIBLE_DEVICES
    for bad in (["GPU-unknown-slot-01"], [devices[0], "nope"], []):
        with pytest.raises(grpc.RpcError) as ei:
            stub.Allocate(
                pb.AllocateRequest(container_requests=[pb.ContainerAllocateRequest(devices_ids=bad)]), timeout=10
            )
        assert ei.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert stub.PreStartContainer(pb.PreStartContainerRequest(devices_ids=devices[:1]), timeout=10) == \
        pb.PreStartContainerResponse()


@pytest.mark.parametrize("id_strategy", ["uuid", "index"])
def test_allocate_cdi_cri_names_the_gpus(tmp_path, id_strategy):
    """``--device-list-strategy cdi-cri``: the response carries CDI names (nvidia.com/gpu=<uuid|index>, as NVIDIA's
    CDI spec names GPUs) for the GPUs the container may be admitted on, and no NVIDIA_VISIBLE_DEVICES, over gRPC."""
    backend = FakeGPUBackend(2, 80 * GI)
    kubelet = TestKubelet(tmp_path)
    kubelet.start()
    cfg = _config(tmp_path, device_list_strategy="cdi-cri", device_id_strategy=id_strategy,
                  mps_shm_dir=str(tmp_path / "shm"))
    plugin = DevicePlugin(backend, cfg, SettableMPS())
    plugin.start()
    try:
        assert kubelet.wait_for(lambda: kubelet.lists)
        devices = sorted(kubelet.latest())
        resp = kubelet.plugin.Allocate(pb.AllocateRequest(container_requests=[
            pb.ContainerAllocateRequest(devices_ids=devices[:1])]), timeout=10)
        (c,) = resp.container_responses
        gpus = backend.devices()
        want = [f"nvidia.com/gpu={g.uuid if id_strategy == 'uuid' else g.index}" for g in gpus]
        assert [d.name for d in c.cdi_devices] == want
        assert "NVIDIA_VISIBLE_DEVICES" not in c.envs
        assert c.envs["CUDA_VISIBLE_DEVICES"] == ",".join(g.uuid for g in gpus)
        shm = [(m.host_path, m.read_only) for m in c.mounts if m.container_path == "/dev/shm"]
        assert shm == [(str(tmp_path / "shm"), False)]
    finally:
        plugin.stop(0)
        kubelet.stop()


def test_unknown_strategies_are_refused():
    for kw in ({"device_list_strategy": "volume-mounts"}, {"device_id_strategy": "serial"}):
        with pytest.raises(ValueError, match=next(iter(kw))):
            DevicePlugin(FakeGPUBackend(1, GI), _config(Path("/nonexistent"), **kw))


def test_health_flips_stream_full_lists(rig):
    backend, mps, kubelet, _ = rig
    u0, u1 = (g.uuid for g in backend.devices())

    def state(uuid_health):
        groups = _by_gpu(kubelet.latest())
        return all(set(groups.get(u, {}).values()) == {h} for u, h in uuid_health.items())

    backend.set_healthy(1, False, "test")
    assert kubelet.wait_for(lambda: state({u0: "Healthy", u1: "Unhealthy"}))
    assert len(kubelet.latest()) == 2 * SLOTS  # every message is the full list
    backend.set_healthy(1, True)
    assert kubelet.wait_for(lambda: state({u0: "Healthy", u1: "Healthy"}))
    backend.inject_xid(0, 79, "fell off the bus")
    assert kubelet.wait_for(lambda: state({u0: "Unhealthy", u1: "Healthy"}))
    backend.set_healthy(0, True)
    mps.set(MPSHealth(False, "daemon down"))
    assert kubelet.wait_for(lambda: state({u0: "Unhealthy", u1: "Unhealthy"}))
    mps.set(MPSHealth(True, per_gpu={u0: True, u1: False}))
    assert kubelet.wait_for(lambda: state({u0: "Healthy", u1: "Unhealthy"}))
    n = len(kubelet.lists)
    backend.set_used_bytes(0, GI)  # memory use is not health: no new message
    mps.set(MPSHealth(True, per_gpu={u0: True, u1: False}))
    assert not kubelet.wait_for(lambda: len(kubelet.lists) > n, timeout=0.4)


def test_reregisters_when_kubelet_restarts(rig):
    _, _, kubelet, plugin = rig
    before = kubelet.latest()
    kubelet.restart()  # wipes our socket too, as kubelet does
    assert kubelet.wait_for(lambda: len(kubelet.registrations) == 2, timeout=20)
    assert plugin.wait_registered(2, timeout_s=20)
    assert kubelet.wait_for(lambda: len(kubelet.lists) >= 2 and kubelet.latest() == before)
    # the new connection serves calls on the recreated plugin socket
    assert kubelet.plugin.GetDevicePluginOptions(pb.Empty(), timeout=10).get_preferred_allocation_available
    kubelet.restart()
    assert kubelet.wait_for(lambda: len(kubelet.registrations) == 3, timeout=20)


def test_plugin_waits_for_late_kubelet(tmp_path):
    backend = FakeGPUBackend(1, 16 * GI)
    plugin = DevicePlugin(backend, _config(tmp_path), None)
    plugin.start()
    try:
        assert not plugin.wait_registered(1, timeout_s=0.2)
        kubelet = TestKubelet(tmp_path)
        kubelet.start()
        assert kubelet.wait_for(lambda: kubelet.lists, timeout=20)
        assert len(kubelet.latest()) == SLOTS
        kubelet.stop()
    finally:
        plugin.stop(0)
    assert not (tmp_path / "gnnsched-gpu-share.sock").exists()


def test_mps_health_from_agent_status_file(tmp_path):
    """The node agent's status file (in the node state dir) drives slot health: missing, unhealthy, per GPU, stale."""
    backend = FakeGPUBackend(2, 80 * GI)
    u0, u1 = (g.uuid for g in backend.devices())
    pipe = tmp_path / "mps"
    path = status_file_path(tmp_path / "state")
    kubelet = TestKubelet(tmp_path)
    kubelet.start()
    plugin = DevicePlugin(backend, _config(tmp_path, mps_pipe_dir=str(pipe)), StatusFileMPSHealth(path, max_age_s=30))
    plugin.start()

    def write(mps_ok=True, gpu_ok=(True, True), age_s=0.0, agent_gpu_ok=(True, True)):
        at = datetime.now(timezone.utc) - timedelta(seconds=age_s)
        gpus = [GPUStatus(index=i, uuid=u, model="A100-80GB", total_bytes=80 * GI, mps_healthy=ok, healthy=hw)
                for i, (u, ok, hw) in enumerate(zip((u0, u1), gpu_ok, agent_gpu_ok, strict=True))]
        write_status_file(path, GPUNodeStatus(node_name="n1", updated_at=at, mps=MPSStatus(healthy=mps_ok), gpus=gpus))

    def health():
        g = _by_gpu(kubelet.latest())
        return tuple(sorted(set(g.get(u, {}).values())) for u in (u0, u1))

    try:
        assert kubelet.wait_for(lambda: health() == (["Unhealthy"], ["Unhealthy"]))  # no agent status yet
        write()
        assert kubelet.wait_for(lambda: health() == (["Healthy"], ["Healthy"]))
        write(gpu_ok=(True, False))
        assert kubelet.wait_for(lambda: health() == (["Healthy"], ["Unhealthy"]))
        write(agent_gpu_ok=(False, True))  # a hardware Xid the agent saw (this plugin's own backend did not)
        assert kubelet.wait_for(lambda: health() == (["Unhealthy"], ["Healthy"]))
        write(mps_ok=False)
        assert kubelet.wait_for(lambda: health() == (["Unhealthy"], ["Unhealthy"]))
        write()
        assert kubelet.wait_for(lambda: health() == (["Healthy"], ["Healthy"]))
        write(age_s=120)  # the agent stopped publishing
        assert kubelet.wait_for(lambda: health() == (["Unhealthy"], ["Unhealthy"]))
        path.write_text("{not json")
        assert StatusFileMPSHealth(path)().healthy is False
    finally:
        plugin.stop(0)
        kubelet.stop()


def test_register_rejected_is_retried(tmp_path):
    """A kubelet that refuses registration (here: wrong resource accepted only later) is retried with backoff."""

    class Picky(TestKubelet):
        refuse = True

        def Register(self, request, context):  # noqa: N802
            if self.refuse:
                context.abort(grpc.StatusCode.UNAVAILABLE, "not ready")
            return super().Register(request, context)

    kubelet = Picky(tmp_path)
    kubelet.start()
    plugin = DevicePlugin(FakeGPUBackend(1, GI), _config(tmp_path), None)
    plugin.start()
    try:
        assert not plugin.wait_registered(1, timeout_s=0.3)
        kubelet.refuse = False
        assert plugin.wait_registered(1, timeout_s=20)
        assert kubelet.wait_for(lambda: kubelet.lists)
    finally:
        plugin.stop(0)
        kubelet.stop()


def test_stub_paths_match_kubelet():
    """The method paths kubelet calls are /v1beta1.<Service>/<Method>: the proto package must be v1beta1."""
    names = {m.full_name for s in pb.DESCRIPTOR.services_by_name.values() for m in s.methods}
    assert names == {
        "v1beta1.Registration.Register",
        "v1beta1.DevicePlugin.GetDevicePluginOptions",
        "v1beta1.DevicePlugin.ListAndWatch",
        "v1beta1.DevicePlugin.GetPreferredAllocation",
        "v1beta1.DevicePlugin.Allocate",
        "v1beta1.DevicePlugin.PreStartContainer",
    }
    assert hasattr(pb_grpc, "DevicePluginStub") and hasattr(pb_grpc, "RegistrationStub")


def test_broken_sources_mark_slots_unhealthy_instead_of_crashing(tmp_path):
    """A failing MPS health source or a GPU backend that stops answering turns slots Unhealthy (no stale Healthy)."""
    backend = FakeGPUBackend(2, GI)
    mps = SettableMPS()
    plugin = DevicePlugin(backend, _config(tmp_path), mps)  # not started: refresh() is what the watcher runs
    assert plugin.refresh() and all(s.healthy for s in plugin.snapshot())
    assert not plugin.refresh()  # nothing changed, nothing published

    def broken():
        raise OSError("boom")

    plugin.mps_health = broken
    assert plugin.refresh() and not any(s.healthy for s in plugin.snapshot())
    plugin.mps_health = mps
    assert plugin.refresh() and all(s.healthy for s in plugin.snapshot())
    backend.close()  # devices() now raises GPUBackendError
    assert plugin.refresh()
    slots = plugin.snapshot()
    assert len(slots) == 2 * SLOTS and not any(s.healthy for s in slots)
