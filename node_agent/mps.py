"""One NVIDIA MPS control daemon per node: start, configure, health-probe, restart.

Why the agent owns it: the gate's memory limits (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) are enforced by the MPS
server, and a CUDA client that cannot reach the control daemon silently runs *without* MPS — no limit at all. So the
agent starts the daemon with the node's pipe and log directories, sets its defaults, probes it (``get_server_list``
through the control client, which fails when the daemon is gone), restarts it when it dies, and reports its health;
while it is unhealthy the gate admits nothing new.

Everything goes through the real ``nvidia-cuda-mps-control`` command line (``-d`` to daemonise, commands on stdin),
so the tests drive it with a fake executable on ``PATH`` that records what it receives (``tests/fakes``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("gnnsched.node_agent.mps")

COMPUTE_MODES = {"exclusive": "EXCLUSIVE_PROCESS", "default": "DEFAULT"}


class MPSError(Exception):
    """A control command failed; the message says which and why (one line)."""


@dataclass(slots=True)
class MPSConfig:
    pipe_directory: Path
    log_directory: Path
    binary: str = "nvidia-cuda-mps-control"
    nvidia_smi: str = "nvidia-smi"
    devices: list[int] = field(default_factory=list)
    compute_mode: str | None = None  # "exclusive" | "default" | None (leave as is)
    default_active_thread_percentage: int | None = None
    default_pinned_mem_limit: str | None = None  # e.g. "78G", applied to every device
    command_timeout: float = 10.0
    start_timeout: float = 10.0


class MPSManager:
    """Thread-safe: the agent probes from a background thread while the status publisher reads the health."""

    def __init__(self, config: MPSConfig) -> None:
        self.config = config
        self.healthy = False
        self.restarts = 0
        self.message = "not started"
        self._lock = threading.Lock()
        self._started_once = False

    # --- plumbing ---------------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["CUDA_MPS_PIPE_DIRECTORY"] = str(self.config.pipe_directory)
        env["CUDA_MPS_LOG_DIRECTORY"] = str(self.config.log_directory)
        return env

    def _run(self, argv: list[str], stdin: str | None = None) -> str:
        exe = shutil.which(argv[0], path=self.env().get("PATH"))
        if exe is None:
            raise MPSError(f"{argv[0]} not found on PATH")
        try:
            cp = subprocess.run(
                [exe, *argv[1:]], input=stdin, capture_output=True, text=True, env=self.env(),
                timeout=self.config.command_timeout,
            )
        except subprocess.TimeoutExpired:
            raise MPSError(f"{' '.join(argv)}: no answer in {self.config.command_timeout:.0f} s") from None
        if cp.returncode != 0:
            detail = (cp.stderr or cp.stdout).strip().splitlines()
            raise MPSError(f"{' '.join(argv)} {stdin.strip() if stdin else ''}".strip()
                           + f": exit {cp.returncode}" + (f": {detail[-1]}" if detail else ""))
        return cp.stdout

    def control(self, command: str) -> str:
        """Send one command to the running daemon through the control client."""
        return self._run([self.config.binary], stdin=command + "\n")

    # --- lifecycle --------------------------------------------------------------------------------------------

    def probe(self) -> bool:
        """Is the control daemon up and answering? (``get_server_list`` fails when it is not.)"""
        try:
            self.control("get_server_list")
            return True
        except MPSError:
            return False

    def start(self) -> None:
        """Start (or adopt an already running) daemon and apply the configured defaults. Raises ``MPSError``."""
        c = self.config
        c.pipe_directory.mkdir(parents=True, exist_ok=True)
        c.log_directory.mkdir(parents=True, exist_ok=True)
        if c.compute_mode:
            mode = COMPUTE_MODES[c.compute_mode]
            for idx in c.devices:
                self._run([c.nvidia_smi, "-i", str(idx), "-c", mode])
        if not self.probe():
            self._run([c.binary, "-d"])
            deadline = time.monotonic() + c.start_timeout
            while not self.probe():
                if time.monotonic() > deadline:
                    raise MPSError(f"MPS control daemon did not answer within {c.start_timeout:.0f} s of starting")
                time.sleep(0.05)
        if c.default_active_thread_percentage is not None:
            self.control(f"set_default_active_thread_percentage {c.default_active_thread_percentage}")
        if c.default_pinned_mem_limit is not None:
            for idx in c.devices:
                self.control(f"set_default_device_pinned_mem_limit {idx} {c.default_pinned_mem_limit}")
        self._started_once = True

    def check(self) -> bool:
        """Probe; when the daemon is down, restart it (counted). Updates and returns ``healthy``."""
        with self._lock:
            if self._started_once and self.probe():
                self.healthy, self.message = True, "running"
                return True
            try:
                if self._started_once:
                    self.restarts += 1
                    log.warning("MPS control daemon is down; restarting (restart #%d)", self.restarts)
                self.start()
                self.healthy, self.message = True, "running"
            except MPSError as exc:
                self.healthy, self.message = False, str(exc)
                log.error("MPS: %s", exc)
            return self.healthy

    def stop(self) -> None:
        """Ask the daemon to quit (best effort: it may already be gone)."""
        with self._lock:
            with contextlib.suppress(MPSError):
                self.control("quit")
            self.healthy, self.message = False, "stopped"

    def run_forever(self, interval: float, stop: threading.Event) -> None:
        """The supervision loop (a thread in the agent)."""
        while not stop.is_set():
            self.check()
            stop.wait(interval)
