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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gnnsched.simulator.cluster import ClusterSpec
from gnnsched.simulator.workload_types import JobTemplate, Workload, WorkloadError

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
    """The workload's task classes and popularity (the ``top`` most frequent requests; they cover most pods)."""

    def __init__(self, pods: list[Pod], top: int = 32) -> None:
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

    # ---- fragmentation, decomposed so that a candidate placement is evaluated from cached per-node statistics
    def _stats(self, rows: np.ndarray, cl: Classes) -> dict[str, np.ndarray]:
        f = np.where(self.valid[rows], self.free[rows], -1)  # -1: no GPU in that slot
        fz = np.maximum(f, 0)
        srt = np.sort(f, axis=1)
        partial = np.where((f >= 0) & (f < FULL), f, -1)
        need = self._need(cl)
        small = (f[:, :, None] >= 0) & (f[:, :, None] < need[None, None, :])
        stranded = (fz[:, :, None] * small).sum(axis=1).astype(np.float64)
        stranded[:, cl.gpus == 0] = 0.0
        return {"total": fz.sum(axis=1), "full": (f == FULL).sum(axis=1), "top1": srt[:, -1],
                "top2": srt[:, -2] if f.shape[1] > 1 else np.full(len(rows), -1),
                "top_partial": partial.max(axis=1), "stranded": stranded}

    @staticmethod
    def _need(cl: Classes) -> np.ndarray:
        share = (cl.gpus == 1) & (cl.milli < FULL)
        return np.where(share, cl.milli, FULL)

    @staticmethod
    def _frag_from(
        total: np.ndarray, full: np.ndarray, top: np.ndarray, stranded: np.ndarray, cpu: np.ndarray, mem: np.ndarray,
        cl: Classes,
    ) -> np.ndarray:
        """``F_n(M)`` from node statistics (see the module docstring)."""
        share = (cl.gpus == 1) & (cl.milli < FULL)
        gpu_ok = np.where(cl.gpus[None, :] == 0, True,
                          np.where(share[None, :], top[:, None] >= cl.milli[None, :],
                                   full[:, None] >= cl.gpus[None, :]))
        host_ok = (cpu[:, None] >= cl.cpu[None, :]) & (mem[:, None] >= cl.mem[None, :])
        per_class = np.where(gpu_ok & host_ok, stranded, total[:, None].astype(np.float64))
        return per_class @ cl.p

    def init_frag(self, cl: Classes) -> None:
        """Cache per-node statistics and ``F_n(M)``; a placement changes one node, so only its row is redone."""
        self.cl = cl
        self.st = self._stats(np.arange(len(self.names)), cl)
        st = self.st
        self.fcache = self._frag_from(st["total"], st["full"], st["top1"], st["stranded"], self.cpu, self.mem, cl)

    def _update(self, row: int, cl: Classes) -> None:
        one = self._stats(np.array([row]), cl)
        for key, val in one.items():
            self.st[key][row] = val[0]
        st = self.st
        r = slice(row, row + 1)
        self.fcache[row] = self._frag_from(st["total"][r], st["full"][r], st["top1"][r], st["stranded"][r],
                                           self.cpu[r], self.mem[r], cl)[0]

    def place(self, pod: Pod, policy: str, cl: Classes) -> bool:
        """Place one pod by ``policy``; False when no node can take it. Candidate GPUs at the same free level on
        the same node leave the node in the same state, so each is evaluated once."""
        st = self.st
        host = (self.cpu >= pod.cpu) & (self.mem >= pod.mem)
        if pod.gpus == 0:
            rows = np.flatnonzero(host)
            if rows.size == 0:
                return False
            if policy == "fgd":
                after = self._frag_from(st["total"][rows], st["full"][rows], st["top1"][rows],
                                        st["stranded"][rows], self.cpu[rows] - pod.cpu, self.mem[rows] - pod.mem, cl)
                row = int(rows[int(np.argmin(after - self.fcache[rows]))])
            else:
                row = int(rows[int(np.argmin(self.cpu[rows] - pod.cpu))])
            self.cpu[row] -= pod.cpu
            self.mem[row] -= pod.mem
            self._update(row, cl)
            return True
        if pod.gpus == 1 and pod.milli < FULL:
            ok = host[:, None] & self.valid & (self.free >= pod.milli)
            rows, cols = np.nonzero(ok)
            if rows.size == 0:
                return False
            _, first = np.unique(rows * (FULL + 1) + self.free[rows, cols], return_index=True)
            rows, cols = rows[first], cols[first]
            a_old = self.free[rows, cols]
            a_new = a_old - pod.milli
            if policy == "fgd":
                need = self._need(cl)
                h_old = a_old[:, None] * (a_old[:, None] < need[None, :])
                h_new = a_new[:, None] * (a_new[:, None] < need[None, :])
                stranded = st["stranded"][rows] - h_old + h_new
                stranded[:, cl.gpus == 0] = 0.0
                top1, top2 = st["top1"][rows], st["top2"][rows]
                top = np.where(a_old == top1, np.maximum(top2, a_new), top1)
                full = st["full"][rows] - (a_old == FULL)
                after = self._frag_from(st["total"][rows] - pod.milli, full, top, stranded,
                                        self.cpu[rows] - pod.cpu, self.mem[rows] - pod.mem, cl)
                score = after - self.fcache[rows]
            else:  # best fit: least free GPU share left on the node, then on the GPU
                score = (st["total"][rows] - pod.milli) * (FULL + 1.0) + a_new
            k = int(np.argmin(score))
            row, col = int(rows[k]), int(cols[k])
            self.free[row, col] -= pod.milli
        else:
            rows = np.flatnonzero(host & (st["full"] >= pod.gpus))
            if rows.size == 0:
                return False
            if policy == "fgd":
                # whole GPUs go from fully free to 0: neither counts as stranded for any class
                full = st["full"][rows] - pod.gpus
                top = np.where(full > 0, FULL, np.maximum(st["top_partial"][rows], 0))
                after = self._frag_from(st["total"][rows] - pod.gpus * FULL, full, top, st["stranded"][rows],
                                        self.cpu[rows] - pod.cpu, self.mem[rows] - pod.mem, cl)
                score = after - self.fcache[rows]
            else:
                score = (st["total"][rows] - pod.gpus * FULL).astype(np.float64)
            row = int(rows[int(np.argmin(score))])
            idx = np.flatnonzero((self.free[row] == FULL) & self.valid[row])[: pod.gpus]
            self.free[row, idx] = 0
        self.cpu[row] -= pod.cpu
        self.mem[row] -= pod.mem
        self._update(row, cl)
        return True

    def fragmentation(self) -> float:
        return float(self.fcache.sum())


def replay(cluster: ClusterSpec, pods: list[Pod], policy: str, seed: int, until: float = 1.0,
           progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Place pods drawn from the trace until arrived GPU demand reaches ``until`` x capacity (FGD's experiment)."""
    if policy not in ("best-fit", "fgd"):
        raise ValueError(f"policies: {policy!r} is not an openb placement policy (best-fit, fgd)")
    state = OpenbCluster(cluster)
    cl = Classes(pods)
    state.init_frag(cl)
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
                          state.fragmentation() / state.capacity))
            if progress is not None:
                progress(int(min(arrived, target)), int(target))
    free = int(np.where(state.valid, state.free, 0).sum())
    frag = state.fragmentation()
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
