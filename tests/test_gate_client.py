"""The gate client's reconnect logic against the kernel's real unix-socket behaviour around a dying agent.

When an agent is SIGKILLed the kernel releases its descriptors one at a time (highest first), so a waiting client
sees EOF on its connection while the dead agent's listening socket still accepts: the client's immediate reconnect
lands in that listener's backlog and is reset when the listener goes a moment later. A request sent in between
fails with EPIPE. These tests put the client exactly in that window (deterministically, by closing the listener
right after ``connect()`` returns) and check it goes on to the next agent instead of dying.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gnnsched.portable import gate as gate_client
from gnnsched.portable.gate import PodIdentity, _resume_reply, wait_admission

pytestmark = pytest.mark.timeout(30)

IDENT = PodIdentity("0b0e8a6e-5d1c-4a53-9f0a-1f7c2c5d9a10", "p", "default")
ADMITTED = {
    "status": "admitted",
    "gpuUuid": "GPU-1",
    "gpuIndex": 0,
    "bytes": 1 << 30,
    "memLimit": "0=1024M",
    "activeThreadPercentage": 100,
    "pipeDirectory": "/tmp/mps",
    "group": "g1",
    "admittedAt": "2026-01-01T00:00:00Z",
}


class Successor:
    """The restarted agent: answers each of ``clients`` admit requests with ``replies``; records the requests."""

    def __init__(self, path: Path, replies: list[dict], clients: int = 1) -> None:
        self.replies = replies
        self.requests: list[dict] = []
        self.conns: list[socket.socket] = []
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(64)
        self.thread = threading.Thread(target=self._serve, args=(clients,), daemon=True)
        self.thread.start()

    def _serve(self, clients: int) -> None:
        for _ in range(clients):
            conn, _ = self.listener.accept()
            self.conns.append(conn)
            self.requests.append(json.loads(conn.makefile("rb").readline()))
            for r in self.replies:
                conn.sendall(json.dumps(r).encode() + b"\n")

    def close(self) -> None:
        self.listener.close()
        for c in self.conns:
            c.close()


def test_reconnect_into_a_dying_listener_goes_on_to_the_next_agent(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "gate.sock"
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(path))
    dying.listen(8)
    real_connect = gate_client._connect
    successor: list[Successor] = []

    def connect_then_agent_dies(p: str, deadline: float) -> socket.socket | None:
        s = real_connect(p, deadline)
        if not successor:
            # connect() returned: we sit in the dying agent's backlog. Now its listener goes (the kernel's
            # teardown of the killed agent) and the next agent starts on the same path.
            dying.close()
            path.unlink()
            successor.append(Successor(path, [{"status": "queued", "position": 1}, ADMITTED]))
        return s

    monkeypatch.setattr(gate_client, "_connect", connect_then_agent_dies)
    try:
        sock, msg = wait_admission(IDENT, str(path), wait_seconds=10)
        sock.close()
        assert msg == ADMITTED
        assert [r["op"] for r in successor[0].requests] == ["admit"]
        assert successor[0].requests[0]["podUid"] == IDENT.uid
    finally:
        for s in successor:
            s.close()


def test_the_failed_send_really_is_epipe(tmp_path: Path) -> None:
    """The kernel behaviour the client must survive (if this changes, the test above no longer covers it)."""
    path = tmp_path / "gate.sock"
    dying = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dying.bind(str(path))
    dying.listen(8)
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect(str(path))
    dying.close()
    with pytest.raises(BrokenPipeError):
        c.sendall(IDENT.request("admit"))
    c.close()


def test_killed_agent_with_waiting_clients_real_processes(tmp_path: Path) -> None:
    """A real agent-like process holding a listener (low fd) and queued connections (higher fds) is SIGKILLed;
    every waiting ``wait_admission`` must reach the successor. Repeated, because the window is a race."""
    path = tmp_path / "gate.sock"
    agent = r"""
import json, os, socket, sys, time
l = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); l.bind(sys.argv[1]); l.listen(64)
print("up", flush=True)
conns = []
for _ in range(int(sys.argv[2])):
    c, _ = l.accept(); c.makefile("rb").readline(); c.sendall(b'{"status": "queued", "position": 1}\n'); conns.append(c)
print("queued", flush=True)
time.sleep(3600)
"""
    clients = 4
    for _round in range(5):
        proc = subprocess.Popen([sys.executable, "-S", "-c", agent, str(path), str(clients)], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"
        results: list[dict | BaseException] = []

        def wait(out: list[dict | BaseException] = results) -> None:
            try:
                s, m = wait_admission(IDENT, str(path), wait_seconds=20)
                s.close()
                out.append(m)
            except BaseException as exc:  # noqa: BLE001 - the failure is the assertion below
                out.append(exc)

        threads = [threading.Thread(target=wait, daemon=True) for _ in range(clients)]
        for t in threads:
            t.start()
        assert proc.stdout.readline() == "queued\n"
        proc.kill()
        proc.wait(10)
        proc.stdout.close()
        path.unlink()
        successor = Successor(path, [ADMITTED], clients)
        try:
            for t in threads:
                t.join(15)
            assert results == [ADMITTED] * clients
            assert len(successor.requests) == clients
        finally:
            successor.close()
            path.unlink()


def _sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-S", "-c", f"import time; time.sleep({seconds})"])


def test_resume_waits_for_a_slow_agent_and_stops_when_the_workload_ends() -> None:
    workload = _sleeper(30)
    pidfd = os.pidfd_open(workload.pid)
    try:
        mine, agent = socket.socketpair()
        threading.Timer(0.5, lambda: agent.sendall(b'{"status": "resumed"}\n')).start()
        assert _resume_reply(mine, b'{"op": "resume"}\n', pidfd, workload.pid) == (True, {"status": "resumed"})
        assert agent.recv(100) == b'{"op": "resume"}\n'
        mine.close()
        agent.close()

        mine, agent = socket.socketpair()
        agent.close()  # the agent died before answering: retry elsewhere
        assert _resume_reply(mine, b'{"op": "resume"}\n', pidfd, workload.pid) == (True, None)
        mine.close()
    finally:
        workload.kill()
        workload.wait()
        os.close(pidfd)
    workload = _sleeper(0.3)
    pidfd = os.pidfd_open(workload.pid)
    try:
        mine, agent = socket.socketpair()  # an agent that never answers
        t0 = time.monotonic()
        assert _resume_reply(mine, b'{"op": "resume"}\n', pidfd, workload.pid) == (False, None)
        assert time.monotonic() - t0 < 10
        mine.close()
        agent.close()
    finally:
        workload.wait()
        os.close(pidfd)
