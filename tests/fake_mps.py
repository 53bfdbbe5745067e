"""Start-up and tear-down shared by the tests that run a node agent (or an MPS manager) over the fake
``nvidia-cuda-mps-control``.

Why a helper: the fake's ``-d`` starts a detached "daemon" (``tests/fakes/nvidia-cuda-mps-control``) that is not a
child of the agent, so stopping the agent leaves it running; every such test must also kill it by the pid the fake
writes into the pipe directory, and an agent that ignores SIGTERM must not hang the test's tear-down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

PID_FILE = "fake-mps.pid"


def kill_fake_mps(pipe: Path) -> None:
    """SIGKILL the fake MPS daemon whose pid is in ``pipe``; nothing when none was started or it is gone."""
    pid_file = pipe / PID_FILE
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def stop_agent(agent: subprocess.Popen[bytes] | subprocess.Popen[str] | None, pipe: Path,
               timeout: float = 10.0) -> None:
    """SIGTERM a running agent process (SIGKILL after ``timeout`` s), then kill the fake MPS daemon it started."""
    if agent is not None and agent.poll() is None:
        agent.send_signal(signal.SIGTERM)
        try:
            agent.wait(timeout)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
    kill_fake_mps(pipe)


def start_agent(cmd: list[str], env: dict[str, str], cwd: Path, sock: Path, log: Path, pipe: Path,
                timeout: float = 30.0) -> subprocess.Popen[bytes]:
    """Start a node agent (stderr appended to ``log``) and wait until its gate socket exists. When it exits first or
    the socket does not appear within ``timeout`` s, it is stopped (with the fake MPS daemon in ``pipe``) and the
    test fails with the agent's log."""
    with log.open("a") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stderr=out)
    deadline = time.monotonic() + timeout
    try:
        while not sock.exists():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, f"agent did not start: {log.read_text()}"
            time.sleep(0.05)
    except BaseException:
        stop_agent(proc, pipe)
        raise
    return proc
