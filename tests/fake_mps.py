"""Tear-down shared by the tests that run a node agent (or an MPS manager) over the fake ``nvidia-cuda-mps-control``.

Why a helper: the fake's ``-d`` starts a detached "daemon" (``tests/fakes/nvidia-cuda-mps-control``) that is not a
child of the agent, so stopping the agent leaves it running; every such test must also kill it by the pid the fake
writes into the pipe directory, and an agent that ignores SIGTERM must not hang the test's tear-down.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
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
