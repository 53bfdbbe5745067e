"""The security review's gate findings (issue 39, item 3 and the small ones), reproduced over a real unix socket with
the peer verifier on: the kernel's SO_PEERCRED pid of each connection is mapped to its pod's cgroup (this test
process is pod ``victim-or-attacker`` as each test sets; a child process is the pod named in its command line)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_asyncio
from gate_helpers import GiB, job_pod
from test_node_agent import add_pods

import gnnsched.node_agent.gate as gate_module
from gnnsched.contract import ANN_ADMISSION_SEAL, ANN_ADMITTED_AT, ANN_GPU
from gnnsched.node_agent.books import Books, GPUSlot
from gnnsched.node_agent.gate import GateConfig, GateServer
from gnnsched.node_agent.gate_checks import MAX_CONNECTIONS_PER_POD
from gnnsched.node_agent.identity import FilePodLookup, PeerVerifier
from gnnsched.node_agent.metrics import AgentMetrics

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(__import__("socket"), "SO_PEERCRED"), reason="SO_PEERCRED is Linux")]

SEAL_KEY = b"k" * 32


def _cgroup(uid: str) -> str:
    return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-x.scope\n"


class Peers:
    """The cgroup of a pid: this process is ``me``; a child names its pod uid as its last argument."""

    def __init__(self) -> None:
        self.me = ""

    def read(self, pid: int) -> str:
        if pid == os.getpid():
            return _cgroup(self.me)
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return _cgroup(next(a.decode() for a in reversed(args) if a))


class Harness:
    def __init__(self, tmp: Path, grace: float = 0.0, wall=None) -> None:
        self.tmp = tmp
        self.pods_file = tmp / "pods.json"
        self.peers = Peers()
        self.metrics = AgentMetrics()
        self.books = Books([GPUSlot(i, f"GPU-fake-{i}", "Fake-GPU", 80 * GiB, 2 * GiB, 4) for i in range(2)], "base")
        self.server = self.new_server(grace, wall)

    def new_server(self, grace: float, wall=None, pods=None) -> GateServer:
        kw = {"wall": wall} if wall is not None else {}
        return GateServer(
            self.books, GateConfig(node_name="node-a", pipe_directory="/run/mps", recovery_grace=grace,
                                   reconcile_seconds=0, seal_key=SEAL_KEY),
            pods=pods or FilePodLookup(self.pods_file), verifier=PeerVerifier(True, self.peers.read),
            metrics=self.metrics, event_log=self.tmp / "events.jsonl", **kw,
        )

    async def request(self, pod: dict, op: str = "admit", sock: Path | None = None, **extra):
        r, w = await asyncio.open_unix_connection(str(sock or self.tmp / "gate.sock"))
        m = pod["metadata"]
        msg = {"op": op, "podUid": m["uid"], "podName": m["name"], "podNamespace": m["namespace"], **extra}
        w.write(json.dumps(msg).encode() + b"\n")
        await w.drain()
        return r, w

    async def reply(self, r, want: str | None = None) -> dict:
        while True:
            line = await asyncio.wait_for(r.readline(), 5)
            assert line, "connection closed without a reply"
            msg = json.loads(line)
            if want is None or msg["status"] in (want, "rejected"):
                return msg

    def events(self, kind: str) -> list[dict]:
        path = self.tmp / "events.jsonl"
        return [e for e in map(json.loads, path.read_text().splitlines()) if e["event"] == kind]


def _with_containers(pod: dict, *names: str) -> dict:
    pod["spec"]["containers"] = [{"name": n, "image": "x"} for n in names]
    return pod


@pytest_asyncio.fixture
async def h(tmp_path):
    h = Harness(tmp_path)
    await h.server.start(tmp_path / "gate.sock")
    yield h
    await h.server.close()


@pytest.mark.asyncio
async def test_one_pod_cannot_book_several_entries_by_naming_containers(h: Harness) -> None:
    """Finding: a 30 GiB pod booked four entries (60 GiB per GPU) with four ``container`` values."""
    pod, job = job_pod("big", 30 * GiB)
    add_pods(h.pods_file, [_with_containers(pod, "job")], [job])
    h.peers.me = pod["metadata"]["uid"]
    replies, writers = [], []
    for container in ("", "job", "a", "b"):
        r, w = await h.request(pod, container=container)
        replies.append(await h.reply(r, "admitted"))
        writers.append(w)
    assert replies[0]["status"] == "admitted"
    assert [m.get("reason") for m in replies[1:]] == ["duplicate", "unknown-container", "unknown-container"]
    assert "one per container" in replies[1]["message"] and "'a'" in replies[2]["message"]
    assert len(h.books.running) == 1
    assert sum(h.books.committed_bytes(i) for i in h.books.gpus) == 30 * GiB
    # A pod of two containers: each may hold one entry, and must say which.
    two, job2 = job_pod("two", 8 * GiB)
    add_pods(h.pods_file, [_with_containers(two, "a", "b")], [job2])
    h.peers.me = two["metadata"]["uid"]
    r, _ = await h.request(two)
    assert (await h.reply(r))["reason"] == "container-required"
    got = []
    for container in ("a", "b", "a", "c"):
        r, w = await h.request(two, container=container)
        got.append((await h.reply(r, "admitted")).get("reason", "admitted"))
        writers.append(w)
    assert got == ["admitted", "admitted", "duplicate", "unknown-container"]
    for w in writers:
        w.close()


@pytest.mark.asyncio
async def test_resume_of_a_never_admitted_pod_is_refused(h: Harness) -> None:
    """Finding: ``resume`` booked a pod this agent never admitted, on a GPU of its choice (skipping the queue)."""
    pod, job = job_pod("liar", 8 * GiB)
    add_pods(h.pods_file, [pod], [job])
    h.peers.me = pod["metadata"]["uid"]
    r, _ = await h.request(pod, op="resume", gpuUuid="GPU-fake-1", bytes=8 * GiB)
    msg = await h.reply(r)
    assert msg["reason"] == "not-admitted-here", msg
    # With the admission annotations forged on the pod (a tenant can write its own pod's annotations): no seal.
    forged, job2 = job_pod("forger", 8 * GiB)
    forged["metadata"]["annotations"].update({ANN_GPU: "GPU-fake-1", ANN_ADMITTED_AT: "2026-01-01T00:00:00.000Z",
                                              ANN_ADMISSION_SEAL: "0" * 64})
    add_pods(h.pods_file, [forged], [job2])
    h.peers.me = forged["metadata"]["uid"]
    r, _ = await h.request(forged, op="resume", gpuUuid="GPU-fake-1", bytes=8 * GiB)
    assert (await h.reply(r))["reason"] == "not-admitted-here"
    assert not h.books.running


@pytest.mark.asyncio
async def test_resume_reattaches_only_what_this_agent_admitted_on_that_gpu(tmp_path) -> None:
    """The legitimate path: admitted by one agent, that agent dies, its successor (same node seal key) adopts the pod
    from its sealed annotations and the keeper re-attaches, on the admitted GPU only. A forged annotation on another
    pod is not adopted; a seal copied onto it does not verify either."""
    h = Harness(tmp_path)
    await h.server.start(tmp_path / "gate.sock")
    pod, job = job_pod("honest", 8 * GiB)
    add_pods(h.pods_file, [pod], [job])
    h.peers.me = pod["metadata"]["uid"]
    r, w = await h.request(pod)
    admitted = await h.reply(r, "admitted")
    assert admitted["status"] == "admitted"
    await asyncio.sleep(0.3)  # the annotation writer
    data = json.loads(h.pods_file.read_text())
    ann = data["pods"][0]["metadata"]["annotations"]
    assert ann[ANN_ADMISSION_SEAL]
    thief, job2 = job_pod("thief", 8 * GiB)
    thief["metadata"]["annotations"].update({k: ann[k] for k in (ANN_GPU, ANN_ADMITTED_AT, ANN_ADMISSION_SEAL)})
    add_pods(h.pods_file, [thief], [job2])
    # The agent is killed: nothing is released or annotated (a new books object is the successor's).
    h.server._annotations = None
    h.books = Books([GPUSlot(i, f"GPU-fake-{i}", "Fake-GPU", 80 * GiB, 2 * GiB, 4) for i in range(2)], "base")
    successor = h.new_server(grace=2.0)
    await successor.start(tmp_path / "gate2.sock")
    try:
        assert list(h.books.running) == [pod["metadata"]["uid"]]  # adopted; the thief is not
        other = "GPU-fake-0" if admitted["gpuUuid"] == "GPU-fake-1" else "GPU-fake-1"
        r2, _ = await h.request(pod, op="resume", sock=tmp_path / "gate2.sock", gpuUuid=other, bytes=8 * GiB)
        assert (await h.reply(r2))["reason"] == "resume-mismatch"
        r3, w3 = await h.request(pod, op="resume", sock=tmp_path / "gate2.sock", gpuUuid=admitted["gpuUuid"],
                                 bytes=8 * GiB)
        assert (await h.reply(r3))["status"] == "resumed"
        h.peers.me = thief["metadata"]["uid"]
        r4, _ = await h.request(thief, op="resume", sock=tmp_path / "gate2.sock", gpuUuid=admitted["gpuUuid"],
                                bytes=8 * GiB)
        assert (await h.reply(r4))["reason"] == "not-admitted-here"
        assert len(h.books.running) == 1
        w3.close()
    finally:
        w.close()
        await successor.close()
        await h.server.close()


@pytest.mark.asyncio
async def test_a_progress_flood_is_dropped_before_parsing_and_others_are_still_admitted(tmp_path, monkeypatch) -> None:
    """Finding: every progress line was parsed and logged before the rate limit (464,000 lines slowed everyone's
    admission). With the clock standing still, a flood of N lines is parsed at most ``PROGRESS_BURST`` times, logged
    once, and another pod is admitted while the flood is still being written."""
    parsed = []
    real = gate_module.parse_progress

    def counting(line: bytes):
        parsed.append(line)
        return real(line)

    monkeypatch.setattr(gate_module, "parse_progress", counting)
    h = Harness(tmp_path, wall=lambda: 1_000_000.0)
    await h.server.start(tmp_path / "gate.sock")
    flooder, job = job_pod("flood", 4 * GiB)
    other, job2 = job_pod("other", 4 * GiB)
    add_pods(h.pods_file, [flooder, other], [job, job2])
    lines = 200_000
    script = (
        "import json, socket, sys\n"
        "s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n"
        "m = json.loads(sys.argv[2]); s.sendall((json.dumps(m) + '\\n').encode())\n"
        "f = s.makefile('rb'); assert b'admitted' in f.readline(), 'not admitted'\n"
        "sys.stdout.write('admitted\\n'); sys.stdout.flush()\n"
        "bad = b'{\"op\": \"progress\", \"steps\": 5, \"total\": 1, \"seconds\": 1}\\n'\n"
        f"s.sendall(bad * {lines})\n"
        "sys.stdin.readline()\n"
    )
    fm = flooder["metadata"]
    req = json.dumps({"op": "admit", "podUid": fm["uid"], "podName": fm["name"], "podNamespace": fm["namespace"]})
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, str(tmp_path / "gate.sock"), req, fm["uid"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        assert (await asyncio.wait_for(proc.stdout.readline(), 20)) == b"admitted\n"
        await asyncio.sleep(0.05)  # the flood is under way
        h.peers.me = other["metadata"]["uid"]
        r, w = await h.request(other)
        assert (await h.reply(r, "admitted"))["status"] == "admitted"
        def consumed() -> int:  # lines the gate has read from the flood (parsed, or dropped unread)
            return len(parsed) + getattr(h.server, "progress_dropped", 0)

        seen_at_admission = consumed()
        for _ in range(3000):
            if consumed() >= lines:
                break
            await asyncio.sleep(0.01)
        assert consumed() == lines
        assert seen_at_admission < lines  # served in the middle of the flood, not after it
        assert len(parsed) <= 2, f"{len(parsed)} of {lines} flood lines were parsed"
        assert len(h.events("progress-rejected")) + len(h.events("progress-flood")) == 1  # logged once
        dropped = h.metrics.registry.get_sample_value("gnnsched_gate_progress_lines_total", {"result": "dropped"})
        assert dropped == lines - len(parsed)
        w.close()
    finally:
        proc.stdin.write(b"\n")
        await proc.stdin.drain()
        await proc.wait()
        await h.server.close()


@pytest.mark.asyncio
async def test_connections_per_pod_are_capped(h: Harness) -> None:
    """Finding: connections per pod were not capped. Idle connections count from the moment they open (the peer's
    cgroup names the pod), so the one past the cap is refused at once, with the flag that sets it; another pod is
    not affected, and a closed connection frees its place."""
    pod, job = job_pod("many", GiB)
    other, job2 = job_pod("calm", GiB)
    add_pods(h.pods_file, [pod, other], [job, job2])
    h.peers.me = pod["metadata"]["uid"]
    held = [await asyncio.open_unix_connection(str(h.tmp / "gate.sock")) for _ in range(MAX_CONNECTIONS_PER_POD)]
    await asyncio.sleep(0.1)
    r, w = await h.request(pod)
    msg = await h.reply(r)
    assert msg["reason"] == "too-many-connections" and "--max-gate-connections-per-pod" in msg["message"]
    w.close()
    h.peers.me = other["metadata"]["uid"]
    r2, w2 = await h.request(other)
    assert (await h.reply(r2, "admitted"))["status"] == "admitted"
    w2.close()
    held[0][1].close()
    await asyncio.sleep(0.1)
    h.peers.me = pod["metadata"]["uid"]
    r3, w3 = await h.request(pod)
    assert (await h.reply(r3, "admitted"))["status"] == "admitted"
    w3.close()
    for _, hw in held[1:]:
        hw.close()
