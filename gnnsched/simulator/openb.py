"""openb replay: the real 1,213-node GPU-sharing cluster and its pods, with FGD's fragmentation measurement.

Method (FGD, "Beware of Fragmentation", ATC'23, whose trace this is): pods are drawn from the trace's GPU and CPU
pods (seeded, with replacement) and placed one by one; pods never leave; a pod no node can take fails. The
experiment stops when the GPU demand that arrived reaches ``until`` (default 100 %) of the cluster's GPU capacity.
Measured: the share of GPU capacity allocated, the free GPU capacity that is *fragmented* (free but unusable by a
typical pod), and how many pods failed.

Fragmentation of node ``n`` against the workload ``M`` (FGD section 3): ``F_n(M) = sum_m p_m F_n(m)`` where for a task
class ``m`` with popularity ``p_m``: if ``n`` cannot run ``m`` at all (CPU, memory or GPU), all its free GPU capacity is
a fragment; otherwise the free capacity of GPUs that cannot hold ``m`` (a GPU with less free share than a sharing
task needs; any partly used GPU for a whole-GPU task) is. Task classes are the trace's distinct
``(cpu, memory, num_gpu, gpu_milli)`` requests.

Policies: ``best-fit`` (the node and GPU left with the least free GPU share after placement), ``fgd`` (the node and
GPU whose fragmentation grows least). Arrays over the whole cluster keep one decision to a few milliseconds.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from gnnsched.simulator.cluster import ClusterSpec
from gnnsched.simulator.workloads import JobTemplate, Workload, WorkloadError

FULL = 1000


@dataclass(frozen=True)
class Pod:
    cpu: int
    mem: int
    gpus: int
    milli: int  # share of one GPU when gpus == 1 and milli < 1000


def load_pods(data_dir: Path, variant: str = "default") -> list[Pod]:
    path = data_dir / "traces" / f"openb_pod_list_{variant}.csv"
    if not path.exists():
        raise WorkloadError("workload", f"openb trace not found at {path} (needs ../shared/data)")
    pods = []
    with path.open() as fh:
        for row in csv.DictReader(fh):
            gpus = int(row["num_gpu"])
            milli = int(row["gpu_milli"]) if gpus == 1 else (FULL if gpus else 0)
            pods.append(Pod(int(row["cpu_milli"]), int(row["memory_mib"]) * 2**20, gpus, milli))
    return pods


def openb_workload(seed: int, data_dir: Path) -> Workload:
    """The openb replay as a :class:`Workload` (its jobs are trace pods: no GNN spec, no runtime)."""
    pods = load_pods(data_dir)
    rng = random.Random(f"openb-{seed}")
    templates = [JobTemplate(name=f"pod-{i}", arrival=float(i), spec=None, cpu_milli=p.cpu, memory_bytes=p.mem,
                             gpu_milli=p.milli, num_gpus=p.gpus) for i, p in enumerate(rng.sample(pods, len(pods)))]
    return Workload(name="openb", description="openb pods placed until GPU demand reaches cluster capacity (FGD)",
                    templates=templates, cluster="openb", policies=("best-fit", "fgd"),
                    reference={"paper": "FGD (ATC'23, the openb trace)", "kind": "fragmentation"})


class Classes:
    """The workload's task classes and popularity."""

    def __init__(self, pods: list[Pod], top: int = 64) -> None:
        counts: dict[tuple[int, int, int, int], int] = {}
        for p in pods:
            key = (p.cpu, p.mem, p.gpus, p.milli)
            counts[key] = counts.get(key, 0) + 1
        items = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
        total = sum(c for _, c in items)
        self.cpu = np.array([k[0] for k, _ in items], dtype=np.int64)
        self.mem = np.array([k[1] for k, _ in items], dtype=np.int64)
        self.gpus = np.array([k[2] for k, _ in items], dtype=np.int64)
        self.milli = np.array([k[3] for k, _ in items], dtype=np.int64)
        self.p = np.array([c / total for _, c in items])


class OpenbCluster:
    """Free GPU shares per GPU (milli), free CPU and memory per node, as arrays."""

    def __init__(self, spec: ClusterSpec) -> None:
        nodes = [n for n in spec.nodes if n.gpus > 0]
        self.names = [n.name for n in nodes]
        g = max(n.gpus for n in nodes)
        self.valid = np.zeros((len(nodes), g), dtype=bool)
        for i, n in enumerate(nodes):
            self.valid[i, : n.gpus] = True
        self.free = np.where(self.valid, FULL, 0).astype(np.int64)
        self.cpu = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem = np.array([n.memory_bytes for n in nodes], dtype=np.int64)
        self.capacity = int(self.valid.sum()) * FULL

    def frag(self, free: np.ndarray, cpu: np.ndarray, mem: np.ndarray, valid: np.ndarray, cl: Classes) -> np.ndarray:
        """``F_n(M)`` for rows of nodes (free: rows x G), in milli-GPUs."""
        f = np.where(valid, free, 0)
        total = f.sum(axis=1)  # (R,)
        full = (f == FULL).sum(axis=1)
        top = f.max(axis=1)
        share = (cl.gpus == 1) & (cl.milli < FULL)  # (M,)
        need = np.where(share, cl.milli, FULL)  # per-GPU need
        gpu_ok = np.where(cl.gpus == 0, True,
                          np.where(share, top[:, None] >= cl.milli[None, :], full[:, None] >= cl.gpus[None, :]))
        host_ok = (cpu[:, None] >= cl.cpu[None, :]) & (mem[:, None] >= cl.mem[None, :])
        sched = gpu_ok & host_ok  # (R, M)
        # free capacity on GPUs that cannot hold one unit of the class
        small = (f[:, :, None] < need[None, None, :]) & valid[:, :, None]
        stranded = (f[:, :, None] * small).sum(axis=1)  # (R, M)
        stranded = np.where(cl.gpus[None, :] == 0, 0, stranded)
        per_class = np.where(sched, stranded, total[:, None])
        return per_class @ cl.p

    def place(self, pod: Pod, policy: str, cl: Classes) -> bool:
        host = (self.cpu >= pod.cpu) & (self.mem >= pod.mem)
        if pod.gpus == 0:
            rows = np.flatnonzero(host)
            if rows.size == 0:
                return False
            if policy == "fgd":
                before = self.frag(self.free[rows], self.cpu[rows], self.mem[rows], self.valid[rows], cl)
                after = self.frag(self.free[rows], self.cpu[rows] - pod.cpu, self.mem[rows] - pod.mem,
                                  self.valid[rows], cl)
                best = rows[int(np.argmin(after - before))]
            else:
                best = rows[int(np.argmin(self.cpu[rows] - pod.cpu))]
            self.cpu[best] -= pod.cpu
            self.mem[best] -= pod.mem
            return True
        if pod.gpus == 1 and pod.milli < FULL:
            ok = host[:, None] & self.valid & (self.free >= pod.milli)
        else:
            full = ((self.free == FULL) & self.valid).sum(axis=1)
            ok = (host & (full >= pod.gpus))[:, None] & self.valid & (self.free == FULL)
        cand = np.argwhere(ok)  # (K, 2): node row, gpu index
        if cand.size == 0:
            return False
        if pod.gpus > 1 or pod.milli >= FULL:
            # whole GPUs: the choice is the node; take its first free GPUs
            rows = np.unique(cand[:, 0])
            after_free = self.free[rows].copy()
            for i in range(len(rows)):
                idx = np.flatnonzero((after_free[i] == FULL) & self.valid[rows[i]])[: pod.gpus]
                after_free[i, idx] = 0
            score = self._score(policy, rows, after_free, pod, cl)
            k = int(np.argmin(score))
            row = rows[k]
            self.free[row] = after_free[k]
        else:
            rows = cand[:, 0]
            after_free = self.free[rows].copy()
            after_free[np.arange(len(rows)), cand[:, 1]] -= pod.milli
            score = self._score(policy, rows, after_free, pod, cl)
            k = int(np.argmin(score))
            row = rows[k]
            self.free[row, cand[k, 1]] -= pod.milli
        self.cpu[row] -= pod.cpu
        self.mem[row] -= pod.mem
        return True

    def _score(self, policy: str, rows: np.ndarray, after_free: np.ndarray, pod: Pod, cl: Classes) -> np.ndarray:
        valid = self.valid[rows]
        if policy == "fgd":
            before = self.frag(self.free[rows], self.cpu[rows], self.mem[rows], valid, cl)
            after = self.frag(after_free, self.cpu[rows] - pod.cpu, self.mem[rows] - pod.mem, valid, cl)
            return after - before
        # best fit: least free GPU share left on the node, then on the GPU
        return np.where(valid, after_free, 0).sum(axis=1).astype(np.float64)

    def fragmentation(self, cl: Classes) -> float:
        return float(self.frag(self.free, self.cpu, self.mem, self.valid, cl).sum())


def replay(cluster: ClusterSpec, pods: list[Pod], policy: str, seed: int, until: float = 1.0,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Place pods drawn from the trace until arrived GPU demand reaches ``until`` x capacity (FGD's experiment)."""
    if policy not in ("best-fit", "fgd"):
        raise ValueError(f"policies: {policy!r} is not an openb placement policy (best-fit, fgd)")
    state = OpenbCluster(cluster)
    cl = Classes(pods)
    rng = random.Random(f"openb-replay-{seed}")
    arrived = 0
    placed = failed = failed_gpu = 0
    target = until * state.capacity
    curve = []
    i = 0
    while arrived < target:
        pod = pods[rng.randrange(len(pods))]
        demand = pod.gpus * FULL if pod.gpus != 1 else pod.milli
        arrived += demand
        if state.place(pod, policy, cl):
            placed += 1
        else:
            failed += 1
            failed_gpu += demand
        i += 1
        if i % 200 == 0:
            allocated = state.capacity - int(np.where(state.valid, state.free, 0).sum())
            curve.append((arrived / state.capacity, allocated / state.capacity,
                          state.fragmentation(cl) / state.capacity))
            if progress is not None:
                progress(int(min(arrived, target)), int(target))
    free = int(np.where(state.valid, state.free, 0).sum())
    frag = state.fragmentation(cl)
    return {
        "pods_arrived": i, "pods_placed": placed, "pods_failed": failed,
        "gpu_demand_arrived": round(arrived / state.capacity, 4),
        "gpu_allocated": round(1 - free / state.capacity, 4),
        "failed_gpu_demand": round(failed_gpu / state.capacity, 4),
        "unallocated_gpus": round(free / FULL, 1),
        "fragmented_gpus": round(frag / FULL, 1),
        "fragmentation_rate": round(frag / free, 4) if free else 0.0,
        "curve": curve,
    }
