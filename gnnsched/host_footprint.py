"""Host (CPU-side) memory a GNN job needs: the floor below which adaptive scaling must never shrink its request.

Why a floor: a runtime model fitted on traces has no idea that a job holding a 10 GiB feature matrix dies with
OOMKilled at 8 GiB; a tree model is flat there and would happily shrink. The floor is counted like the PMC
estimator counts device memory — the tensors the job must hold, from the graph's dimensions — plus the process:

* graph: ``edge_index`` (2 × E int64), node features (N × F fp32), labels (N int64), three boolean split masks;
* loading peak: reading and processing the dataset holds transient copies. Measured here on Cora (PyG 2.8, CPU):
  15.0 MiB of tensors raised the process RSS by 34 MiB, a factor 2.3; ``LOAD_PEAK_FACTOR`` = 2.5 covers it;
* mini-batch: a CSR copy for the sampler ((N+1) + E int64) and loader buffers: each worker (one per core, at most
  ``MAX_LOADER_CORES``) prefetches ``PREFETCH`` batches of sampled features and indices;
* runtime: Python + torch + torch_geometric imported, measured here at 317 MiB RSS (CPU build; ``RUNTIME_BYTES``);
  a CUDA build maps more host memory (libraries, pinned staging); ``CUDA_RUNTIME_EXTRA_BYTES`` is an unverified
  allowance until a GPU node is measured. Inference workers (``parallelism``) share one model and graph but each is a
  process with its own runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

from gnnsched.runtime_prior import FLOAT_BYTES, INDEX_BYTES, MAX_LOADER_CORES, step_cost
from gnnsched.spec import GNNJobSpec

MiB = 2**20
GiB = 2**30
RUNTIME_BYTES = 320 * MiB  # measured: RSS after `import torch, torch_geometric` (torch 2.13 CPU, PyG 2.8)
CUDA_RUNTIME_EXTRA_BYTES = 1 * GiB  # allowance, unverified: CUDA libraries and pinned buffers on a GPU node
LOAD_PEAK_FACTOR = 2.5  # measured 2.3 on Cora (see module docstring)
PREFETCH = 2  # PyTorch DataLoader's default prefetch_factor
SAFETY_FACTOR = 1.10


@dataclass(frozen=True)
class HostFootprint:
    """Host bytes by part; ``total_bytes`` (with the safety factor) is the memory floor for scaling."""

    graph_bytes: int
    load_peak_bytes: int
    sampler_bytes: int
    loader_buffer_bytes: int
    runtime_bytes: int
    total_bytes: int


def host_footprint(spec: GNNJobSpec, cpu_cores: float = 1.0, gpu: bool = True) -> HostFootprint:
    """Host memory the job needs with ``cpu_cores`` cores (loader workers scale with cores)."""
    g = spec.graph.resolve()
    graph = 2 * g.edges * INDEX_BYTES + g.nodes * g.features * FLOAT_BYTES + g.nodes * INDEX_BYTES + 3 * g.nodes
    load_peak = int(graph * (LOAD_PEAK_FACTOR - 1.0))
    sampler = buffers = 0
    if spec.batching.mode == "minibatch":
        sampler = ((g.nodes + 1) + g.edges) * INDEX_BYTES
        cost = step_cost(spec)
        per_batch = cost.host_gather_bytes / cost.batches + 2 * INDEX_BYTES * cost.host_sampled_edges / cost.batches
        workers = max(1, int(min(cpu_cores, MAX_LOADER_CORES)))
        buffers = int(per_batch * PREFETCH * workers)
    processes = spec.parallelism if spec.mode == "infer" else 1
    runtime = processes * (RUNTIME_BYTES + (CUDA_RUNTIME_EXTRA_BYTES if gpu else 0))
    total = int((graph + load_peak + sampler + buffers + runtime) * SAFETY_FACTOR)
    return HostFootprint(
        graph_bytes=int(graph), load_peak_bytes=load_peak, sampler_bytes=int(sampler),
        loader_buffer_bytes=buffers, runtime_bytes=int(runtime), total_bytes=total,
    )
