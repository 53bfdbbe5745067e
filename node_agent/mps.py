"""One NVIDIA MPS control daemon per node: start, configure, health-probe, restart.

Why the agent owns it: the gate's memory limits (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) are enforced by the MPS
server, and a CUDA client that cannot reach the control daemon silently runs *without* MPS — no limit at all. So the
agent starts the daemon with the node's pipe and log directories, sets its defaults, probes it (``get_server_list``
through the control client, which fails when the daemon is gone), restarts it when it dies, and reports its health;
while it is unhealthy the gate admits nothing new.

Everything goes through the real ``nvidia-cuda-mps-control`` command line (``-d`` to daemonise, commands on stdin),
so the tests drive it with a fake executable on ``PATH`` that records what it receives (``tests/fakes``).

On a real cluster this manager runs in ``gnnsched mps-daemon`` (``mps_daemon.py``), a privileged container of its own,
so that an agent restart never takes the daemon and its clients down; ``gnnsched node-agent --mps on`` keeps it in the
agent for single-container development. Three details follow NVIDIA's k8s-device-plugin
(``cmd/mps-control-daemon/mps/daemon.go``): compute mode is set and reset by GPU *UUID* (``nvidia-smi -i <uuid>``),
``-d`` runs with its output discarded, never captured (the daemon it forks inherits the stdout/stderr pipes, so a
capturing parent would wait for an EOF that never comes), and the per-device default pinned memory limit is set
through the control daemon for every GPU right after start.
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
    #: GPU UUIDs, same order as ``devices``: compute mode is set by UUID (indices can be renumbered across reboots
    #: and are remapped by ``CUDA_VISIBLE_DEVICES``); empty: by index.
    uuids: list[str] = field(default_factory=list)
    compute_mode: str | None = None  # "exclusive" | "default" | None (leave as is)
    default_active_thread_percentage: int | None = None
    default_pinned_mem_limit: str | None = None  # e.g. "78G", applied to every device
    #: Per-device default pinned memory limits (device index -> "78G"); override ``default_pinned_mem_limit``.
    pinned_mem_limits: dict[int, str] = field(default_factory=dict)
    #: Owner of the pipe and log directories: the jobs' UID, so that its clients can use the pipes (None: leave).
    owner_uid: int | None = None
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

    def _gpu_ids(self) -> list[str]:
        """What ``nvidia-smi -i`` gets: UUIDs when known (as NVIDIA's MPS daemon does), else indices."""
        c = self.config
        return list(c.uuids) if c.uuids else [str(i) for i in c.devices]

    def set_compute_mode(self, mode_key: str) -> None:
        """``nvidia-smi -i <uuid> -c <mode>`` for every GPU (needs root with CAP_SYS_ADMIN on a real node)."""
        mode = COMPUTE_MODES[mode_key]
        for gpu in self._gpu_ids():
            self._run([self.config.nvidia_smi, "-i", gpu, "-c", mode])

    def pinned_limits(self) -> dict[int, str]:
        """The default pinned memory limit per device index the daemon is given after every start."""
        c = self.config
        limits = {idx: c.default_pinned_mem_limit for idx in c.devices} if c.default_pinned_mem_limit else {}
        limits.update(c.pinned_mem_limits)
        return limits

    def _prepare_dirs(self) -> None:
        c = self.config
        for d in (c.pipe_directory, c.log_directory):
            d.mkdir(parents=True, exist_ok=True)
            if c.owner_uid is not None:
                st = d.stat()
                if st.st_uid != c.owner_uid:
                    try:
                        os.chown(d, c.owner_uid, -1)
                    except OSError as exc:
                        raise MPSError(f"cannot give {d} to uid {c.owner_uid}: {exc.strerror}") from None
                os.chmod(d, 0o755)

    def _daemonise(self) -> None:
        """``nvidia-cuda-mps-control -d`` with stdin/stdout/stderr on /dev/null: nothing captured, nothing to hang
        on (the forked daemon would hold a captured pipe open forever). Its own log is ``<log dir>/control.log``."""
        c = self.config
        exe = shutil.which(c.binary, path=self.env().get("PATH"))
        if exe is None:
            raise MPSError(f"{c.binary} not found on PATH")
        try:
            rc = subprocess.run(
                [exe, "-d"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                env=self.env(), timeout=c.command_timeout,
            ).returncode
        except subprocess.TimeoutExpired:
            raise MPSError(f"{c.binary} -d: did not return in {c.command_timeout:.0f} s") from None
        if rc != 0:
            raise MPSError(f"{c.binary} -d: exit {rc} (see {c.log_directory / 'control.log'})")

    def start(self) -> None:
        """Start (or adopt an already running) daemon and apply the configured defaults. Raises ``MPSError``."""
        c = self.config
        self._prepare_dirs()
        if c.compute_mode:
            self.set_compute_mode(c.compute_mode)
        if not self.probe():
            self._daemonise()
            deadline = time.monotonic() + c.start_timeout
            while not self.probe():
                if time.monotonic() > deadline:
                    raise MPSError(f"MPS control daemon did not answer within {c.start_timeout:.0f} s of starting")
                time.sleep(0.05)
        if c.default_active_thread_percentage is not None:
            self.control(f"set_default_active_thread_percentage {c.default_active_thread_percentage}")
        for idx, limit in sorted(self.pinned_limits().items()):
            self.control(f"set_default_device_pinned_mem_limit {idx} {limit}")
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
