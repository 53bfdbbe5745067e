"""``--fake-cluster N[xG][xMODEL]``: a synthetic cluster in the cache, for tests and benchmarks.

Nodes are ``node-0`` … ``node-(N-1)``, each with G GPUs (default 8) of MODEL (default A100-80GB). The GPUs are
not empty: each carries 0–3 running jobs drawn from a seeded generator (sizes log-normal around 6 GiB, a few
minutes to an hour left, either intensity class), one GPU in ten has a queued job and one in two hundred is
unhealthy — so filter, wait, interference and fragmentation all have something to work on. Times are
anchored at ``anchor`` (seconds since the epoch) so a restarted extender given the same anchor sees the same
cluster. Allocatable CPU/memory: 12 cores and 128 GiB per GPU; each synthetic job holds 4 cores and 32 GiB.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timezone

import numpy as np

from gnnsched.contract import GPUJob, GPUNodeStatus, GPUStatus, MPSStatus
from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, GiB, get_gpu_model

from .cache import ClusterCache

FAKE_RESERVE_BYTES = 1 * GiB
"""Synthetic per-GPU reserve (what a node agent keeps back for contexts); the real value is the agent's."""

_SPEC = re.compile(r"^(\d+)(?:x(\d+))?(?:x(.+))?$")


@dataclass(frozen=True)
class FakeClusterSpec:
    nodes: int
    gpus: int
    model: str


def parse_fake_cluster(text: str) -> FakeClusterSpec:
    """Parse ``N[xG][xMODEL]``; ``ValueError`` names the problem."""
    m = _SPEC.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not N[xG][xMODEL] (e.g. 5000x8xH100-80GB)")
    nodes = int(m.group(1))
    gpus = int(m.group(2)) if m.group(2) else 8
    model = m.group(3) or DEFAULT_GPU_MODEL
    if not 1 <= nodes <= 100_000:
        raise ValueError(f"{nodes} nodes: must be 1..100000")
    if not 1 <= gpus <= 64:
        raise ValueError(f"{gpus} GPUs per node: must be 1..64")
    try:
        name = get_gpu_model(model).name
    except KeyError as exc:
        raise ValueError(str(exc.args[0])) from None
    return FakeClusterSpec(nodes=nodes, gpus=gpus, model=name)


def fake_statuses(spec: FakeClusterSpec, anchor: float, seed: int = 0) -> list[GPUNodeStatus]:
    """The synthetic ``GPUNode`` statuses (deterministic in ``spec``, ``anchor`` and ``seed``)."""
    gm = get_gpu_model(spec.model)
    rng = np.random.default_rng(seed)
    cap = gm.memory_bytes - FAKE_RESERVE_BYTES
    updated = datetime.fromtimestamp(anchor, tz=timezone.utc)
    out = []
    n_gpu = spec.nodes * spec.gpus
    n_run = rng.integers(0, 4, size=n_gpu)
    sizes = np.clip(rng.lognormal(np.log(6 * GiB), 0.8, size=(n_gpu, 4)), 0.5 * GiB, cap / 3).astype(np.int64)
    remaining = rng.uniform(60, 3600, size=(n_gpu, 4))
    memory_bound = rng.random(size=(n_gpu, 4)) < 0.6
    queued = rng.random(n_gpu) < 0.1
    unhealthy = rng.random(n_gpu) < 0.005
    for n in range(spec.nodes):
        gpus = []
        for g in range(spec.gpus):
            i = n * spec.gpus + g
            running = [
                GPUJob(
                    pod_uid=f"fake-{i}-{k}", namespace="fake", name=f"job-{i}-{k}", bytes=int(sizes[i, k]),
                    predicted_remaining_seconds=float(remaining[i, k]),
                    intensity="memory" if memory_bound[i, k] else "compute",
                )
                for k in range(int(n_run[i]))
            ]
            q = []
            if queued[i]:
                q.append(GPUJob(pod_uid=f"fake-{i}-q", namespace="fake", name=f"job-{i}-q", bytes=int(sizes[i, 3]),
                                predicted_remaining_seconds=float(remaining[i, 3]), intensity="compute"))
            gpus.append(
                GPUStatus(
                    index=g, uuid=f"GPU-fake-{n}-{g}", model=gm.name, total_bytes=gm.memory_bytes,
                    reserve_bytes=FAKE_RESERVE_BYTES, committed_bytes=sum(j.bytes for j in running),
                    used_bytes=sum(j.bytes for j in running), healthy=not unhealthy[i], mps_healthy=True,
                    max_clients=gm.max_mps_clients, running=running, queued=q,
                )
            )
        out.append(GPUNodeStatus(node_name=f"node-{n}", updated_at=updated, mps=MPSStatus(), gpus=gpus))
    return out


def populate(cache: ClusterCache, spec: FakeClusterSpec, anchor: float, seed: int = 0) -> None:
    """Fill ``cache`` with the synthetic cluster: GPUNode statuses, Node allocatables and the jobs' pods."""
    cache.reserve_rows(spec.nodes, spec.gpus)
    for status in fake_statuses(spec, anchor, seed):
        cache.upsert_node(status.node_name, 12_000 * spec.gpus, 128 * GiB * spec.gpus)
        cache.upsert_gpunode(status, now=anchor)
        for gpu in status.gpus:
            for job in (*gpu.running, *gpu.queued):
                cache.upsert_pod(
                    {
                        "metadata": {"uid": job.pod_uid, "name": job.name, "namespace": job.namespace},
                        "spec": {
                            "nodeName": status.node_name,
                            "containers": [{"name": "w", "resources": {"requests": {"cpu": "4", "memory": "32Gi"}}}],
                        },
                        "status": {"phase": "Running"},
                    }
                )
    cache.refresh_size_mix(force=True)
