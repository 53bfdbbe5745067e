"""Observation: what each gated pod really holds on its GPU, and how a gated container that failed ended.

Why: on a real GPU the estimate is open-loop (see ``gnnsched.closed_loop``). The driver is the one witness of what a
pod's processes hold, so the agent samples NVML's per-process used memory, attributes each process to the gated pod it
belongs to, and records the pod's peak (the sum over its processes, maximised over samples) on the pod as
``gnnsched.io/observed-peak-bytes``, where the operator reads it into ``status.observedPeakBytes`` and calibration.

Which pod a GPU process belongs to: first the process tree (the gated process itself, whose pid the gate learnt from
``SO_PEERCRED``, and its descendants: data-loader workers, a shell's child), else the pod UID in the process's cgroup
(``/proc/<pid>/cgroup``; the agent runs with ``hostPID``). A process no gated pod owns is not attributed.

Restart-safe: a value is written only when it is larger than what the pod already records (read, compare, write; the
agent is the annotation's only writer), so an agent that restarts mid-run and sees a smaller peak never lowers it.

A custom container (the user's own image) writes no result line. When one fails, the agent reads its pod's container
status (exit code, termination message: the log tail under ``FallbackToLogsOnError``) and, when the text shows an
out-of-memory error or a fatal GPU error, or when its sampled memory reached the MPS limit before it died, writes a
``gnnsched.closed_loop.AttemptResult`` with ``source: gate`` on the pod (``gnnsched.io/attempt-result``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from gnnsched.closed_loop import AttemptResult, classify_log, failed_request_bytes
from gnnsched.contract import ANN_OBSERVED_PEAK_BYTES
from gnnsched.gpu.backend import GPUProcess
from gnnsched.node_agent.identity import (
    ContainerEnd,
    PodLookup,
    pod_uids_in_cgroup,
    read_proc_cgroup,
)

AT_LIMIT_FRACTION = 0.95
"""A failed container whose sampled device memory reached this fraction of its MPS limit is taken to have run out of
memory even when its log says nothing (the sample is up to one interval old, and NVML counts the context too)."""

MAX_ANCESTRY = 64  # /proc parent links followed at most (a loop-safe bound; real trees are a few levels deep)


def read_proc_ppid(pid: int, proc_root: Path = Path("/proc")) -> int | None:
    """The parent pid from ``/proc/<pid>/stat`` (the field after the state, past the ``(comm)`` that may hold
    spaces)."""
    try:
        text = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


@dataclass(slots=True)
class ProcessTable:
    """How the agent looks at host processes (``/proc``); injectable for tests."""

    read_cgroup: Callable[[int], str] = read_proc_cgroup
    read_ppid: Callable[[int], int | None] = read_proc_ppid


@dataclass(frozen=True, slots=True)
class Client:
    """A running gated entry as the observer needs it."""

    key: str
    pod_uid: str
    gpu_index: int | None
    pid: int | None


def attribute(processes: dict[int, list[GPUProcess]], clients: Iterable[Client], table: ProcessTable) -> dict[str, int]:
    """Bytes each client's processes hold now, summed over its GPU processes (``used_bytes`` None: not counted)."""
    clients = list(clients)
    by_pid: dict[int, list[str]] = {}
    for c in clients:
        if c.pid is not None:
            by_pid.setdefault(c.pid, []).append(c.key)
    by_uid: dict[str, list[str]] = {}
    for c in clients:
        by_uid.setdefault(c.pod_uid.lower(), []).append(c.key)
    usage: dict[str, int] = {}
    for procs in processes.values():
        for p in procs:
            if p.used_bytes is None:
                continue
            owners = _owners_by_tree(p.pid, by_pid, table)
            if not owners:
                try:
                    uids = pod_uids_in_cgroup(table.read_cgroup(p.pid))
                except OSError:
                    uids = set()
                owners = [k for uid in uids for k in by_uid.get(uid, [])]
            for key in owners:
                usage[key] = usage.get(key, 0) + p.used_bytes
    return usage


def _owners_by_tree(pid: int, by_pid: dict[int, list[str]], table: ProcessTable) -> list[str]:
    current: int | None = pid
    for _ in range(MAX_ANCESTRY):
        if current is None or current <= 1:
            return []
        if current in by_pid:
            return by_pid[current]
        current = table.read_ppid(current)
    return []


@dataclass(slots=True)
class Observer:
    """Per running entry: the peak and the latest sample of its device memory, and what was last written."""

    peaks: dict[str, int] = field(default_factory=dict)
    last: dict[str, int] = field(default_factory=dict)
    written: dict[str, int] = field(default_factory=dict)

    def update(self, usage: dict[str, int]) -> dict[str, int]:
        """Fold one sample in; returns the entries whose peak grew past what was last written (to write now)."""
        grown: dict[str, int] = {}
        for key, used in usage.items():
            self.last[key] = used
            if used > self.peaks.get(key, 0):
                self.peaks[key] = used
            if self.peaks[key] > self.written.get(key, 0):
                grown[key] = self.peaks[key]
        return grown

    def mark_written(self, key: str, value: int) -> None:
        self.written[key] = max(self.written.get(key, 0), value)

    def forget(self, key: str) -> int | None:
        """Drop an entry that ended; returns its peak (``None`` if never seen on a GPU)."""
        self.last.pop(key, None)
        self.written.pop(key, None)
        return self.peaks.pop(key, None)


def recorded_peak(annotations: dict[str, str]) -> int:
    raw = annotations.get(ANN_OBSERVED_PEAK_BYTES)
    try:
        return max(0, int(raw)) if raw is not None else 0
    except ValueError:
        return 0


def write_peak(pods: PodLookup, namespace: str, name: str, pod_uid: str, value: int) -> int:
    """Raise the pod's recorded peak to ``value`` unless it already records as much (never lowers it). Returns the
    value the pod records afterwards (0 when the pod is gone or is another pod now)."""
    pod = pods.get(namespace, name)
    if pod is None or pod.uid != pod_uid:
        return 0
    recorded = recorded_peak(pod.annotations)
    if value > recorded:
        pods.annotate(namespace, name, {ANN_OBSERVED_PEAK_BYTES: str(value)})
        return value
    return recorded


def has_worker_result(message: str | None) -> bool:
    """Whether a termination message carries the worker's own result line (then the agent adds nothing)."""
    for line in reversed((message or "").strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict) and "outcome" in doc:
            return True
    return False


def gate_attempt_result(end: ContainerEnd, peak: int | None, limit_bytes: int) -> AttemptResult | None:
    """The outcome of a failed gated container that did not report one itself, or ``None`` (it succeeded, reported
    itself, or failed for a reason the memory loop does not handle: an ordinary failure)."""
    if end.exit_code is None or end.exit_code == 0 or has_worker_result(end.message):
        return None
    text = end.message or ""
    outcome = classify_log(text)
    if outcome is None and peak is not None and peak >= AT_LIMIT_FRACTION * limit_bytes:
        outcome = "memory-exceeded"
    if outcome is None:
        return None
    held = peak if outcome == "memory-exceeded" else None
    requested = failed_request_bytes(text) if outcome == "memory-exceeded" else None
    tail = text.strip()[-1024:] or None
    return AttemptResult(outcome=outcome, observed_peak_bytes=peak, limit_bytes=limit_bytes, held_bytes=held,
                         requested_bytes=requested, source="gate", message=tail)


def container_end(ended: list[ContainerEnd], key: str) -> ContainerEnd | None:
    """The terminated container a gate key names (``<pod uid>/<container>``), or the pod's only/first one."""
    _, _, container = key.partition("/")
    if container:
        return next((c for c in ended if c.name == container), None)
    return ended[0] if ended else None
