"""GPU backend: spec parsing, the controllable fake, and NVML's failure mode on a machine without a driver."""

from __future__ import annotations

import re
import socket
import threading
import time

import pytest

from gnnsched.contract import ENV_NODE_NAME
from gnnsched.gpu.backend import (
    APPLICATION_XIDS,
    BackendSpecError,
    FakeGPUBackend,
    GPUBackend,
    NVMLBackend,
    NVMLUnavailableError,
    fake_uuid,
    fake_uuid_prefix,
    local_node_name,
    open_backend,
    parse_fake_spec,
)

GI = 1024**3


def _nvml_loads() -> bool:
    try:
        NVMLBackend().close()
        return True
    except NVMLUnavailableError:
        return False


def test_parse_fake_spec_variants():
    assert parse_fake_spec("fake:2x80Gi") == (2, 80 * GI, "Fake-GPU")
    assert parse_fake_spec("fake:4x40GixA100-40GB") == (4, 40 * GI, "A100-40GB")
    assert parse_fake_spec("fake:1x80Gixnvidia a100-sxm4-80gb") == (1, 80 * GI, "A100-80GB")  # alias -> catalogue
    assert parse_fake_spec(" fake:1x16G ") == (1, 16 * 10**9, "Fake-GPU")


@pytest.mark.parametrize(
    "spec, needle",
    [
        ("fake", "fake:NxSIZE"),
        ("fake:", "fake:NxSIZE"),
        ("fake:twox80Gi", "count"),
        ("fake:0x80Gi", "between 1 and 64"),
        ("fake:2x80Zz", "not a quantity"),
        ("fake:2x0", "positive"),
        ("fake:2x80GixB999", "unknown GPU model"),
        ("cuda", "fake:NxSIZE"),
        ("", "fake:NxSIZE"),
    ],
)
def test_bad_specs_name_the_flag(spec, needle):
    with pytest.raises(BackendSpecError) as ei:
        open_backend(spec)
    assert ei.value.field == "--gpus"
    assert needle in str(ei.value)
    assert "\n" not in str(ei.value)


def test_fake_satisfies_protocol_and_reports_devices():
    b = open_backend("fake:2x80Gi", node_name="node-a")
    assert isinstance(b, GPUBackend)
    devs = b.devices()
    assert [d.index for d in devs] == [0, 1]
    prefix = fake_uuid_prefix("node-a")
    assert [d.uuid for d in devs] == [fake_uuid(0, prefix), fake_uuid(1, prefix)]
    assert len({d.uuid for d in devs}) == 2
    assert all(d.total_bytes == 80 * GI and d.used_bytes == 0 and d.healthy for d in devs)
    assert devs[0].free_bytes == 80 * GI
    b.close()


def test_fake_processes_count_towards_used_bytes():
    b = FakeGPUBackend(2, 80 * GI)
    b.add_process(1, pid=100, used_bytes=3 * GI)
    b.add_process(1, pid=101, used_bytes=None, kind="compute")  # driver could not attribute memory
    b.add_process(1, pid=100, used_bytes=5 * GI)  # grows
    assert b.devices()[1].used_bytes == 5 * GI
    assert [(p.pid, p.used_bytes, p.kind) for p in b.processes(1)] == [(100, 5 * GI, "mps"), (101, None, "compute")]
    b.remove_process(1, 100)
    assert b.devices()[1].used_bytes == 0
    assert b.processes(0) == []
    with pytest.raises(ValueError):
        b.add_process(0, pid=1, used_bytes=81 * GI)
    with pytest.raises(IndexError):
        b.processes(2)
    b.set_used_bytes(0, 7 * GI)
    assert b.devices()[0].free_bytes == 73 * GI


def test_fake_health_and_xid():
    b = FakeGPUBackend(2, 80 * GI)
    b.set_healthy(0, False, "fell off the bus")
    d0 = b.devices()[0]
    assert not d0.healthy and d0.health_reason == "fell off the bus"
    b.set_healthy(0, True)
    assert b.devices()[0].healthy

    app_xid = sorted(APPLICATION_XIDS)[0]
    ev = b.inject_xid(1, app_xid)
    assert not ev.critical and b.devices()[1].healthy  # an application's own fault does not condemn the GPU
    ev = b.inject_xid(1, 79, "GPU has fallen off the bus")
    assert ev.critical
    d1 = b.devices()[1]
    assert not d1.healthy and "Xid 79" in d1.health_reason
    events = b.health_events(0)
    assert [(e.index, e.xid, e.critical) for e in events] == [(1, app_xid, False), (1, 79, True)]
    assert b.health_events(0) == []  # consumed


def test_fake_health_events_wake_on_change():
    """A watcher blocked in health_events returns as soon as a test changes the fake, not at its timeout."""
    b = FakeGPUBackend(1, 80 * GI)
    woke = {}

    def watch():
        t0 = time.monotonic()
        b.health_events(5.0)
        woke["after"] = time.monotonic() - t0

    t = threading.Thread(target=watch)
    t.start()
    time.sleep(0.05)
    b.set_used_bytes(0, GI)
    t.join(2)
    assert not t.is_alive()
    assert woke["after"] < 1.0
    t0 = time.monotonic()
    assert b.health_events(0.05) == []
    assert time.monotonic() - t0 >= 0.04


def test_fake_close_is_idempotent_and_final():
    b = FakeGPUBackend(1, GI)
    b.close()
    b.close()
    with pytest.raises(Exception, match="closed"):
        b.devices()


@pytest.mark.skipif(_nvml_loads(), reason="NVML loads on this machine")
def test_nvml_unavailable_is_one_clear_line():
    with pytest.raises(NVMLUnavailableError) as ei:
        open_backend("nvml")
    msg = str(ei.value)
    assert msg.startswith("NVML unavailable")
    assert "--gpus fake" in msg
    assert "\n" not in msg


@pytest.mark.gpu
@pytest.mark.skipif(not _nvml_loads(), reason="needs an NVIDIA driver")
def test_nvml_real_devices():
    b = open_backend("nvml")
    try:
        devs = b.devices()
        assert devs and all(d.total_bytes > 0 and d.uuid.startswith(("GPU-", "MIG-")) for d in devs)
        for d in devs:
            assert all(p.pid > 0 for p in b.processes(d.index))
        assert isinstance(b.health_events(0.01), list)
    finally:
        b.close()


def test_two_nodes_fake_gpus_have_distinct_uuids_and_one_nodes_processes_agree(monkeypatch):
    """Real GPU UUIDs are unique cluster-wide (the extender and the operator name a GPU by its UUID alone); the agent,
    the device plugin and the MPS daemon of one node each open the backend and must see the same UUIDs."""
    uuids = {node: [d.uuid for d in open_backend("fake:2x16Gi", node_name=node).devices()]
             for node in ("node-1", "node-2")}
    assert not set(uuids["node-1"]) & set(uuids["node-2"])
    shape = r"GPU-[0-9a-f]{8}-0000-4000-8000-[0-9a-f]{12}"  # NVML's 8-4-4-4-12
    assert all(re.fullmatch(shape, u) for u in uuids["node-1"] + uuids["node-2"])
    assert [d.uuid for d in open_backend("fake:2x16Gi", node_name="node-1").devices()] == uuids["node-1"]
    monkeypatch.setenv(ENV_NODE_NAME, "node-2")  # the device plugin and the MPS daemon: NODE_NAME from the chart
    assert local_node_name() == "node-2"
    assert [d.uuid for d in open_backend("fake:2x16Gi").devices()] == uuids["node-2"]
    monkeypatch.delenv(ENV_NODE_NAME)
    assert local_node_name() == socket.gethostname()
