"""Analytic solo runtime of a GNNJob on a named GPU model: a roofline-style sum over the kernels of one step.

Why analytic: the cluster has no history for a job it has never run, and GNN layers are dominated by two kernels
whose cost is easy to count — a dense transform (FLOPs bound) and a sparse gather/scatter over edges (bytes bound).
Each kernel costs ``bytes / bandwidth + FLOPs / peak`` (a sum, not a max: it is a prior, deliberately pessimistic
for kernels that overlap the two) plus a launch latency; a step is a forward pass (inference request) or forward +
backward (≈ 2× forward) + an Adam update (training epoch). The XGBoost residual in ``gnnsched.predictor.gnn`` learns
the factor this prior is off by on the cluster's real GPUs; the simulator uses the prior alone for solo runtimes.

Mini-batch jobs add host work — neighbour sampling and the feature gather on CPU cores, then a PCIe copy — that
data-loader workers pipeline with the GPU, so a batch costs ``max(host, device)``. This is the only place CPU cores
enter, which is what makes adaptive scaling of CPU meaningful for GNN jobs: full-batch jobs need about one core.

The GPU constants below are engineering assumptions (orders of magnitude from vendor specs and PyG's sampler), NOT
measured on a GPU here; the residual model exists to correct them. ``CPU_RATES`` is the exception: the same cost model
refit to the CPU worker's measured steps (``bench/runtime_truth.py``). Units: bytes, FLOPs, seconds, fp32 (4-byte)
features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gnnsched.gpu.catalogue import GPUModel, get_gpu_model
from gnnsched.spec import GNNJobSpec, layer_dims

FLOAT_BYTES = 4
INDEX_BYTES = 8  # PyG edge_index is int64
KERNEL_LAUNCH_SECONDS = 10e-6  # assumption: CUDA launch + PyTorch dispatch per kernel
KERNELS_PER_LAYER = 6  # assumption: gather/scatter, matmul, bias, activation, dropout, norm
HOST_SAMPLED_EDGES_PER_CORE_S = 5e6  # assumption: PyG neighbour sampler throughput per core
HOST_GATHER_BYTES_PER_CORE_S = 4e9  # assumption: feature-row gather on one core (memory-bound copy)
PCIE_BYTES_PER_S = 12e9  # assumption: PCIe 3.0 x16 effective host-to-device
MAX_LOADER_CORES = 8.0  # assumption: more sampler workers than this stop helping (PyG guidance: 4-8)
DEFAULT_CPU_CORES = 4.0  # when neither the caller nor the spec says how many cores the job gets
TRAIN_BACKWARD_FACTOR = 2.0  # backward ≈ 2× forward (gradients w.r.t. inputs and weights)
ADAM_BYTES_PER_PARAM = 4 * FLOAT_BYTES * 2  # read+write of weight, grad, two moments


@dataclass(frozen=True)
class StepCost:
    """GPU and host work of one step (one epoch when training, one request when inferring)."""

    flops: float
    bytes: float
    kernels: int
    host_sampled_edges: float  # neighbour-sampling work (mini-batch only)
    host_gather_bytes: float  # features gathered on the host and copied to the device (mini-batch only)
    batches: int  # device passes per step (1 for full-batch)
    params: int


FAMILIES = ("gcn", "sage", "gin", "gat")
"""The four layer costs (``cost_family``)."""


@dataclass(frozen=True)
class CpuRates:
    """What one worker step costs on a number of CPU cores, per unit of each ``StepCost`` count: seconds per kernel
    (PyTorch's per-operator dispatch), device bytes per second for each layer family (a GCN's scatter and a GAT's
    edge softmax move bytes at different speeds on a CPU: measured, see ``gnnsched/data/runtime_truth.json``), FLOPs
    per second, sampled edges and gathered feature bytes per second. Fitted to measured steps by
    ``gnnsched.runtime_fit`` (``bench/runtime_truth.py``); infinite where the fit gave a term no weight."""

    launch_seconds: float
    bytes_per_s: dict[str, float]
    flops_per_s: float
    sampled_edges_per_s: float
    gather_bytes_per_s: float

    def seconds(self, counts: tuple[float, float, float, float, float], family: str) -> float:
        """Seconds of one step of a ``family`` model from its ``step_counts``: on the CPU every term runs on the
        same cores, so they add."""
        kernels, byts, flops, edges, gather = counts
        return (kernels * self.launch_seconds + byts / self.bytes_per_s[family] + flops / self.flops_per_s
                + edges / self.sampled_edges_per_s + gather / self.gather_bytes_per_s)


CPU_RATES: dict[int, CpuRates] = {
    1: CpuRates(launch_seconds=1.96e-4, bytes_per_s={"gcn": 8.912e8, "sage": 1.859e9, "gin": 1.301e9, "gat": 5.32e8},
                flops_per_s=6.396e10, sampled_edges_per_s=2.577e6, gather_bytes_per_s=math.inf),
    2: CpuRates(launch_seconds=1.748e-4, bytes_per_s={"gcn": 1.199e9, "sage": 2.826e9, "gin": 1.855e9, "gat": 8.032e8},
                flops_per_s=1.233e11, sampled_edges_per_s=2.97e6, gather_bytes_per_s=9.051e10),
}
"""The CPU worker's rates at 1 and 2 cores, fitted by ``gnnsched.runtime_fit`` on two jobs in three of
``gnnsched/data/runtime_truth.json`` (80 jobs measured by ``python bench/runtime_truth.py --jobs 80
--target-seconds 0.5`` on the 2-core build machine; held-out WMAPE 0.41, per model class in docs/predictor.md).
Measured, unlike the GPU constants above: they predict ``gnnsched worker --device cpu`` (the local cluster's workers),
and their held-out residuals are what ``gnnsched simulate --runtime-error measured`` draws. Refit with
``python bench/runtime_truth.py --refit``; ``tests/test_runtime_truth.py`` fails while these and the table differ.
A launch cost of ~0.2 ms per counted kernel is PyTorch's CPU dispatch of the several operators each counted kernel
stands for, not a CUDA launch."""


def _layer_cost(
    arch: str, n_src: float, n_dst: float, e: float, din: int, dout: int, heads: int
) -> tuple[float, float, int]:
    """(FLOPs, bytes, params) of one layer's forward pass over ``e`` edges from ``n_src`` to ``n_dst`` nodes."""
    f = FLOAT_BYTES
    idx = 2 * INDEX_BYTES * e
    if arch == "gcn":  # transform then normalised sum over edges (edge weights are floats)
        flops = 2 * n_src * din * dout + 2 * e * dout
        byts = f * (n_src * din + din * dout + n_src * dout) + f * (e * dout + n_dst * dout + e) + idx
        params = din * dout + dout
    elif arch == "sage":  # mean over neighbours, then root and neighbour linears
        flops = e * din + 4 * n_dst * din * dout
        byts = f * (e * din + n_dst * din) + idx + f * (2 * n_dst * din + 2 * din * dout + n_dst * dout)
        params = 2 * din * dout + dout
    elif arch == "gin":  # sum over neighbours, then a two-layer MLP
        flops = e * din + 2 * n_dst * (din * dout + dout * dout)
        byts = f * (e * din + n_dst * din) + idx + f * (n_dst * din + 3 * n_dst * dout + din * dout + dout * dout)
        params = din * dout + dout * dout + 2 * dout
    elif arch == "gat":  # per-head transform, edge attention (score, leaky-relu, softmax), weighted sum
        width = heads * dout
        flops = 2 * n_src * din * width + e * heads * (8 + 2 * dout)
        byts = f * (n_src * din + din * width + n_src * width) + f * e * heads * (4 + dout) + f * n_dst * width + idx
        params = din * width + 3 * width
    else:  # pragma: no cover - the spec's Literal forbids it
        raise ValueError(f"spec.model.arch: unknown {arch!r}")
    return float(flops), float(byts), int(params)


COST_FAMILY = {"GCN": "gcn", "GraphSAGE": "sage", "GIN": "gin", "GAT": "gat", "EdgeCNN": "gin", "PNA": "sage",
               "GCNConv": "gcn", "SGConv": "gcn", "ClusterGCNConv": "gcn", "GraphConv": "gcn", "LEConv": "gcn",
               "SAGEConv": "sage", "GINConv": "gin"}
"""The layer cost each PyG class or layer is counted as (``cost_family``)."""


def cost_family(spec: GNNJobSpec) -> str:
    """Which of the four layer costs the prior counts a model with. The built-in archs are themselves. A PyG class
    or layer is counted as the cost it resembles: attention layers (a ``heads`` option, or GAT/Transformer/GATv2)
    as ``gat``, the classes in ``COST_FAMILY`` as listed, anything else (and a user's entrypoint, whose layers the
    prior cannot see) as ``sage``: a neighbour gather and two dense transforms per layer at width ``hidden``. This
    is an assumption, not a measurement; the runtime factor the cluster learns per model class corrects it."""
    model = spec.model
    if model.arch is not None:
        return model.arch
    name = model.pyg or model.conv or ""
    if "heads" in (model.options or {}) or name in ("GATv2Conv", "TransformerConv", "GATConv", "SuperGATConv"):
        return "gat"
    return COST_FAMILY.get(name, "sage")


def step_cost(spec: GNNJobSpec) -> StepCost:
    """Count one step's work from the spec (see module docstring for the model)."""
    g = spec.graph.resolve()
    dims = layer_dims(spec, g.features, g.classes)
    avg_degree = g.edges / max(g.nodes, 1)
    train = spec.mode == "train"
    if spec.batching.mode == "minibatch":
        batch = min(spec.batching.batch_size or g.nodes, g.nodes)
        batches = math.ceil(g.nodes / batch) if train else 1  # an epoch covers every node; a request one batch
        # Sizes outward from the seeds: layer l consumes nodes[l] sources to produce nodes[l+1] destinations.
        fanouts = spec.fanouts
        sizes = [float(batch)]
        edges: list[float] = []
        for fanout in fanouts:  # hop 1 (nearest the seeds) first; the first layer consumes the outermost hop
            sampled = sizes[0] * min(fanout, avg_degree)
            edges.insert(0, sampled)
            sizes.insert(0, min(float(g.nodes), sizes[0] + sampled))
        passes = []
        for layer, (din, dout, heads) in enumerate(dims):
            passes.append((sizes[layer], sizes[layer + 1], edges[layer], din, dout, heads))
        host_edges = sum(edges) * batches
        host_bytes = sizes[0] * g.features * FLOAT_BYTES * batches
    else:
        batches = 1
        passes = [(float(g.nodes), float(g.nodes), float(g.edges), din, dout, heads) for din, dout, heads in dims]
        host_edges = 0.0
        host_bytes = 0.0
    flops = byts = 0.0
    params = 0
    family = cost_family(spec)
    for n_src, n_dst, e, din, dout, heads in passes:
        lf, lb, lp = _layer_cost(family, n_src, n_dst, e, din, dout, heads)
        flops, byts, params = flops + lf, byts + lb, params + lp
    kernels = KERNELS_PER_LAYER * len(dims)
    if train:
        flops *= 1 + TRAIN_BACKWARD_FACTOR
        byts = byts * (1 + TRAIN_BACKWARD_FACTOR) + ADAM_BYTES_PER_PARAM * params
        kernels = int(kernels * (1 + TRAIN_BACKWARD_FACTOR)) + 4
    return StepCost(
        flops=flops * batches, bytes=byts * batches, kernels=kernels * batches,
        host_sampled_edges=host_edges, host_gather_bytes=host_bytes, batches=batches, params=params,
    )


def _gpu(gpu_model: GPUModel | str) -> GPUModel:
    return gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model)


def device_seconds_per_step(spec: GNNJobSpec, gpu_model: GPUModel | str, cost: StepCost | None = None) -> float:
    cost = cost or step_cost(spec)
    gpu = _gpu(gpu_model)
    return cost.bytes / gpu.bandwidth_bytes_per_s + cost.flops / gpu.fp32_flops_per_s


def host_seconds_per_step(spec: GNNJobSpec, cpu_cores: float, cost: StepCost | None = None,
                          core_exponent: float = 1.0) -> float:
    """Sampling + gather on ``cpu_cores`` (capped at ``MAX_LOADER_CORES``) + PCIe copy; full-batch: launch overhead,
    which runs on one thread and slows down only when the job gets less than one core.

    ``core_exponent``: host work scales as ``cores ** -core_exponent``. The prior assumes 1 (loader workers split
    the sampling perfectly); the simulator passes the exponent ``bench/runtime_truth.py`` measured, so a scaled job's
    true slowdown is not the scaler's own assumption."""
    if cpu_cores <= 0:
        raise ValueError(f"cpu: {cpu_cores} must be positive")
    cost = cost or step_cost(spec)
    launch = cost.kernels * KERNEL_LAUNCH_SECONDS / min(cpu_cores, 1.0)
    if cost.host_sampled_edges == 0:
        return launch
    cores = min(cpu_cores, MAX_LOADER_CORES) ** core_exponent
    sampling = cost.host_sampled_edges / (HOST_SAMPLED_EDGES_PER_CORE_S * cores)
    gather = cost.host_gather_bytes / (HOST_GATHER_BYTES_PER_CORE_S * cores)
    return launch + sampling + gather + cost.host_gather_bytes / PCIE_BYTES_PER_S


def solo_runtime_seconds(
    spec: GNNJobSpec, gpu_model: GPUModel | str, cpu_cores: float | None = None, cost: StepCost | None = None,
    core_exponent: float = 1.0,
) -> float:
    """Predicted runtime of the whole job alone on one GPU of ``gpu_model`` with ``cpu_cores`` cores.

    ``cpu_cores`` defaults to the spec's CPU request, else ``DEFAULT_CPU_CORES``. Host and device work of a step
    overlap (loader workers prefetch), so a step costs the larger of the two, plus launch latency.
    ``core_exponent``: see :func:`host_seconds_per_step`.
    """
    if cpu_cores is None:
        cpu_cores = spec.resources.cpu_cores() or DEFAULT_CPU_CORES
    cost = cost or step_cost(spec)
    device = device_seconds_per_step(spec, gpu_model, cost)
    host = host_seconds_per_step(spec, cpu_cores, cost, core_exponent)
    return spec.steps * max(device, host)


def arithmetic_intensity(spec: GNNJobSpec, cost: StepCost | None = None) -> float:
    """FLOPs per byte moved on the device for one step: the roofline's x-axis. GNN aggregation is ~0.25-1 FLOP/B;
    compare with a GPU's ridge point (peak / bandwidth, e.g. 9.6 on A100-80GB) to call a job memory- or
    compute-bound (``intensity_class``)."""
    cost = cost or step_cost(spec)
    return cost.flops / cost.bytes if cost.bytes > 0 else 0.0


def intensity_class(spec: GNNJobSpec, gpu_model: GPUModel | str) -> Literal["memory", "compute"]:
    """``memory`` or ``compute``: which side of the GPU's ridge point the job's arithmetic intensity falls."""
    gpu = _gpu(gpu_model)
    ridge = gpu.fp32_flops_per_s / gpu.bandwidth_bytes_per_s
    return "compute" if arithmetic_intensity(spec) >= ridge else "memory"


def worker_step_cost(spec: GNNJobSpec) -> StepCost:
    """The cost of one *worker* step: what ``gnnsched worker`` times between two progress calls. The prior counts a
    training epoch of a mini-batch job as one step (all its batches); the worker's step is one batch, so the epoch's
    counts are divided by its batches. Other jobs' steps are the same in both."""
    cost = step_cost(spec)
    if cost.batches <= 1:
        return cost
    n = float(cost.batches)
    return StepCost(flops=cost.flops / n, bytes=cost.bytes / n, kernels=max(1, round(cost.kernels / n)),
                    host_sampled_edges=cost.host_sampled_edges / n, host_gather_bytes=cost.host_gather_bytes / n,
                    batches=1, params=cost.params)


def step_counts(cost: StepCost) -> tuple[float, float, float, float, float]:
    """The five counts ``CpuRates`` divide: kernels, device bytes, FLOPs, sampled edges, gathered bytes."""
    return (float(cost.kernels), cost.bytes, cost.flops, cost.host_sampled_edges, cost.host_gather_bytes)


def cpu_seconds_per_step(spec: GNNJobSpec, cpu_cores: float) -> float:
    """Predicted seconds of one worker step of ``spec`` run on the CPU (``gnnsched worker --device cpu``) with
    ``cpu_cores`` cores, from the measured ``CPU_RATES`` of the nearest measured core count (1 or 2: nothing above
    2 cores was measured, so more cores are predicted as 2)."""
    if cpu_cores <= 0:
        raise ValueError(f"cpu: {cpu_cores} must be positive")
    nearest = min(CPU_RATES, key=lambda c: (abs(c - cpu_cores), c))
    return CPU_RATES[nearest].seconds(step_counts(worker_step_cost(spec)), cost_family(spec))

