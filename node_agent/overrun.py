"""Stop a gated pod that holds more GPU memory than it was admitted with, or memory on a GPU it was not admitted to.

Why: the gate's bound (per GPU, the admitted bytes of its clients fit its memory) holds only while every client keeps
to its own bytes. The MPS server enforces the per-client limit the gate hands out (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
and ``CUDA_VISIBLE_DEVICES`` names the admitted GPU, but both are environment variables of the workload's own process:
a workload can drop them, and then nothing in MPS or CUDA stops it from taking its neighbours' memory or another GPU.
The driver is the one witness the workload cannot edit. Every sample the agent already reads NVML's per-process used
memory (``nvmlDeviceGetComputeRunningProcesses`` / ``nvmlDeviceGetMPSComputeRunningProcesses``) and attributes each
process to a gated pod (``observe``); here the same attribution is judged:

* ``GPUMemoryOverrun``: the pod's processes hold more than the bytes its entries were admitted with, plus a margin;
* ``WrongGPU``: a process of the pod holds memory on a GPU none of its entries was admitted to.

The offender alone is stopped: ``SIGKILL`` to each of its GPU processes and to its gated process (the workload; its
keeper then closes the gate connection, which releases the booking), each through a pidfd opened first and checked
to still be that pod's process, so a pid reused meanwhile is never signalled. Its pod gets ``gnnsched.io/stopped``
(the reason the operator puts on the job); its neighbours are not touched.

The margin (``--overrun-margin``, ``--overrun-margin-bytes``; the larger of the two applies): NVML counts a client's
whole footprint, and part of it is not what the MPS limit or the estimate bounds exactly: the CUDA context grows with
lazily loaded kernels after the first tensor (``gnnsched.gpu.catalogue``: 610 MiB after the first tensor, 742 MiB after
training steps on the H100), and the limit is rounded down to MiB while NVML reports bytes. A client that keeps its
limit never gets near admitted + margin; one that reaches it has left its limit behind. The margin is also what a
client may take from its GPU's free memory before it is stopped, so the per-GPU reserve (``--reserve-bytes``) should
cover ``clients x margin`` where the GPU runs full.
"""

from __future__ import annotations

import json
import math
import os
import signal
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Literal

from gnnsched.gpu.backend import GPUProcess
from gnnsched.node_agent.identity import pod_uids_in_cgroup
from gnnsched.node_agent.observe import ProcessTable

MiB = 2**20
DEFAULT_MARGIN_FRACTION = 0.05
DEFAULT_MARGIN_BYTES = 512 * MiB
MAX_ANCESTRY = 64

Reason = Literal["GPUMemoryOverrun", "WrongGPU"]


def margin_bytes(admitted: int, fraction: float = DEFAULT_MARGIN_FRACTION, floor: int = DEFAULT_MARGIN_BYTES) -> int:
    """What a pod may hold over its admitted bytes before it is stopped (module docstring: why)."""
    return max(int(floor), math.ceil(fraction * admitted))


@dataclass(frozen=True, slots=True)
class Booked:
    """A running gate entry, as the judge needs it."""

    key: str
    pod_uid: str
    namespace: str
    name: str
    gpu_index: int | None
    bytes: int
    pid: int | None  # the gated process (SO_PEERCRED), when known


@dataclass(frozen=True, slots=True)
class Overrun:
    """One pod to stop, and why."""

    pod_uid: str
    namespace: str
    name: str
    keys: tuple[str, ...]
    reason: Reason
    used_bytes: int
    allowed_bytes: int
    admitted_bytes: int
    gpus: tuple[int, ...]  # the GPUs where it holds memory
    pids: tuple[int, ...]  # what to stop: its GPU processes and its gated processes

    def message(self) -> str:
        if self.reason == "WrongGPU":
            return (f"stopped by the node agent: its processes held {self.used_bytes} bytes on GPU(s) "
                    f"{', '.join(map(str, self.gpus))}, which it was not admitted to")
        return (f"stopped by the node agent: its processes held {self.used_bytes} bytes of GPU memory, over the "
                f"{self.admitted_bytes} bytes it was admitted with plus a margin of "
                f"{self.allowed_bytes - self.admitted_bytes} bytes (its MPS memory limit was not in force)")

    def annotation(self, at: datetime | None = None) -> str:
        """The ``gnnsched.io/stopped`` value: JSON the operator reads into the job's failure reason."""
        when = (at or datetime.now(tz=timezone.utc)).isoformat(timespec="seconds").replace("+00:00", "Z")
        return json.dumps({"reason": self.reason, "message": self.message(), "usedBytes": self.used_bytes,
                           "admittedBytes": self.admitted_bytes, "allowedBytes": self.allowed_bytes,
                           "gpus": list(self.gpus), "at": when}, separators=(",", ":"))


def _owner(pid: int, by_pid: dict[int, str], by_uid: set[str], table: ProcessTable) -> str | None:
    """The booked pod a GPU process belongs to: the gated process or a descendant of it, else its cgroup's pod."""
    current: int | None = pid
    for _ in range(MAX_ANCESTRY):
        if current is None or current <= 1:
            break
        if current in by_pid:
            return by_pid[current]
        current = table.read_ppid(current)
    try:
        uids = pod_uids_in_cgroup(table.read_cgroup(pid))
    except OSError:
        return None
    found = [u for u in uids if u in by_uid]
    return found[0] if len(found) == 1 else None


def find_overruns(processes: dict[int, list[GPUProcess]], booked: Iterable[Booked], table: ProcessTable,
                  fraction: float = DEFAULT_MARGIN_FRACTION, floor: int = DEFAULT_MARGIN_BYTES) -> list[Overrun]:
    """The pods to stop after one sample of the driver's per-process memory (``processes``: GPU index -> its
    processes). Judged per pod: a pod of several gated containers may spread its memory over them as it likes."""
    pods: dict[str, list[Booked]] = {}
    for b in booked:
        pods.setdefault(b.pod_uid.lower(), []).append(b)
    by_pid = {b.pid: uid for uid, bs in pods.items() for b in bs if b.pid is not None}
    used: dict[str, dict[int, int]] = {}
    pids: dict[str, set[int]] = {}
    for index, procs in processes.items():
        for p in procs:
            if not p.used_bytes:
                continue  # None: the driver cannot say (never read as zero, never as an offence)
            uid = _owner(p.pid, by_pid, set(pods), table)
            if uid is None:
                continue
            per_gpu = used.setdefault(uid, {})
            per_gpu[index] = per_gpu.get(index, 0) + p.used_bytes
            pids.setdefault(uid, set()).add(p.pid)
    out: list[Overrun] = []
    for uid, per_gpu in used.items():
        bs = pods[uid]
        admitted = sum(b.bytes for b in bs)
        allowed = admitted + margin_bytes(admitted, fraction, floor)
        mine = {b.gpu_index for b in bs}
        wrong = {i: n for i, n in per_gpu.items() if i not in mine}
        total = sum(per_gpu.values())
        stop = tuple(sorted(pids[uid] | {b.pid for b in bs if b.pid is not None}))
        first = bs[0]
        keys = tuple(sorted(b.key for b in bs))
        if wrong:
            out.append(Overrun(uid, first.namespace, first.name, keys, "WrongGPU", sum(wrong.values()), allowed,
                               admitted, tuple(sorted(wrong)), stop))
        elif total > allowed:
            out.append(Overrun(uid, first.namespace, first.name, keys, "GPUMemoryOverrun", total, allowed, admitted,
                               tuple(sorted(per_gpu)), stop))
    return out


@dataclass(slots=True)
class Stopper:
    """Sends ``SIGKILL`` to an offender's processes, each only after a pidfd pins it and it is checked to be the
    offender's (``belongs``). Needs the agent to see host pids (``hostPID``) and ``CAP_KILL`` (the jobs run as
    another user)."""

    table: ProcessTable = field(default_factory=ProcessTable)
    signal_number: int = signal.SIGKILL

    def stop(self, pids: Iterable[int], belongs: Callable[[int], bool]) -> list[int]:
        """Signal every pid that still ``belongs``; returns those signalled (a process already gone is skipped)."""
        done: list[int] = []
        for pid in pids:
            try:
                fd = os.pidfd_open(pid)
            except (ProcessLookupError, OSError):
                continue
            try:
                if not belongs(pid):  # checked with the process pinned: a reused pid fails here or is gone
                    continue
                signal.pidfd_send_signal(fd, self.signal_number)
                done.append(pid)
            except (ProcessLookupError, PermissionError, OSError):
                continue
            finally:
                os.close(fd)
        return done


def belongs_to(pod_uid: str, gated: set[int], table: ProcessTable) -> Callable[[int], bool]:
    """Whether a pid is the pod's: one of its gated processes or their descendants, or in the pod's cgroup."""

    def check(pid: int) -> bool:
        current: int | None = pid
        for _ in range(MAX_ANCESTRY):
            if current is None or current <= 1:
                break
            if current in gated:
                return True
            current = table.read_ppid(current)
        try:
            return pod_uid.lower() in pod_uids_in_cgroup(table.read_cgroup(pid))
        except OSError:
            return False

    return check
