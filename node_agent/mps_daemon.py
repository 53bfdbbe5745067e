"""``gnnsched mps-daemon``: the node's MPS control daemon, run apart from the agent.

Why apart: a process started by a container dies with it. When the agent owned ``nvidia-cuda-mps-control``, every
rolling update of the agent killed the daemon and, with it, every running MPS client (every job on the node). This
command runs in a privileged container of its own (a DaemonSet with ``updateStrategy: OnDelete``), as NVIDIA's
k8s-device-plugin runs its ``mps-control-daemon``; the agent only reads the health this process publishes.

What it does, following NVIDIA's ``cmd/mps-control-daemon/mps/daemon.go`` (Start/Stop/AssertHealthy):

1. gives the pipe and log directories to the jobs' UID (an MPS control daemon serves one user at a time; every gated
   pod runs as that UID and must be able to use the pipes);
2. sets compute mode EXCLUSIVE_PROCESS on every GPU by UUID;
3. starts ``nvidia-cuda-mps-control -d`` with its output discarded (never captured: the forked daemon keeps captured
   pipes open and the caller would hang);
4. sets a default pinned device memory limit for every GPU through the control daemon
   (``set_default_device_pinned_mem_limit <index> <limit>``): the cap of a client that does not set
   ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` itself (see docs/node-agent.md for which limit wins);
5. probes the daemon (``get_server_list``) every ``--probe-interval`` seconds, restarts it when it is gone, and writes
   its health (``contract.MPSDaemonHealth``) to ``<state dir>/mps-daemon.json``: a directory only this process and
   the agent can write (root, 0755), never the pipe directory, which every client can write;
6. ``--mount-shm`` (run once from a privileged init container, as NVIDIA's ``mount-shm``) makes the shared
   ``<mps root>/shm`` a tmpfs that the daemon's container and, through the device plugin, every job mount at
   ``/dev/shm``; the health file says whether the daemon's ``/dev/shm`` really is it;
7. on SIGTERM, exits without sending ``quit`` by default. In a pod that does not keep the daemon: a container's
   processes end with its main one (the kernel kills a PID namespace with its init; with ``hostPID`` runc kills what
   is left in the container's cgroup), so running jobs lose their server whenever this container stops, and the
   DaemonSet's ``OnDelete`` strategy is what keeps upgrades from stopping it. ``start`` uses a daemon that already
   answers on the pipe directory (one run outside the pod, e.g. on the host by an admin) instead of starting a
   second one; a daemon of an earlier ``mps-daemon`` container is never there to be used. ``--disable`` (run once,
   e.g. from a pre-delete hook or by hand) quits the daemon, puts compute mode back to DEFAULT by UUID and publishes
   "disabled"; ``--reset-on-exit`` does the same on SIGTERM.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gnnsched.contract import MPS_DAEMON_HEALTH_FILE_NAME, MPS_SHM_SOURCE, MPSDaemonHealth
from gnnsched.node_agent.mps import COMPUTE_MODES, MPSError, MPSManager
from gnnsched.node_status_file import write_json_atomic

log = logging.getLogger("gnnsched.node_agent.mps_daemon")


def health_file_path(state_dir: str | os.PathLike[str]) -> Path:
    """Where ``gnnsched mps-daemon`` publishes its health (read by the agent)."""
    return Path(state_dir) / MPS_DAEMON_HEALTH_FILE_NAME


def dev_shm_binding(shm_dir: str | os.PathLike[str], mountinfo: str | None = None) -> tuple[bool, str]:
    """Whether this container's ``/dev/shm`` is the shared tmpfs (``shm_dir`` on the host), from mountinfo.

    A container's private ``/dev/shm`` is a tmpfs mounted at its own root (mountinfo's root field ``/``); the shared
    one arrives as a bind mount of a host directory, whose root field ends in that directory's name (the exact
    prefix depends on which host file system holds it). Returns (shared?, what was seen)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError as exc:
            return False, f"cannot read /proc/self/mountinfo: {exc.strerror}"
    last: list[str] | None = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[4] == "/dev/shm":
            last = fields  # the last mount on a mount point is the visible one
    if last is None:
        return False, "/dev/shm is not a mount point"
    root = last[3]
    name = Path(shm_dir).name
    fstype = last[last.index("-") + 1] if "-" in last else "?"
    source = last[last.index("-") + 2] if "-" in last and len(last) > last.index("-") + 2 else "?"
    if root != "/" and root.rstrip("/").endswith("/" + name):
        return True, f"/dev/shm is {root} ({fstype})"
    if fstype == "tmpfs" and source == MPS_SHM_SOURCE:
        # the chart's own tmpfs at the shm directory (NVIDIA's layout): its root is "/", named by its source
        return True, f"/dev/shm is the {MPS_SHM_SOURCE} tmpfs"
    return False, (f"/dev/shm is {root} ({fstype}), not the shared {shm_dir}: "
                   "MPS clients in other containers cannot attach")


SHM_FALLBACK_SIZE = "65536k"

DEFAULT_SHM_SIZE = "1Gi"
"""The shared ``/dev/shm`` tmpfs's size by default (``--shm-size``, chart ``node.mps.shmSize``). Why bounded: the
tmpfs is one for the node and outlives the pods that write to it, so at NVIDIA's "half the node's memory" one tenant
could hold half the node's RAM past its pod's life (issue 39). Why 1 GiB: what MPS itself puts there is one 4 KiB
``cuda.shm.*`` file per client (NVIDIA/k8s-device-plugin#467), 48 clients x 8 GPUs = 1.5 MiB; the built-in worker
samples in threads and shares nothing through it; what is left is for custom entrypoints that share tensors between
processes (torch DataLoader workers pass batches through ``/dev/shm``), the same order as a container's own
``/dev/shm`` that Docker sizes at 64 MiB. An image that needs more: raise it (``auto`` restores half the memory)."""


def shm_size_from_meminfo(meminfo: str) -> str:
    """Half the node's memory for the shared tmpfs, as NVIDIA's ``mount-shm`` sizes it (a tmpfs only takes what is
    written to it); its fallback, 64 MiB, when ``MemTotal`` cannot be read."""
    for line in meminfo.splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            if len(parts) >= 2 and parts[1].isdigit():
                unit = parts[2][0] if len(parts) >= 3 and parts[2] else ""
                return f"{int(parts[1]) // 2}{unit}"
    return SHM_FALLBACK_SIZE


def _is_mount_point(path: Path, mountinfo: str) -> bool:
    target = str(path).rstrip("/") or "/"
    return any(len(f) >= 5 and f[4] == target for f in (line.split() for line in mountinfo.splitlines()))


def mount_shm(shm_dir: str | os.PathLike[str], size: str | None = None, mountinfo: str | None = None,
              timeout: float = 30.0) -> list[list[str]]:
    """Make ``shm_dir`` a fresh tmpfs (NVIDIA's ``mps-control-daemon mount-shm``): unmount a stale one, create the
    directory, mount ``tmpfs`` with ``rw,nosuid,nodev,noexec,relatime,size=<size>``. Run once, privileged, from an
    init container whose volume has ``mountPropagation: Bidirectional``, so the mount shows on the host and the
    daemon's container and every job's (through the device plugin) see the same files. Returns the commands run;
    raises ``MPSError`` with the failing command and its message."""
    path = Path(shm_dir)
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            mountinfo = ""
    if size is None:
        try:
            size = shm_size_from_meminfo(Path("/proc/meminfo").read_text())
        except OSError:
            size = SHM_FALLBACK_SIZE
    commands: list[list[str]] = []
    if _is_mount_point(path, mountinfo):
        commands.append(["umount", str(path)])
    # named, not "shm" as NVIDIA's: a container's private /dev/shm is also a tmpfs called "shm", and the name is how
    # dev_shm_binding tells the shared one apart once it is bind-mounted (root "/") into the daemon's container
    commands.append(["mount", "-t", "tmpfs", "-o", f"rw,nosuid,nodev,noexec,relatime,size={size}", MPS_SHM_SOURCE,
                     str(path)])
    path.mkdir(parents=True, exist_ok=True)
    for argv in commands:
        exe = shutil.which(argv[0])
        if exe is None:
            raise MPSError(f"{argv[0]} not found on PATH")
        try:
            cp = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                                stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise MPSError(f"{' '.join(argv)}: no answer in {timeout:.0f} s") from None
        if cp.returncode != 0:
            detail = (cp.stderr or cp.stdout).strip().splitlines()
            raise MPSError(f"{' '.join(argv)}: exit {cp.returncode}" + (f": {detail[-1]}" if detail else ""))
    return commands


def clean_shm(path: str | os.PathLike[str]) -> list[str]:
    """Remove every entry of the shared ``/dev/shm`` (``path``: the daemon's view of it). Called when this daemon
    starts a control daemon of its own: no MPS server runs then, so no client can be using anything there (every
    client dies with its server), and what is left is an earlier run's: stale ``cuda.shm.*`` files and whatever a
    tenant's pod wrote and never removed, which would otherwise hold node memory past the pods' lives. Returns the
    names removed; an entry that cannot be removed is logged and left."""
    root = Path(path)
    removed: list[str] = []
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        log.warning("cannot list %s to clean it: %s", root, exc)
        return removed
    for entry in entries:
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry.name)
        except OSError as exc:
            log.warning("cannot remove %s: %s", entry, exc)
    if removed:
        log.info("cleaned %d stale entries from %s", len(removed), root)
    return removed


def pinned_limit_mib(total_bytes: int, reserve_bytes: int) -> str:
    """The ``auto`` default limit for one GPU: its memory less the reserve no client may take, in whole MiB
    (``set_default_device_pinned_mem_limit`` takes M/G suffixes). Never above what the gate could ever admit, so it
    cannot cut a gated client short whichever of the two limits wins, and it keeps the reserve out of reach of a
    client that runs without the gate's environment."""
    return f"{max(1, (total_bytes - reserve_bytes) // (1 << 20))}M"


@dataclass(slots=True)
class MPSDaemonService:
    """One node's MPS control daemon plus the health file. Not tied to any process lifetime but its own."""

    manager: MPSManager
    state_dir: Path
    jobs_uid: int | None = None
    shm_dir: str | None = None  # host path of the shared tmpfs, to check /dev/shm against (None: not checked)
    # the shared tmpfs as this container sees it, emptied when this service starts a daemon (clean_shm); None: never
    shm_mount: Path | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def health_path(self) -> Path:
        return health_file_path(self.state_dir)

    def _prepare_state_dir(self) -> None:
        """Root-owned 0755: the agent (root, no capabilities) and this daemon write; the device plugin and nobody
        else can only read. Job pods never mount it."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.state_dir, 0o755)

    def publish(self, healthy: bool | None = None, message: str | None = None) -> MPSDaemonHealth:
        m = self.manager
        c = m.config
        shared, detail = dev_shm_binding(self.shm_dir) if self.shm_dir else (None, "")
        health = MPSDaemonHealth(
            shm_shared=shared,
            shm_detail=detail,
            healthy=m.healthy if healthy is None else healthy,
            message=(m.message if message is None else message)[:500],
            restarts=m.restarts,
            compute_mode=COMPUTE_MODES[c.compute_mode] if c.compute_mode else "",
            gpus=list(c.uuids),
            pinned_mem_limits={str(k): v for k, v in sorted(m.pinned_limits().items())},
            jobs_uid=self.jobs_uid,
            pid=os.getpid(),
            updated_at=datetime.now(timezone.utc),
        )
        try:
            write_json_atomic(self.health_path, health.wire())
        except OSError as exc:
            log.error("cannot write %s: %s", self.health_path, exc)
        return health

    def check(self) -> bool:
        ok = self.manager.check()
        self.publish()
        return ok

    def run(self, interval: float) -> None:
        """Supervise until :meth:`stop`: probe, restart when gone, publish health every ``interval`` seconds."""
        self._prepare_state_dir()
        if self.shm_mount is not None and not self.manager.probe():
            clean_shm(self.shm_mount)  # no daemon, so no server and no client: what is there is stale
        while not self._stop.is_set():
            self.check()
            self._stop.wait(interval)

    def stop(self) -> None:
        self._stop.set()

    def disable(self) -> list[str]:
        """Quit the daemon and put every GPU's compute mode back to DEFAULT (by UUID); publish "disabled".
        Returns the problems met (empty when all went well): each step is tried even if an earlier one failed."""
        self._prepare_state_dir()
        problems: list[str] = []
        m = self.manager
        if m.probe():
            try:
                m.control("quit")
            except MPSError as exc:
                problems.append(str(exc))
            deadline = time.monotonic() + m.config.start_timeout
            while m.probe() and time.monotonic() < deadline:
                time.sleep(0.05)
        m.healthy, m.message = False, "disabled"
        try:
            m.set_compute_mode("default")
            m.config.compute_mode = "default"
        except MPSError as exc:
            problems.append(str(exc))
        self.publish(False, "disabled" + (f" with problems: {'; '.join(problems)}" if problems else ""))
        return problems
