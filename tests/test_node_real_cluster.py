"""Node-side rules a real cluster needs (issue 20): the gate's one-UID rule (decision, reply, and a real
``gnnsched gate`` process that exits with the reason), the cgroup parser's kubelet positions, another device plugin
on the node (a condition, a metric, a log line; read from a Node through the API), and ``/readyz``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from gate_helpers import GiB, add_pods, job_pod, write_pods

from gnnsched.contract import DEFAULT_JOBS_UID, MPSDaemonHealth
from gnnsched.gpu.backend import FakeGPUBackend
from gnnsched.node_agent.agent import AgentOptions, NodeAgent
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.gate import GateConfig, GateServer
from gnnsched.node_agent.identity import (
    FilePodLookup,
    IdentityError,
    PeerCred,
    PeerVerifier,
    check_peer_uid,
    pod_uids_in_cgroup,
)
from gnnsched.node_agent.mps_daemon import health_file_path
from gnnsched.node_agent.mps_external import ExternalMPS
from gnnsched.node_agent.node_conflicts import FileNodeReader, KubeNodeReader, OtherPluginWatch
from gnnsched.node_agent.status import FileStatusSink
from gnnsched.node_status_file import write_json_atomic

pytestmark = [pytest.mark.timeout(60)]
GNNSCHED = [sys.executable, "-c", "from gnnsched.cli import main; main()"]
U = "0b5c1f1e-4b2a-4c1e-9d9f-0123456789ab"
US = U.replace("-", "_")


# --- one UID ------------------------------------------------------------------------------------------------------


def test_uid_decision() -> None:
    check_peer_uid(PeerCred(10, DEFAULT_JOBS_UID, 0), DEFAULT_JOBS_UID)
    check_peer_uid(PeerCred(10, 0, 0), None)  # the check is off
    with pytest.raises(IdentityError) as ei:
        check_peer_uid(PeerCred(10, 0, 0), DEFAULT_JOBS_UID)
    assert ei.value.reason == "wrong-uid"
    assert "runs as uid 0" in ei.value.message and "runAsUser to 65532" in ei.value.message
    with pytest.raises(IdentityError, match="no-peer-credentials"):
        check_peer_uid(None, DEFAULT_JOBS_UID)


def _gate(tmp: Path, jobs_uid: int | None) -> tuple[GateServer, Books]:
    books = Books([GPUSlot(0, "GPU-0", "Fake-GPU", 80 * GiB, GiB, 4)], "base")
    server = GateServer(books, GateConfig("node-a", "/run/mps", recovery_grace=0, reconcile_seconds=0,
                                          jobs_uid=jobs_uid),
                        pods=FilePodLookup(tmp / "pods.json"), verifier=PeerVerifier(enabled=False))
    return server, books


@pytest.mark.skipif(not hasattr(__import__("socket"), "SO_PEERCRED"), reason="SO_PEERCRED is Linux-only")
@pytest.mark.asyncio
async def test_gate_refuses_another_uid_and_the_gate_process_says_why(tmp_path) -> None:
    """The kernel's peer UID (this test's) differs from the configured jobs' UID: a real ``gnnsched gate`` process is
    refused at once with the reason on stderr (which kubelet's FallbackToLogsOnError turns into the pod's
    terminated message) and exit 3, instead of queueing behind another user's MPS server. The same UID is admitted."""
    pod, job = job_pod("p", GiB)
    write_pods(tmp_path / "pods.json", [pod], [job])
    other = os.getuid() + 1 if os.getuid() != DEFAULT_JOBS_UID else 0
    env = dict(os.environ, GNNSCHED_POD_UID=pod["metadata"]["uid"], GNNSCHED_POD_NAME="p",
               GNNSCHED_POD_NAMESPACE="default")
    for jobs_uid, want_rc in ((other, 3), (os.getuid(), 0)):
        server, books = _gate(tmp_path, jobs_uid)
        sock = tmp_path / f"gate-{jobs_uid}.sock"
        await server.start(sock)
        try:
            proc = await asyncio.create_subprocess_exec(
                *GNNSCHED, "gate", "--socket", str(sock), "--wait-seconds", "20", "--", "true", env=env,
                stderr=asyncio.subprocess.PIPE)
            _, err = await asyncio.wait_for(proc.communicate(), 40)
            assert proc.returncode == want_rc, err.decode()
            if want_rc == 3:
                text = err.decode()
                assert f"rejected (wrong-uid): pid {proc.pid} runs as uid {os.getuid()}" in text
                assert f"must run as uid {other}" in text and not books.queued and not books.running
        finally:
            await server.close()
            books.check()


def _admit_as(uid: int, sock: Path, pod: dict) -> dict:
    """Fork a child that drops to ``uid`` (no exec: the interpreter may be unreadable to that user), connects to the
    gate and asks for admission; returns the first reply that is not ``queued``."""
    import socket

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: only syscalls and the socket, then _exit
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            m = pod["metadata"]
            with socket.socket(socket.AF_UNIX) as c:
                c.settimeout(20)
                c.connect(str(sock))
                c.sendall(json.dumps({"op": "admit", "podUid": m["uid"], "podName": m["name"],
                                      "podNamespace": m["namespace"]}).encode() + b"\n")
                f = c.makefile("rb")
                while True:
                    line = f.readline()
                    if not line or json.loads(line).get("status") != "queued":
                        break
            os.write(w, line or b"{}")
        except BaseException as exc:  # say what broke instead of an empty reply
            os.write(w, json.dumps({"status": "child-error", "message": repr(exc)}).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    return json.loads(data or b"{}")


@pytest.mark.skipif(os.geteuid() != 0 or not hasattr(__import__("socket"), "SO_PEERCRED"),
                    reason="dropping to another UID needs root; SO_PEERCRED is Linux-only")
@pytest.mark.asyncio
async def test_default_jobs_uid_with_real_credentials(tmp_path) -> None:
    """As root, a forked client really runs as 65532 (the default jobs' UID) and is admitted; the same request from
    UID 1000 is refused with ``wrong-uid``: the kernel's credentials, not injected ones."""
    pod, job = job_pod("p", GiB)
    write_pods(tmp_path / "pods.json", [pod], [job])
    import shutil
    import tempfile

    server, books = _gate(tmp_path, DEFAULT_JOBS_UID)
    open_dir = Path(tempfile.mkdtemp(prefix="gnnsched-uid-"))  # pytest's tmp dirs are 0700: others cannot connect
    open_dir.chmod(0o755)
    sock = open_dir / "gate.sock"
    await server.start(sock)
    try:
        refused = await asyncio.to_thread(_admit_as, 1000, sock, pod)
        assert refused["status"] == "rejected" and refused["reason"] == "wrong-uid", refused
        assert "runs as uid 1000" in refused["message"]
        admitted = await asyncio.to_thread(_admit_as, DEFAULT_JOBS_UID, sock, pod)
        assert admitted["status"] == "admitted", admitted
    finally:
        await server.close()
        books.check()
        shutil.rmtree(open_dir, ignore_errors=True)


# --- cgroup positions ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    # cgroupfs driver, v1 and v2; Guaranteed (directly under kubepods), Burstable, BestEffort
    (f"12:memory:/kubepods/burstable/pod{U}/3f2e\n11:cpu:/kubepods/burstable/pod{U}/3f2e\n", {U}),
    (f"0::/kubepods/pod{U}/abc\n", {U}),
    (f"0::/kubepods/besteffort/pod{U}/abc\n", {U}),
    # systemd driver: each slice named after its parent, the UID's dashes escaped as underscores
    (f"0::/kubepods.slice/kubepods-pod{US}.slice/cri-containerd-1.scope\n", {U}),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{US}.slice/cri-containerd-1.scope\n", {U}),
    (f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
     f"kubelet-kubepods-besteffort-pod{US}.slice/cri-containerd-1.scope\n", {U}),  # --cgroup-root=/kubelet (kind)
    # seen from a reader in its own cgroup namespace: the kubepods ancestors are hidden as ".."
    (f"0::/../../kubepods-besteffort-pod{US}.slice/cri-containerd-1.scope\n", {U}),
    (f"0::/../burstable/pod{U}/c\n", {U}),
    # not kubelet's positions
    (f"0::/user.slice/user-1000.slice/pod{U}\n", set()),
    (f"0::/kubepods/burstable/pod{U.replace('0b5c', 'ffff')}/pod{U}\n", {U.replace("0b5c", "ffff")}),
    (f"0::/system.slice/containerd.service/kubepods/pod{U}/x/pod{U.replace('0b5c', 'eeee')}\n", {U}),
    (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-pod{US}.slice\n", set()),  # wrong parent
    (f"0::/kubepods/burstable/pod{US}/c\n", set()),  # cgroupfs keeps dashes
    (f"0::/kubepods.slice/kubepods-pod{U}.slice/c\n", set()),  # systemd escapes them
    (f"0::/../x/pod{U}/c\n", set()),  # below a visible non-kubepods segment
    (f"0::/../../foo-pod{US}.slice/c\n", set()),
    ("0::/user.slice/user-1000.slice\n", set()),
])
def test_cgroup_positions(text: str, want: set[str]) -> None:
    assert pod_uids_in_cgroup(text) == want


def test_two_pods_in_one_cgroup_file_is_a_mismatch() -> None:
    other = U.replace("0b5c", "ffff")
    text = f"12:memory:/kubepods/pod{U}/c\n11:cpu:/kubepods/pod{other}/c\n"
    with pytest.raises(IdentityError, match="pod-uid-mismatch"):
        PeerVerifier(True, lambda pid: text).verify(PeerCred(1, 0, 0), U)
    PeerVerifier(True, lambda pid: f"0::/kubepods/pod{U}/c\n").verify(PeerCred(1, 0, 0), U)


# --- another device plugin ----------------------------------------------------------------------------------------


def _node(name: str, gpus: str | None) -> dict:
    res = {"cpu": "8", "gnnsched.io/gpu-share": "96"}
    if gpus is not None:
        res["nvidia.com/gpu"] = gpus
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "status": {"capacity": dict(res), "allocatable": dict(res)}}


def test_other_plugin_watch_condition_metric_and_transitions(tmp_path, caplog) -> None:
    from prometheus_client import CollectorRegistry

    f = tmp_path / "pods.json"
    f.write_text(json.dumps({"pods": [], "nodes": [_node("node-a", "8")]}))
    reg = CollectorRegistry()
    watch = OtherPluginWatch("node-a", FileNodeReader(f), reg)
    c = watch.check()
    assert (c.type, c.status, c.reason) == ("OtherGPUDevicePlugin", "True", "OtherPluginAdvertisesGPUs")
    assert "capacity 8, allocatable 8" in c.message
    assert reg.get_sample_value("gnnsched_other_gpu_device_plugin", {"resource": "nvidia.com/gpu"}) == 1
    assert any("another device plugin" in r.message for r in caplog.records)
    first = c.last_transition_time
    assert watch.check().last_transition_time == first  # unchanged status keeps its transition time
    f.write_text(json.dumps({"pods": [], "nodes": [_node("node-a", "0")]}))
    c = watch.check()
    assert c.status == "False" and c.last_transition_time != first
    assert reg.get_sample_value("gnnsched_other_gpu_device_plugin", {"resource": "nvidia.com/gpu"}) == 0
    f.write_text(json.dumps({"pods": []}))
    assert watch.check().reason == "NodeNotFound"

    class Broken:
        def node(self, name: str) -> dict:
            raise RuntimeError("403 Forbidden: nodes is forbidden")

    bad = OtherPluginWatch("node-a", Broken(), CollectorRegistry()).check()
    assert bad.status == "Unknown" and bad.reason == "NodeUnreadable" and "403" in bad.message


@pytest.mark.asyncio
async def test_node_read_through_the_api(kmock) -> None:
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = str(kmock.url).rstrip("/")
    api = client.ApiClient(cfg)
    nodes: list[Any] = [_node("gpu-1", "4"), _node("gpu-2", None)]  # the client sends a plain dict as it is
    for node in nodes:
        await asyncio.to_thread(client.CoreV1Api(api).create_node, node)
    reader = KubeNodeReader(api)
    from prometheus_client import CollectorRegistry

    assert (await asyncio.to_thread(OtherPluginWatch("gpu-1", reader, CollectorRegistry()).check)).status == "True"
    assert (await asyncio.to_thread(OtherPluginWatch("gpu-2", reader, CollectorRegistry()).check)).status == "False"
    assert (await asyncio.to_thread(OtherPluginWatch("gpu-3", reader, CollectorRegistry()).check)).reason == \
        "NodeNotFound"


# --- the agent: external MPS health, readiness, the condition on the GPUNode ----------------------------------------


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.mark.asyncio
async def test_agent_ready_only_with_mps_up_and_reports_other_plugin(tmp_path) -> None:
    pods = tmp_path / "pods.json"
    write_pods(pods, [], [])
    data = json.loads(pods.read_text())
    data["nodes"] = [_node("node-a", "2")]
    pods.write_text(json.dumps(data))
    health = health_file_path(tmp_path / "state")
    opts = AgentOptions(node_name="node-a", gate_socket=tmp_path / "gate.sock", recovery_grace=0,
                        status_interval=0.2, sample_interval=3600, metrics_port=0, metrics_addr="127.0.0.1",
                        reconcile_interval=0, state_dir=str(tmp_path / "state"), node_check_interval=0.2)
    agent = NodeAgent(opts, FakeGPUBackend(1, 80 * GiB), FilePodLookup(pods), FileStatusSink(tmp_path / "s.json"),
                      PeerVerifier(enabled=False), mps=ExternalMPS(health, max_age_s=30), nodes=FileNodeReader(pods))
    stop = asyncio.Event()
    run = asyncio.create_task(agent.run(stop))
    try:
        for _ in range(200):
            if agent.metrics_server is not None:
                break
            await asyncio.sleep(0.02)
        port = agent.metrics_server.server_port  # type: ignore[attr-defined]
        code, body = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz")
        assert code == 503 and b"MPS is down" in body and b"mps-daemon" in body
        assert (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/healthz"))[0] == 200  # alive, not ready
        write_json_atomic(health, MPSDaemonHealth(healthy=True, message="running", compute_mode="EXCLUSIVE_PROCESS",
                                                  shm_shared=True, updated_at=datetime.now(timezone.utc)).wire())
        await asyncio.to_thread(agent.mps.check)  # type: ignore[union-attr]
        assert await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/readyz") == (200, b"ready\n")
        agent._dirty.set()  # type: ignore[union-attr]
        for _ in range(100):
            status = json.loads((tmp_path / "s.json").read_text())["status"]
            if status["mps"]["healthy"]:
                break
            await asyncio.sleep(0.05)
        # What `gnnsched doctor` reads from the GPUNode: MPS up, compute mode, shm shared, the other plugin.
        assert status["mps"] == {"healthy": True, "restarts": 0, "message": "running",
                                 "computeMode": "EXCLUSIVE_PROCESS", "shmShared": True}
        assert [(c["type"], c["status"]) for c in status["conditions"]] == [("OtherGPUDevicePlugin", "True")]
        # NVIDIA's plugin removed: the next node check flips the condition and the status follows.
        data["nodes"] = [_node("node-a", None)]
        add_pods(pods, [], [])  # (same lock as the agent's writes)
        pods.write_text(json.dumps(data))
        for _ in range(100):
            status = json.loads((tmp_path / "s.json").read_text())["status"]
            if status["conditions"][0]["status"] == "False":
                break
            await asyncio.sleep(0.05)
        assert status["conditions"][0]["status"] == "False"
        m = (await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics"))[1].decode()
        assert 'gnnsched_other_gpu_device_plugin{resource="nvidia.com/gpu"} 0.0' in m
    finally:
        stop.set()
        await asyncio.wait_for(run, 10)
