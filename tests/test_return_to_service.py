"""Returning a repaired GPU to service without restarting the node agent (docs/faults.md, "Returning a repaired GPU").

- the rule (``gnnsched.return_to_service.judge_return``) and the request files, as pure functions;
- the fake driver's Xid mark, dropped only when it came before the request;
- the running agent (its real loop: sampling, status publishing, the driver's event thread) with fake GPUs, and the
  device plugin beside it over real gRPC on a unix socket with the test kubelet, each with its own driver view of the
  same Xid, as two processes on a node have: Xid 79 takes GPU 1 out; ``gnnsched node-agent return-to-service 1`` (a
  real process) brings it back within a sample, in the status file, the metrics and ListAndWatch; a new hardware Xid
  takes it out again; requests for an unknown GPU, a GPU in service, or made before the latest Xid are refused;
- the command's bad input: one line naming the field, nothing written.

The restart path (a request found at start) is ``test_node_agent_loop``'s
``test_a_hardware_xid_keeps_the_gpu_out_across_restarts_until_an_admin_returns_it``; the same Xid and return through
NVML (the stand-in driver), the device plugin and the extender is in ``test_gpu_backend_nvml_standin``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import pytest_asyncio
from dp_test_kubelet import TestKubelet
from gate_helpers import GiB, write_pods
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.contract import (
    RETURN_TO_SERVICE_DIR_NAME,
    RETURN_TO_SERVICE_REJECTED_SUFFIX,
    GPUNodeStatus,
    GPUStatus,
    MPSStatus,
)
from gnnsched.device_plugin.mps_health import StatusFileMPSHealth
from gnnsched.device_plugin.server import DevicePlugin, PluginConfig
from gnnsched.device_plugin.slots import parse_slot_id
from gnnsched.gpu.backend import FakeGPUBackend, GPUInfo
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier
from gnnsched.node_agent.status import FileStatusSink
from gnnsched.node_status_file import read_status_file, status_file_path, write_status_file
from gnnsched.return_to_service import (
    PendingReturn,
    judge_return,
    pending_requests,
    reject_request,
    rejection,
    write_request,
)

pytestmark = [pytest.mark.timeout(90)]

U = "GPU-00000000-0000-4000-8000-00000000000{}"


# --- the rule and the files ---------------------------------------------------------------------------------------


def _gpu(healthy: bool = True, xid: int | None = None, since: float | None = None, reason: str = "") -> GPUInfo:
    return GPUInfo(1, U.format(1), "A100", 80 * GiB, 0, healthy=healthy, health_reason=reason, unhealthy_xid=xid,
                   unhealthy_since=since)


def _req(at: float) -> PendingReturn:
    return PendingReturn(U.format(1), Path("/nonexistent") / U.format(1), at, "admin")


def test_the_rule_returns_only_a_present_readable_gpu_held_by_a_hardware_xid_before_the_request() -> None:
    out79 = _gpu(False, 79, 100.0, "Xid 79")
    # the driver's own mark (this agent saw the Xid) or the agent's restored hold (a restart: NVML's view is clean)
    assert judge_return(_req(200.0), out79, None, (79, 100.0)).accepted
    ok = judge_return(_req(200.0), _gpu(), (48, 50.0), None)
    assert ok.accepted and (ok.xid, ok.since) == (48, 50.0)
    refused = {
        "unknown": judge_return(_req(200.0), None, None, None),
        "healthy": judge_return(_req(200.0), _gpu(), None, None),
        "application": judge_return(_req(200.0), _gpu(False, 13, 100.0, "Xid 13"), None, None),
        "other cause": judge_return(_req(200.0), _gpu(False, reason="marked unhealthy"), None, None),
        "unreadable": judge_return(_req(200.0), _gpu(False, reason="GPU is lost"), (79, 100.0), None),
        "a later Xid": judge_return(_req(200.0), out79, None, (48, 250.0)),
        "marked after": judge_return(_req(50.0), out79, None, None),
        "held, later Xid": judge_return(_req(200.0), _gpu(), (79, 100.0), (79, 300.0)),
    }
    codes = {k: v.code for k, v in refused.items()}
    assert codes == {"unknown": "unknown-gpu", "healthy": "not-held", "application": "not-held",
                     "other cause": "not-held", "unreadable": "still-faulty", "a later Xid": "new-xid",
                     "marked after": "new-xid", "held, later Xid": "new-xid"}
    assert f"no GPU with UUID {U.format(1)}" in refused["unknown"].message
    assert "is in service" in refused["healthy"].message
    assert "GPU is lost" in refused["unreadable"].message
    assert "Xid 48 came at 1970-01-01T00:04:10Z, after the request" in refused["a later Xid"].message


def test_request_files_written_read_refused(tmp_path: Path) -> None:
    state = tmp_path / "state"
    assert pending_requests(state) == []  # no folder yet
    path = write_request(state, U.format(0), "admin@node-pod", "reseated, ticket 7")
    folder = state / RETURN_TO_SERVICE_DIR_NAME
    assert path == folder / U.format(0)
    (folder / U.format(1)).touch()  # by hand: an empty file is a request by its owner
    (folder / f".{U.format(2)}.tmp").write_text("half")  # being written
    (folder / f"{U.format(3)}{RETURN_TO_SERVICE_REJECTED_SUFFIX}").write_text("old refusal")
    (folder / U.format(4)).write_text("not json")
    reqs = {r.uuid: r for r in pending_requests(state)}
    assert set(reqs) == {U.format(0), U.format(1), U.format(4)}
    assert (reqs[U.format(0)].requested_by, reqs[U.format(0)].note) == ("admin@node-pod", "reseated, ticket 7")
    assert reqs[U.format(1)].requested_by.startswith(f"uid {os.getuid()}") and reqs[U.format(1)].note is None
    assert reqs[U.format(4)].requested_by.startswith(f"uid {os.getuid()}")
    assert abs(reqs[U.format(0)].requested_at - path.stat().st_mtime) < 1e-6
    reject_request(reqs[U.format(0)], "no GPU with UUID x on this node")
    assert not path.exists() and rejection(state, U.format(0)) == "no GPU with UUID x on this node"
    write_request(state, U.format(0), "admin")  # asking again drops the old refusal
    assert rejection(state, U.format(0)) is None and path.exists()


def test_the_fake_driver_forgets_only_a_mark_from_before_the_request() -> None:
    b = FakeGPUBackend(2, 80 * GiB)
    u1 = b.devices()[1].uuid
    b.inject_xid(1, 79)
    since = b.devices()[1].unhealthy_since
    assert since is not None
    assert not b.forget_xid(u1, since - 1.0)  # the Xid came after that request
    assert not b.devices()[1].healthy
    assert not b.forget_xid(b.devices()[0].uuid, time.time())  # no mark there
    b.set_healthy(0, False, "not an Xid")
    assert not b.forget_xid(b.devices()[0].uuid, time.time()) and not b.devices()[0].healthy
    assert b.forget_xid(u1, since)
    d = b.devices()[1]
    assert d.healthy and (d.unhealthy_xid, d.health_reason) == (None, "")
    b.inject_xid(1, 48)  # the next critical Xid marks it again
    assert (b.devices()[1].healthy, b.devices()[1].unhealthy_xid) == (False, 48)


# --- the running agent and the device plugin ----------------------------------------------------------------------


SAMPLE_S = 0.2


class Rig:
    """A node: the agent's real loop on 2 fake 80 GiB GPUs, and the device plugin with its own driver view (the same
    UUIDs, its own Xid marks), reading the agent's status file, registered with a test kubelet."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        write_pods(tmp / "pods.json", [], [])
        self.agent_gpus = FakeGPUBackend(2, 80 * GiB, name="NVIDIA A100-SXM4-80GB")
        self.plugin_gpus = FakeGPUBackend(2, 80 * GiB, name="NVIDIA A100-SXM4-80GB")
        self.u0, self.u1 = (d.uuid for d in self.agent_gpus.devices())
        opts = AgentOptions(node_name="node-a", gate_socket=tmp / "gate.sock", policy="base", recovery_grace=0,
                            status_interval=SAMPLE_S, sample_interval=SAMPLE_S, metrics_port=None,
                            reconcile_interval=0, state_dir=str(self.state), event_log=tmp / "events.jsonl")
        self.agent = NodeAgent(opts, self.agent_gpus, FilePodLookup(tmp / "pods.json"),
                               FileStatusSink(tmp / "gpunode.json"), PeerVerifier(enabled=False))
        self.kubelet = TestKubelet(tmp)
        self.plugin = DevicePlugin(self.plugin_gpus, PluginConfig(
            plugin_dir=tmp, slots_per_gpu=2, mps_pipe_dir=str(tmp / "mps"), gate_socket=str(tmp / "gate.sock"),
            poll_interval_s=0.1, watch_interval_s=0.05), StatusFileMPSHealth(status_file_path(self.state), 30))
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.kubelet.start()
        self.plugin.start()
        self.task = asyncio.create_task(self.agent.run(self.stop))
        await until(lambda: self.slots(self.u0) == self.slots(self.u1) == {"Healthy"}, "the node up")

    async def close(self) -> None:
        self.stop.set()
        if self.task is not None:
            await asyncio.wait_for(self.task, 20)
        self.plugin.stop(0)
        self.kubelet.stop()

    def xid(self, index: int, xid: int) -> None:
        """One Xid from the driver, which NVML hands to every process that watches the GPU."""
        self.agent_gpus.inject_xid(index, xid, "test")
        self.plugin_gpus.inject_xid(index, xid, "test")

    def gpu(self, index: int) -> GPUStatus:
        return read_status_file(status_file_path(self.state)).gpus[index]

    def slots(self, uuid: str) -> set[str]:
        return {h for sid, h in self.kubelet.latest().items() if parse_slot_id(sid)[0] == uuid}

    def metric(self, name: str, labels: dict[str, str]) -> float | None:
        return self.agent.metrics.registry.get_sample_value(name, labels)

    def folder(self) -> Path:
        return self.state / RETURN_TO_SERVICE_DIR_NAME


async def until(cond, what: str, timeout: float = 10.0) -> float:
    """Wait for ``cond``; returns the seconds it took."""
    start = time.monotonic()
    while not cond():
        if time.monotonic() - start > timeout:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def return_to_service(state: Path, *args: str) -> tuple[int, str]:
    """``gnnsched node-agent return-to-service ARGS`` as a process (as ``kubectl exec`` runs it)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gnnsched.cli", "node-agent", "return-to-service", *args, f"--state-dir={state}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode()


@pytest_asyncio.fixture
async def rig(tmp_path):
    r = Rig(tmp_path)
    try:
        await r.start()
        yield r
    finally:
        await r.close()


@pytest.mark.asyncio
async def test_a_returned_gpu_is_back_within_a_sample_everywhere_and_a_new_xid_takes_it_out_again(rig: Rig,
                                                                                                caplog) -> None:
    caplog.set_level(logging.WARNING, logger="gnnsched.node_agent")
    unhealthy = "gnnsched_gpu_unhealthy"
    rig.xid(1, 79)
    await until(lambda: not rig.gpu(1).healthy and rig.slots(rig.u1) == {"Unhealthy"}, "GPU 1 out")
    assert (rig.gpu(1).unhealthy_xid, rig.slots(rig.u0)) == (79, {"Healthy"})
    await until(lambda: rig.metric(unhealthy, {"gpu": "1", "uuid": rig.u1, "xid": "79"}) == 1, "the metric")
    await asyncio.sleep(3 * SAMPLE_S)  # several samples later, nothing brought it back by itself
    assert not rig.gpu(1).healthy and rig.slots(rig.u1) == {"Unhealthy"}

    code, out = await return_to_service(rig.state, "1", "--note", "reseated, ticket 7", "--wait", "20")
    assert code == 0, out
    assert f"GPU 1 ({rig.u1}) is back in service" in out
    assert list(rig.folder().iterdir()) == []  # consumed
    await until(lambda: rig.gpu(1).healthy and rig.slots(rig.u1) == {"Healthy"}, "GPU 1 back", 5)
    gpu = rig.gpu(1)
    assert gpu.unhealthy_xid is None and gpu.unhealthy_since is None and gpu.returned_to_service_at is not None
    assert rig.agent.gate is not None and rig.agent.gate.books.gpus[1].healthy
    assert rig.metric("gnnsched_gpu_returned_to_service_total", {"gpu": "1", "uuid": rig.u1}) == 1
    assert rig.metric(unhealthy, {"gpu": "1", "uuid": rig.u1, "xid": ""}) == 0
    assert rig.metric(unhealthy, {"gpu": "1", "uuid": rig.u1, "xid": "79"}) is None
    (line,) = [r.getMessage() for r in caplog.records if "returned to service at the request of" in r.getMessage()]
    assert f"GPU 1 ({rig.u1})" in line and "clears Xid 79" in line and "(reseated, ticket 7)" in line, line
    assert "@" in line and gpu.returned_to_service_at.strftime("%Y-%m-%dT%H:%M:%SZ") in line, line
    events = [json.loads(x) for x in (rig.tmp / "events.jsonl").read_text().splitlines()]
    assert [e["uuid"] for e in events if e.get("event") == "returned-to-service"] == [rig.u1]

    rig.xid(1, 48)  # a new hardware Xid: out again, in the agent and in the plugin's own view
    await until(lambda: not rig.gpu(1).healthy and rig.slots(rig.u1) == {"Unhealthy"}, "GPU 1 out again")
    assert rig.gpu(1).unhealthy_xid == 48 and not rig.plugin_gpus.devices()[1].healthy
    await until(lambda: rig.metric(unhealthy, {"gpu": "1", "uuid": rig.u1, "xid": "48"}) == 1, "the metric again")


@pytest.mark.asyncio
async def test_requests_the_agent_refuses_are_renamed_with_the_reason_and_change_nothing(rig: Rig) -> None:
    refused = "gnnsched_gpu_return_requests_refused_total"
    unknown = "GPU-ffffffff-0000-4000-8000-000000000009"
    written = time.monotonic()
    write_request(rig.state, unknown, "admin")  # the command would refuse it: written by hand
    took = await until(lambda: rejection(rig.state, unknown) is not None, "the refusal", 5)
    assert time.monotonic() - written < 10 * SAMPLE_S, took  # within a sample or two, loaded machine allowed for
    assert rejection(rig.state, unknown) == f"no GPU with UUID {unknown} on this node"
    assert not (rig.folder() / unknown).exists()
    # the agent writes the refusal from a worker thread and counts it when its coroutine resumes: this test's poll
    # can see the file first, so the count is waited for, not read at once
    await until(lambda: rig.metric(refused, {"reason": "unknown-gpu"}) == 1, "the refusal counted", 5)

    (rig.folder() / rig.u0).touch()  # a GPU in service
    await until(lambda: rejection(rig.state, rig.u0) is not None, "the second refusal", 5)
    assert "is in service" in (rejection(rig.state, rig.u0) or "")
    await until(lambda: rig.metric(refused, {"reason": "not-held"}) == 1, "the second refusal counted", 5)

    old = write_request(rig.state, rig.u1, "admin", None)  # made before the Xid below: the GPU is not repaired
    os.utime(old, (time.time() - 60, time.time() - 60))
    rig.agent_gpus.inject_xid(1, 79)  # may be seen with the request in one sample: the request is older either way
    rig.plugin_gpus.inject_xid(1, 79)
    await until(lambda: rejection(rig.state, rig.u1) is not None, "the third refusal", 5)
    assert "Xid 79 came at" in (rejection(rig.state, rig.u1) or "") and "after the request" in (
        rejection(rig.state, rig.u1) or "")
    await until(lambda: rig.metric(refused, {"reason": "new-xid"}) == 1, "the third refusal counted", 5)
    await asyncio.sleep(3 * SAMPLE_S)
    assert not rig.gpu(1).healthy and rig.slots(rig.u1) == {"Unhealthy"} and rig.gpu(0).healthy
    assert rig.metric("gnnsched_gpu_returned_to_service_total", {"gpu": "1", "uuid": rig.u1}) is None
    assert rig.task is not None and not rig.task.done()  # nothing crashed


# --- the command's bad input ---------------------------------------------------------------------------------------


def _status(state: Path, healthy1: bool = False, xid: int | None = 79) -> None:
    gpus = [GPUStatus(index=0, uuid=U.format(0), model="A100-80GB", total_bytes=80 * GiB),
            GPUStatus(index=1, uuid=U.format(1), model="A100-80GB", total_bytes=80 * GiB, healthy=healthy1,
                      unhealthy_xid=None if healthy1 else xid,
                      unhealthy_reason=None if healthy1 else (f"Xid {xid}" if xid else "GPU is lost"),
                      unhealthy_since=None if healthy1 else datetime(2026, 1, 1, tzinfo=timezone.utc))]
    write_status_file(status_file_path(state), GPUNodeStatus(node_name="node-a", updated_at=datetime.now(timezone.utc),
                                                             mps=MPSStatus(), gpus=gpus))


def _run(*args: str) -> tuple[int, str]:
    r = CliRunner().invoke(app, ["node-agent", "return-to-service", *args])
    return r.exit_code, r.output


def test_the_command_refuses_bad_input_in_one_line_naming_the_field(tmp_path: Path) -> None:
    state = tmp_path / "state"
    code, out = _run("1", f"--state-dir={state}")
    assert code == 2 and out.startswith("error: --state-dir: no node agent status") and out.count("\n") == 1, out
    _status(state)
    cases = {
        "7": "error: GPU: no GPU '7' on node node-a (its GPUs: 0 GPU-",
        "GPU-nope": "error: GPU: no GPU 'GPU-nope' on node node-a",
        "0": f"error: GPU: GPU 0 ({U.format(0)}) is in service: there is nothing to return",
    }
    for arg, start in cases.items():
        code, out = _run(arg, f"--state-dir={state}")
        assert code == 2 and out.startswith(start) and out.count("\n") == 1, (arg, out)
    code, out = _run("1", f"--state-dir={state}", "--note", "x" * 1025)
    assert code == 2 and out.startswith("error: --note: at most 1024 characters"), out
    _status(state, xid=None)
    code, out = _run("1", f"--state-dir={state}")
    assert code == 2 and "out for 'GPU is lost', not a hardware Xid" in out, out
    _status(state, xid=13)
    code, out = _run("1", f"--state-dir={state}")
    assert code == 2 and "not a hardware Xid" in out, out
    assert not (state / RETURN_TO_SERVICE_DIR_NAME).exists()  # nothing written for any of them


def test_the_command_writes_the_request_by_uuid_and_says_when_no_agent_answers(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _status(state)
    code, out = _run(U.format(1).upper(), f"--state-dir={state}", "--wait", "0", "--note", "new riser")
    assert code == 0 and f"asked the node agent to return GPU 1 ({U.format(1)})" in out and "Xid 79" in out, out
    (req,) = pending_requests(state)
    assert (req.uuid, req.note) == (U.format(1), "new riser") and "@" in req.requested_by
    code, out = _run("1", f"--state-dir={state}", "--wait", "0.3")
    assert code == 1 and "the node agent did not answer within 0.3 s" in out and "the request stays in" in out, out
    assert pending_requests(state)
