"""``gnnsched gate -- CMD [ARGS]``: wait at the node agent's gate, then become the workload.

The operator puts this in front of every job's command. It tells the agent which pod it is (downward-API env), waits
(reconnecting if the agent restarts) until its group is admitted, then forks a tiny *keeper* and ``exec``s the
command in place — same pid, so the workload still receives the container's signals — with ``CUDA_VISIBLE_DEVICES``
(the admitted GPU's UUID), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PIPE_DIRECTORY`` set.

The keeper holds the gate connection for as long as the workload lives (it watches the workload's pid through a
pidfd, so it does not poll): the connection's end is the agent's release signal. If the agent restarts, the keeper
reconnects and re-books the running workload (``resume``), so the new agent rebuilds its books from the live clients.
Nothing here is imported by ``gnnsched --help``.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
from dataclasses import dataclass
from typing import NoReturn

from gnnsched.contract import (
    DEFAULT_GATE_SOCKET,
    ENV_ADMITTED_AT,
    ENV_GATE_SOCKET,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
)

EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_NO_AGENT = 4
EXIT_EXEC_FAILED = 127

_FIRST_DELAY = 0.05  # seconds between reconnect attempts: doubling from this ...
_MAX_DELAY = 1.0  # ... up to this
_MAX_REPLY = 64 * 1024  # bytes: no agent reply is anywhere near this


class GateUsageError(Exception):
    """Missing/bad input to the gate client; the message names the field."""


@dataclass(frozen=True, slots=True)
class PodIdentity:
    uid: str
    name: str
    namespace: str
    container: str = ""

    @classmethod
    def from_env(cls, env: dict[str, str], container: str = "") -> PodIdentity:
        missing = [k for k in (ENV_POD_UID, ENV_POD_NAME, ENV_POD_NAMESPACE) if not env.get(k)]
        if missing:
            raise GateUsageError(f"{missing[0]}: not set (the pod's downward API must provide it)")
        return cls(env[ENV_POD_UID], env[ENV_POD_NAME], env[ENV_POD_NAMESPACE], container)

    def request(self, op: str, **extra: object) -> bytes:
        msg = {"op": op, "version": 1, "podUid": self.uid, "podName": self.name, "podNamespace": self.namespace,
               "container": self.container, **extra}
        return json.dumps(msg).encode() + b"\n"


def _log(msg: str) -> None:
    print(f"gnnsched gate: {msg}", file=sys.stderr, flush=True)


def _connect(path: str, deadline: float) -> socket.socket | None:
    """Connect, retrying while the agent is absent (restarting) until ``deadline``."""
    delay = _FIRST_DELAY
    while True:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            return s
        except OSError:
            s.close()
            if time.monotonic() >= deadline:
                return None
            time.sleep(delay)
            delay = min(_MAX_DELAY, delay * 2)


def _read_line(f: object) -> dict | None:
    """One JSON object line, or ``None`` when the connection ended, broke (reset, timeout) or sent garbage."""
    try:
        line = f.readline()  # type: ignore[attr-defined]
    except OSError:
        return None
    if not line:
        return None
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def wait_admission(ident: PodIdentity, path: str, wait_seconds: float) -> tuple[socket.socket, dict]:
    """Block until admitted; returns the connection (still open) and the admission reply.

    Every way a connection can fail before the admission — refused, reset, broken pipe, EOF — means the agent went
    away, and the answer is always the same: back off and ask the next agent. That includes failures right after a
    successful ``connect()``: when an agent is killed, the kernel closes its descriptors one by one (highest first),
    so our end of the old connection can see EOF while the dying agent's *listening* socket still accepts; an
    immediate reconnect then lands in that listener's backlog and is reset a moment later, and the request we send
    on it fails with ``EPIPE`` (or the read with ``ECONNRESET``). Only a rejection, or ``wait_seconds`` without any
    agent answering, ends the wait.
    """
    deadline = time.monotonic() + wait_seconds
    announced = False
    pause = 0.0  # before the next connect: grows while connections die unanswered, reset by any answer
    while True:
        if pause:
            time.sleep(pause)
        sock = _connect(path, deadline)
        if sock is None:
            _log(f"no node agent at {path} after {wait_seconds:.0f} s")
            sys.exit(EXIT_NO_AGENT)
        pause = min(_MAX_DELAY, max(_FIRST_DELAY, pause * 2))
        try:
            sock.sendall(ident.request("admit"))
            f = sock.makefile("rb")
        except OSError:  # connected to a dying agent (see above): ask the next one
            sock.close()
            continue
        while True:
            msg = _read_line(f)
            if msg is None:  # the agent went away while we waited: ask the next one
                f.close()
                sock.close()
                break
            deadline = time.monotonic() + wait_seconds  # an agent answered: the wait limit starts again
            pause = _FIRST_DELAY
            status = msg.get("status")
            if status == "queued" and not announced:
                _log(f"queued at position {msg.get('position')}")
                announced = True
            elif status == "rejected":
                _log(f"rejected ({msg.get('reason')}): {msg.get('message')}")
                sys.exit(EXIT_REJECTED)
            elif status == "admitted":
                f.close()
                return sock, msg


def workload_env(base: dict[str, str], admitted: dict) -> dict[str, str]:
    env = dict(base)
    env["CUDA_VISIBLE_DEVICES"] = str(admitted["gpuUuid"])
    env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = str(admitted["memLimit"])
    env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(admitted["activeThreadPercentage"])
    env["CUDA_MPS_PIPE_DIRECTORY"] = str(admitted["pipeDirectory"])
    env["GNNSCHED_ADMITTED_BYTES"] = str(admitted["bytes"])
    env["GNNSCHED_GROUP"] = str(admitted["group"])
    if admitted.get("admittedAt"):
        env[ENV_ADMITTED_AT] = str(admitted["admittedAt"])
    extra = admitted.get("env")
    if isinstance(extra, dict):  # the agent's extra environment (a fake GPU's limit enforcement, --fake-gpu-memory)
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


def _parent_gone_waiter(ppid: int) -> tuple[int | None, bool]:
    """A pidfd on the workload (readable when it exits), or (None, gone?) where pidfds are unavailable."""
    try:
        return os.pidfd_open(ppid), False
    except ProcessLookupError:
        return None, True
    except (AttributeError, OSError):
        return None, False


def _resume_reply(s: socket.socket, resume: bytes, pidfd: int | None, ppid: int) -> tuple[bool, dict | None]:
    """Send ``resume`` on ``s`` and wait for the agent's one-line answer. Returns (workload still alive, the reply or
    ``None`` if the connection failed first).

    No timeout on purpose: once the agent has read the request it may already have re-booked the workload, and
    closing the connection is the release signal — giving up on a slow (loaded) agent would make it free the bytes
    of a workload that still runs, and admit others into them. A dead agent is seen anyway (EOF or reset), and so
    is the workload's own exit (its pidfd), which is the one reason to stop waiting.
    """
    try:
        s.sendall(resume)
    except OSError:
        return True, None
    buf = b""
    while b"\n" not in buf:
        watch = [s] + ([pidfd] if pidfd is not None else [])
        r, _, _ = select.select(watch, [], [], None if pidfd is not None else 0.5)
        if (pidfd is not None and pidfd in r) or (pidfd is None and os.getppid() != ppid):
            return False, None
        if s in r:
            try:
                chunk = s.recv(4096)
            except OSError:
                return True, None
            if not chunk or len(buf) + len(chunk) > _MAX_REPLY:
                return True, None
            buf += chunk
    try:
        msg = json.loads(buf.split(b"\n", 1)[0])
    except ValueError:
        return True, None
    return True, msg if isinstance(msg, dict) else None


def keeper(sock: socket.socket, ppid: int, ident: PodIdentity, admitted: dict, path: str) -> None:
    """Hold the gate connection while the workload (our parent, by pid) lives; re-book after agent restarts."""
    pidfd, gone = _parent_gone_waiter(ppid)
    if gone:
        return

    def parent_alive(timeout: float) -> bool:
        if pidfd is not None:
            r, _, _ = select.select([pidfd], [], [], timeout)
            return not r
        time.sleep(timeout)
        return os.getppid() == ppid

    resume = ident.request(
        "resume", gpuUuid=admitted["gpuUuid"], bytes=admitted["bytes"], group=admitted.get("group"),
        admittedAt=admitted.get("admittedAt"),
    )
    while True:
        watch = [sock] + ([pidfd] if pidfd is not None else [])
        r, _, _ = select.select(watch, [], [], None if pidfd is not None else 0.5)
        if pidfd is not None and pidfd in r:
            return
        if pidfd is None and os.getppid() != ppid:
            return
        if sock in r:
            try:
                data = sock.recv(4096)
            except OSError:
                data = b""
            if data:
                continue
            sock.close()
            # The agent is gone: re-book with its successor as soon as it listens.
            while True:
                if not parent_alive(0.2):
                    return
                s = _connect(path, time.monotonic())
                if s is None:
                    continue
                alive, msg = _resume_reply(s, resume, pidfd, ppid)
                if not alive:  # the workload ended while we waited: closing is its release
                    s.close()
                    return
                if msg and msg.get("status") == "resumed":
                    sock = s
                    break
                s.close()
                if msg and msg.get("status") == "rejected":
                    _log(f"resume rejected ({msg.get('reason')}): {msg.get('message')}")
                    return
                # no answer (the connection broke: a dying agent, or one still starting): retry


def run(cmd: list[str], socket_path: str | None, wait_seconds: float, container: str = "") -> NoReturn:
    """The whole client: identify, wait, fork the keeper, exec the workload."""
    if not cmd:
        raise GateUsageError("COMMAND: missing (usage: gnnsched gate -- CMD [ARGS])")
    env = dict(os.environ)
    ident = PodIdentity.from_env(env, container)
    path = socket_path or env.get(ENV_GATE_SOCKET) or DEFAULT_GATE_SOCKET
    sock, admitted = wait_admission(ident, path, wait_seconds)
    sys.stdout.flush()
    sys.stderr.flush()
    me = os.getpid()
    child = os.fork()
    if child == 0:
        try:
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            keeper(sock, me, ident, admitted, path)
        finally:
            os._exit(0)
    sock.close()  # the keeper's copy keeps the connection open
    try:
        os.execvpe(cmd[0], cmd, workload_env(env, admitted))
    except OSError as exc:
        _log(f"cannot run {cmd[0]!r}: {exc}")
        os._exit(EXIT_EXEC_FAILED)
