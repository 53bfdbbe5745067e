"""``gnnsched gate -- CMD [ARGS]``: wait at the node agent's gate, then become the workload.

The operator puts this in front of every job's command. It tells the agent which pod it is (downward-API env), waits
(reconnecting if the agent restarts) until its group is admitted, then forks a tiny *keeper* and ``exec``s the
command in place — same pid, so the workload still receives the container's signals — with ``CUDA_VISIBLE_DEVICES``
(the admitted GPU's UUID), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
``CUDA_MPS_PIPE_DIRECTORY`` set.

The keeper holds the gate connection for as long as the workload lives (it watches the workload's pid through a
pidfd, so it does not poll): the connection's end is the agent's release signal. If the agent restarts, the keeper
reconnects and re-books the running workload (``resume``), so the new agent rebuilds its books from the live clients.
With ``--prestart`` (``gnnsched gate --prestart -- gnnsched worker ...``, the built-in worker only) the order is
turned around so that the wait at the gate overlaps the workload's CPU-side start-up: the gate connects and asks for
admission from its own pid (so the agent books the workload's pid, as before), forks the keeper, which waits on that
connection, and ``exec``s the workload at once with ``CUDA_VISIBLE_DEVICES`` empty. Once admitted, the keeper writes
the admission's environment on a pipe (``gnnsched.gate_handoff``) that the worker reads after its imports, graph and
model are ready and before it touches a GPU; then the keeper holds the connection as above. The keeper watches the
workload from the first moment: a workload that exits while still queued closes the connection, which cancels its
place in the queue; an agent restart before admission is answered by reconnecting (from the keeper) as the plain
gate does.
Nothing here is imported by ``gnnsched --help``.

Portable: standard library only (no torch, no pydantic), so the operator's init container can copy it into a GPU pod
whose image has no gnnsched (``operator/gpu_pod_tools.py``), where it runs as ``gate_launch.py`` (:func:`main`, the
flags of ``gnnsched gate``). ``gnnsched gate`` (``node_agent/cli.py``) runs the same functions.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

# The contract's names (``gnnsched.contract``), spelled out: this module is copied into the user's image, where no
# gnnsched is importable. ``tests/test_portable_gpu_pod.py`` checks each equals the contract's.
DEFAULT_GATE_SOCKET = "/var/run/gnnsched/gate.sock"
ENV_ADMITTED_AT = "GNNSCHED_ADMITTED_AT"
ENV_GATE_HANDOFF_FD = "GNNSCHED_GATE_HANDOFF_FD"
ENV_GATE_SOCKET = "GNNSCHED_GATE_SOCKET"
ENV_POD_NAME = "GNNSCHED_POD_NAME"
ENV_POD_NAMESPACE = "GNNSCHED_POD_NAMESPACE"
ENV_POD_UID = "GNNSCHED_POD_UID"
ENV_PROGRESS_FD = "GNNSCHED_PROGRESS_FD"
NVML_CHECK_ENV = "PYTORCH_NVML_BASED_CUDA_CHECK"
"""torch's switch that makes ``torch.cuda.is_available()`` ask NVML instead of initialising the CUDA driver
(``gnnsched.gate_handoff.NVML_CHECK_ENV``)."""

EXIT_USAGE = 2
EXIT_REJECTED = 3
EXIT_NO_AGENT = 4
EXIT_EXEC_FAILED = 127

_FIRST_DELAY = 0.05  # seconds between reconnect attempts: doubling from this ...
_MAX_DELAY = 1.0  # ... up to this
_MAX_REPLY = 64 * 1024  # bytes: no agent reply is anywhere near this
_PROGRESS_INTERVAL = 5.0  # seconds: the most often progress is forwarded (gnnsched.progress.REPORT_INTERVAL_S)
_MAX_PROGRESS_LINE = 1024  # bytes: a progress line is ~60; a longer one is dropped unread


class GateUsageError(Exception):
    """Missing/bad input to the gate client; the message names the field."""


class NotAdmitted(Exception):
    """The wait ended without an admission: rejected, or no agent answered in time. ``code`` is the exit status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WorkloadGone(Exception):
    """The workload the keeper waits for (``--prestart``) exited before its admission."""


@dataclass(frozen=True)
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


def _connect(path: str, deadline: float, gone: Callable[[float], bool] | None = None) -> socket.socket | None:
    """Connect, retrying while the agent is absent (restarting) until ``deadline``. ``gone(timeout)``: waits up to
    ``timeout`` seconds for the workload to exit and says whether it did (``--prestart``); then
    :class:`WorkloadGone`."""
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
            if gone is not None:
                if gone(delay):
                    raise WorkloadGone() from None
            else:
                time.sleep(delay)
            delay = min(_MAX_DELAY, delay * 2)


class _Lines:
    """Newline-delimited JSON objects from the agent; with ``gone`` (``--prestart``), waiting also watches the
    workload and raises :class:`WorkloadGone` when it exits."""

    def __init__(self, sock: socket.socket, watch: int | None, gone: Callable[[float], bool] | None) -> None:
        self.sock = sock
        self.watch = watch  # a pidfd on the workload, or None (then ``gone`` is polled)
        self.gone = gone
        self.buf = b""

    def next(self) -> dict | None:
        """One JSON object line, or ``None`` when the connection ended, broke (reset) or sent garbage."""
        while b"\n" not in self.buf:
            if self.gone is not None:
                if self.watch is not None:
                    ready, _, _ = select.select([self.sock.fileno(), self.watch], [], [])
                    if self.watch in ready:
                        raise WorkloadGone()
                else:
                    ready, _, _ = select.select([self.sock.fileno()], [], [], 0.5)
                    if not ready:
                        if self.gone(0):
                            raise WorkloadGone()
                        continue
            try:
                chunk = self.sock.recv(4096)
            except OSError:
                return None
            if not chunk or len(self.buf) + len(chunk) > _MAX_REPLY:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        return msg if isinstance(msg, dict) else None


def wait_admission(ident: PodIdentity, path: str, wait_seconds: float) -> tuple[socket.socket, dict]:
    """Block until admitted; returns the connection (still open) and the admission reply. A rejection, or
    ``wait_seconds`` without any agent answering, is logged and exits the process (see :func:`wait_for_admission`)."""
    try:
        return wait_for_admission(ident, path, wait_seconds)
    except NotAdmitted as exc:
        _log(str(exc))
        sys.exit(exc.code)


def wait_for_admission(
    ident: PodIdentity,
    path: str,
    wait_seconds: float,
    first: socket.socket | None = None,
    watch: int | None = None,
    gone: Callable[[float], bool] | None = None,
) -> tuple[socket.socket, dict]:
    """Block until admitted; returns the connection (still open) and the admission reply.

    Every way a connection can fail before the admission — refused, reset, broken pipe, EOF — means the agent went
    away, and the answer is always the same: back off and ask the next agent. That includes failures right after a
    successful ``connect()``: when an agent is killed, the kernel closes its descriptors one by one (highest first),
    so our end of the old connection can see EOF while the dying agent's *listening* socket still accepts; an
    immediate reconnect then lands in that listener's backlog and is reset a moment later, and the request we send
    on it fails with ``EPIPE`` (or the read with ``ECONNRESET``). Only a rejection, or ``wait_seconds`` without any
    agent answering, ends the wait: :class:`NotAdmitted`.

    ``first``: a connection already made (the ``--prestart`` gate connects from the workload's pid before it forks
    the keeper that waits here); ``watch``/``gone``: the workload to watch while waiting (a pidfd, and a function
    that waits for its exit up to a timeout); its exit raises :class:`WorkloadGone`.
    """
    deadline = time.monotonic() + wait_seconds
    announced = False
    pause = 0.0  # before the next connect: grows while connections die unanswered, reset by any answer
    while True:
        if pause:
            if gone is not None:
                if gone(pause):
                    raise WorkloadGone()
            else:
                time.sleep(pause)
        if first is not None:
            sock: socket.socket | None = first
        else:
            sock = _connect(path, deadline, gone) if gone is not None else _connect(path, deadline)
        first = None
        if sock is None:
            raise NotAdmitted(EXIT_NO_AGENT, f"no node agent at {path} after {wait_seconds:.0f} s")
        pause = min(_MAX_DELAY, max(_FIRST_DELAY, pause * 2))
        try:
            sock.sendall(ident.request("admit"))
        except OSError:  # connected to a dying agent (see above): ask the next one
            sock.close()
            continue
        lines = _Lines(sock, watch, gone)
        while True:
            try:
                msg = lines.next()
            except WorkloadGone:
                sock.close()
                raise
            if msg is None:  # the agent went away while we waited: ask the next one
                sock.close()
                break
            deadline = time.monotonic() + wait_seconds  # an agent answered: the wait limit starts again
            pause = _FIRST_DELAY
            status = msg.get("status")
            if status == "queued" and not announced:
                _log(f"queued at position {msg.get('position')}")
                announced = True
            elif status == "rejected":
                sock.close()
                raise NotAdmitted(EXIT_REJECTED, f"rejected ({msg.get('reason')}): {msg.get('message')}")
            elif status == "admitted":
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


def _parent_exited(pidfd: int | None, ppid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` for the workload (our parent) to exit: its pidfd becoming readable where Linux gives one,
    else our parent pid changing after the sleep (we were re-parented)."""
    if pidfd is not None:
        r, _, _ = select.select([pidfd], [], [], timeout)
        return bool(r)
    time.sleep(timeout)
    return os.getppid() != ppid


class _ProgressRelay:
    """The keeper's side of the workload's progress pipe (``$GNNSCHED_PROGRESS_FD``): keeps the newest complete line
    the workload wrote and forwards it on the gate connection at most every ``_PROGRESS_INTERVAL`` seconds, re-written
    from its three numbers (``steps``, ``total``, ``seconds``) so that nothing else the workload writes reaches the
    agent. The agent validates it (``node_agent.protocol.ProgressReport``)."""

    def __init__(self, fd: int | None, interval: float = _PROGRESS_INTERVAL) -> None:
        self.fd = fd
        self.interval = interval
        self.buf = b""
        self.pending: bytes | None = None
        self.sent_at: float | None = None

    def read(self) -> None:
        """The pipe is readable: take what is there (EOF: the workload closed it; stop watching)."""
        assert self.fd is not None
        try:
            chunk = os.read(self.fd, 4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            os.close(self.fd)
            self.fd = None
            return
        self.buf += chunk
        *lines, self.buf = self.buf.split(b"\n")
        if len(self.buf) > _MAX_PROGRESS_LINE:
            self.buf = b""
        for line in reversed(lines):
            msg = _progress_line(line)
            if msg is not None:
                self.pending = msg
                return

    def timeout(self) -> float | None:
        """Seconds until the pending line may go out; None when nothing is pending."""
        if self.pending is None:
            return None
        if self.sent_at is None:
            return 0.0
        return max(0.0, self.sent_at + self.interval - time.monotonic())

    def flush(self, sock: socket.socket) -> None:
        """Send the pending line if it is due (a failed send is left to the connection's own EOF handling)."""
        if self.pending is None or (self.timeout() or 0.0) > 0:
            return
        try:
            sock.sendall(self.pending)
        except OSError:
            return
        self.pending = None
        self.sent_at = time.monotonic()


def _progress_line(line: bytes) -> bytes | None:
    """A workload's progress line as the gate's ``progress`` request, or None when it is not one."""
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    if not isinstance(msg, dict):
        return None
    steps, total, seconds = msg.get("steps"), msg.get("total"), msg.get("seconds")
    if not (isinstance(steps, int) and isinstance(total, int) and isinstance(seconds, (int, float))):
        return None
    if isinstance(steps, bool) or isinstance(total, bool):
        return None
    return json.dumps({"op": "progress", "steps": steps, "total": total, "seconds": seconds}).encode() + b"\n"


def progress_pipe() -> tuple[int, int]:
    """The workload's progress pipe: (read end for the keeper, write end the workload inherits). The read end is
    non-blocking so a select that wakes spuriously cannot stall the keeper."""
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    return read_end, write_end


def keeper(sock: socket.socket, ppid: int, ident: PodIdentity, admitted: dict, path: str,
           progress_fd: int | None = None) -> None:
    """Hold the gate connection while the workload (our parent, by pid) lives; re-book after agent restarts; forward
    the workload's progress (``progress_fd``, :class:`_ProgressRelay`)."""
    pidfd, gone = _parent_gone_waiter(ppid)
    if gone:
        return
    relay = _ProgressRelay(progress_fd)

    def parent_alive(timeout: float) -> bool:
        return not _parent_exited(pidfd, ppid, timeout)

    resume = ident.request(
        "resume", gpuUuid=admitted["gpuUuid"], bytes=admitted["bytes"], group=admitted.get("group"),
        admittedAt=admitted.get("admittedAt"),
    )
    while True:
        watch = [sock] + ([pidfd] if pidfd is not None else []) + ([relay.fd] if relay.fd is not None else [])
        wait = relay.timeout()
        if pidfd is None:
            wait = 0.5 if wait is None else min(wait, 0.5)
        r, _, _ = select.select(watch, [], [], wait)
        if relay.fd is not None and relay.fd in r:  # before the exit check: a short job's only report goes out
            relay.read()
        relay.flush(sock)
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


def run(cmd: list[str], socket_path: str | None, wait_seconds: float, container: str = "",
        prestart: bool = False) -> NoReturn:
    """The whole client: identify, wait, fork the keeper, exec the workload (``prestart``: exec first, see the
    module's docstring)."""
    if not cmd:
        raise GateUsageError("COMMAND: missing (usage: gnnsched gate -- CMD [ARGS])")
    env = dict(os.environ)
    ident = PodIdentity.from_env(env, container)
    path = socket_path or env.get(ENV_GATE_SOCKET) or DEFAULT_GATE_SOCKET
    if prestart:
        _run_prestart(cmd, env, ident, path, wait_seconds)
    sock, admitted = wait_admission(ident, path, wait_seconds)
    progress_read, progress_write = progress_pipe()
    me = os.getpid()
    _fork_keeper((progress_write,), lambda: keeper(sock, me, ident, admitted, path, progress_read))
    sock.close()  # the keeper's copy keeps the connection open
    os.close(progress_read)
    os.set_inheritable(progress_write, True)
    _exec(cmd, {**workload_env(env, admitted), ENV_PROGRESS_FD: str(progress_write)})


def _fork_keeper(close: tuple[int, ...], keep: Callable[[], None]) -> None:
    """Fork the keeper, which runs ``keep`` and exits, with the workload's ends ``close`` closed and stdin/stdout on
    /dev/null (stderr stays: its log lines reach the container's log); the caller goes on to exec the workload."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.fork() == 0:
        try:
            for fd in close:
                os.close(fd)
            devnull = os.open(os.devnull, os.O_RDWR)
            os.dup2(devnull, 0)
            os.dup2(devnull, 1)
            keep()
        finally:
            os._exit(0)


def _exec(cmd: list[str], env: dict[str, str]) -> NoReturn:
    try:
        os.execvpe(cmd[0], cmd, env)
    except OSError as exc:
        _log(f"cannot run {cmd[0]!r}: {exc}")
        os._exit(EXIT_EXEC_FAILED)


def prestart_env(env: dict[str, str], handoff_fd: int) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """The workload's environment until its admission, and what the hand-off must restore and remove afterwards.

    Until admitted it sees no GPU (``CUDA_VISIBLE_DEVICES`` empty) and ``torch.cuda.is_available()`` asks NVML
    instead of initialising the CUDA driver (``PYTORCH_NVML_BASED_CUDA_CHECK=1``): a library that probes CUDA at import
    neither reaches a GPU nor fixes the driver's device list before the admitted one is set."""
    before = dict(env)
    before[ENV_GATE_HANDOFF_FD] = str(handoff_fd)
    before["CUDA_VISIBLE_DEVICES"] = ""
    before[NVML_CHECK_ENV] = "1"
    restore = {NVML_CHECK_ENV: env[NVML_CHECK_ENV]} if NVML_CHECK_ENV in env else {}
    unset = [] if NVML_CHECK_ENV in env else [NVML_CHECK_ENV]
    return before, restore, unset


def _run_prestart(cmd: list[str], env: dict[str, str], ident: PodIdentity, path: str, wait_seconds: float) -> NoReturn:
    """``--prestart``: connect (from this pid, which becomes the workload's), fork the keeper that waits for the
    admission and hands it over, exec the workload now."""
    sock = _connect(path, time.monotonic() + wait_seconds)
    if sock is None:
        _log(f"no node agent at {path} after {wait_seconds:.0f} s")
        sys.exit(EXIT_NO_AGENT)
    read_end, write_end = os.pipe()
    progress_read, progress_write = progress_pipe()
    before, restore, unset = prestart_env(env, read_end)
    before[ENV_PROGRESS_FD] = str(progress_write)
    me = os.getpid()
    _fork_keeper((read_end, progress_write), lambda: _prestart_keeper(sock, write_end, me, ident, path, wait_seconds,
                                                                     restore, unset, progress_read))
    os.close(write_end)
    os.close(progress_read)
    sock.close()  # the keeper's copy keeps the connection (and the queue place) open
    os.set_inheritable(read_end, True)
    os.set_inheritable(progress_write, True)
    _exec(cmd, before)


def _prestart_keeper(sock: socket.socket, handoff: int, ppid: int, ident: PodIdentity, path: str,
                     wait_seconds: float, restore: dict[str, str], unset: list[str],
                     progress_fd: int | None = None) -> None:
    """Wait at the gate for the workload (our parent), hand the admission over on ``handoff``, then keep it."""
    pidfd, gone_now = _parent_gone_waiter(ppid)
    if gone_now:
        return

    def gone(timeout: float) -> bool:
        return _parent_exited(pidfd, ppid, timeout)

    try:
        sock, admitted = wait_for_admission(ident, path, wait_seconds, first=sock, watch=pidfd, gone=gone)
    except WorkloadGone:  # closing the connection (on exit) takes it out of the queue
        return
    except NotAdmitted as exc:
        _log(str(exc))
        status = "rejected" if exc.code == EXIT_REJECTED else "no-agent"
        _write_all(handoff, handoff_line(status, exit_code=exc.code, message=f"gnnsched gate: {exc}"))
        return
    message = handoff_line("admitted", env={**workload_env({}, admitted), **restore}, unset=unset)
    if not _write_all(handoff, message):
        return  # the workload is gone (nobody reads): closing the connection releases the admission
    os.close(handoff)
    if pidfd is not None:
        os.close(pidfd)
    keeper(sock, ppid, ident, admitted, path, progress_fd)


def handoff_line(status: str, env: dict[str, str] | None = None, unset: list[str] | None = None, exit_code: int = 0,
                 message: str = "") -> bytes:
    """The keeper's one line to a prestarted workload, in ``gnnsched.gate_handoff.Handoff``'s wire form (written here
    with ``json`` because this module runs where pydantic is not installed; the test suite parses it with the
    model)."""
    body = {"status": status, "env": dict(env or {}), "unset": list(unset or []), "exit_code": exit_code,
            "message": message}
    return json.dumps(body, separators=(",", ":")).encode() + b"\n"


def _write_all(fd: int, data: bytes) -> bool:
    try:
        while data:
            data = data[os.write(fd, data):]
    except OSError:
        return False
    return True


DEFAULT_WAIT_SECONDS = 7 * 24 * 3600.0
"""``--wait-seconds``: give up (exit 4) when no agent answers for this long (``gnnsched gate``'s default)."""


def main(argv: list[str] | None = None) -> int:
    """The gate as the GPU pod runs it from the operator's volume (``gate_launch.py``), with the flags of
    ``gnnsched gate``: ``[--socket PATH] [--wait-seconds S] [--container NAME] [--prestart] -- CMD [ARGS]``. It
    returns only on bad input (exit 2); otherwise it becomes the workload or exits with the gate's status."""
    import argparse

    args = list(sys.argv[1:] if argv is None else argv)
    cmd: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, cmd = args[:cut], args[cut + 1:]
    parser = argparse.ArgumentParser(prog="gate", description="Wait at the node agent's gate, then exec CMD.")
    parser.add_argument("--socket", dest="socket_path", default=None)
    parser.add_argument("--wait-seconds", type=float, default=DEFAULT_WAIT_SECONDS)
    parser.add_argument("--container", default="")
    parser.add_argument("--prestart", action="store_true")
    opts = parser.parse_args(args)
    try:
        run(cmd, opts.socket_path, opts.wait_seconds, opts.container, opts.prestart)
    except GateUsageError as exc:
        _log(str(exc))
        return EXIT_USAGE
    except OSError as exc:  # say what broke rather than a traceback
        _log(str(exc))
        return EXIT_NO_AGENT
