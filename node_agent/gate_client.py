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

from gnnsched.contract import DEFAULT_GATE_SOCKET, ENV_GATE_SOCKET, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_POD_UID

EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_NO_AGENT = 4
EXIT_EXEC_FAILED = 127


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
    delay = 0.05
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
            delay = min(1.0, delay * 2)


def _read_line(f: object) -> dict | None:
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
    """Block until admitted; returns the connection (still open) and the admission reply."""
    deadline = time.monotonic() + wait_seconds
    announced = False
    while True:
        sock = _connect(path, deadline)
        if sock is None:
            _log(f"no node agent at {path} after {wait_seconds:.0f} s")
            sys.exit(EXIT_NO_AGENT)
        sock.sendall(ident.request("admit"))
        f = sock.makefile("rb")
        while True:
            msg = _read_line(f)
            if msg is None:  # the agent went away while we waited: ask the next one
                f.close()
                sock.close()
                break
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
    return env


def _parent_gone_waiter(ppid: int) -> tuple[int | None, bool]:
    """A pidfd on the workload (readable when it exits), or (None, gone?) where pidfds are unavailable."""
    try:
        return os.pidfd_open(ppid), False  # type: ignore[attr-defined]
    except ProcessLookupError:
        return None, True
    except (AttributeError, OSError):
        return None, False


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
                try:
                    s.sendall(resume)
                    s.settimeout(10)
                    msg = _read_line(s.makefile("rb"))
                    s.settimeout(None)
                except OSError:
                    s.close()
                    continue
                if msg and msg.get("status") == "resumed":
                    sock = s
                    break
                s.close()
                if msg and msg.get("status") == "rejected":
                    _log(f"resume rejected ({msg.get('reason')}): {msg.get('message')}")
                    return
                # no answer: the agent may still be starting; retry


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
