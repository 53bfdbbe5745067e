"""Peak memory (PMC) of one GNN job step, by tracing the job's real PyG model on fake tensors.

How it works. ``estimate(spec)`` builds the job's model with ``gnnsched.models.build_model`` and a graph with the
shapes ``gnnsched.models.make_graph`` would produce, on data-less tensors: tensors carry shapes, strides and dtypes
but no data, so a 100-million-edge graph costs no memory. A dispatch mode sees every operator and every tensor
storage it creates, and a weak reference on each storage records the moment it dies. Replaying that
allocation/free timeline gives the peak of live tensor bytes, the quantity ``torch.profiler``'s allocation events
(and ``torch.cuda.max_memory_allocated``) measure. This is the CoGNN/GNNSched "traverse the computation graph with
tensor liveness" estimate, done by the framework itself instead of per-operator formulas (which are -80 % to +38 %
off on PyG 2.x, see DESIGN.md).

Engines. The default ``engine="meta"`` uses meta-device tensors (what ``FakeTensorMode`` wraps) and memoises output
metadata of repeated functional operators within one trace (functional ``_foreach_*`` operators element by element),
and skips the shape-only re-checks of in-place ``_foreach_*_`` optimizer updates. ``engine="fake"`` runs the same
trace under ``FakeTensorMode`` (same numbers, tested; about twice as slow, and never spliced), as a cross-check.

Deep models (splice). Graph size costs nothing, but every layer costs its operators' dispatch, PyG's Python and
autograd. A model deeper than ``SPLICE_DEPTH`` (5) layers is therefore traced at depth 5 (first layer, three
identical hidden layers, last layer) and its timeline extended to the job's depth by replaying the middle hidden
layer's events once per extra layer, in forward order in the forward pass and in reverse order in the backward pass
(``_splice``). Every event is labelled with the layer running when it happened (forward pre-hooks; in backward the
autograd node's sequence number) and every storage with the layer owning it, so the replayed copies free what the
real copies would free. The replay only reorders allocations within an uninterrupted run of allocations (or frees
within a run of frees), which leaves every live-byte total between runs, hence the peak and its breakdown, exactly
as a full trace gives them; ``tests/test_estimator_splice.py`` checks that run by run against full traces, and a
template that does not have this shape falls back to the full trace. A 10-layer, 100-million-edge GAT training
estimate takes 55-90 ms of CPU on a shared 2-core box (``bench/estimate_latency.py``; the full trace: 100-170 ms).

Steady state. A training step is traced after the optimizer already holds its state: the optimizer's state is
created by one ``optimizer.step()`` on zero gradients (the optimizer's own code, not a copy of its rules), and then
one full ``run_step`` is traced: zero grads, forward, loss, backward, optimizer step. Inference traces one forward
pass under ``torch.no_grad``.

Two corrections make the trace match an untraced run (DESIGN.md, "Facts checked here"):

* Under any Python dispatch mode autograd accumulates gradients out of place (``add`` where a plain run does
  ``add_``; ``index_add`` where ``index_select``'s backward does ``index_add_`` on fresh zeros), which would add up
  to one activation-gradient buffer. When such a backward operator's output has the size of one of its inputs and
  that input dies before the next operator runs, the output is counted as reusing the input's buffer, which is what
  the in-place path does.
* GCN and GAT remove and re-add self-loops through boolean masks, whose number of true entries a fake tensor cannot
  know. The masks come from ``edge_index[0] != edge_index[1]`` (true count = edges - self-loops) and its negation;
  ``GraphLayout.self_loops`` gives the count (0 for synthetic graphs by construction), and a boolean index of unknown
  provenance is sized as all-true (an over-estimate, never an under-estimate). The boolean index's own ``nonzero``
  temporary (8 bytes per kept entry) is counted, as ATen allocates it.

Breakdown at the peak (sums to ``pmc_bytes``): ``weights`` (parameters and buffers), ``optimizer_state``,
``activations`` (the graph's tensors and forward outputs still alive), ``gradients`` (parameter gradients produced
by the traced backward), ``ephemeral`` (everything else live at that instant: activation gradients, backward and
optimizer temporaries).

Device overhead. On ``cpu`` it is 0 and ``admit_bytes`` is the peak times the safety factor. On ``cuda`` the traced
allocation/free sequence, with one cuBLAS workspace per worker thread, is replayed through a model of PyTorch's CUDA
caching allocator (``gnnsched.cuda_allocator``: 512-byte blocks, 2 MiB / 20 MiB / rounded segments, best fit,
splitting, merging within a segment, segments never released), whose peak *reserved* bytes are
``cuda_reserved_bytes``. ``admit_bytes`` is then (CUDA context + MPS client + reserved peak + the GPU model's
``allocator_overhead_fraction`` of it + its ``kernel_scratch_bytes``, the kernels' own scratch no trace shows) times
the safety factor, and ``device_overhead_bytes`` is everything in that
sum beyond ``pmc_bytes``. The context and workspace constants are the GPU model's documented values in
``gnnsched.gpu.catalogue`` (per architecture, each marked measured or assumed), or the ones the job's node measured;
the model was measured on an H100 and an H200 (docs/gpu-measurements.md). A CUDA trace runs the operators CUDA runs
where ATen picks by device above the dispatcher (``CudaOperatorPaths``: dropout's fused kernel).
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch._dynamo
import torch_geometric.nn  # noqa: F401 - same: keep one-time imports out of the timed estimate
from torch._subclasses.fake_tensor import FakeTensorMode

from gnnsched.gpu.catalogue import GPUModel, get_gpu_model
from gnnsched.models import (
    GraphLayout,
    NeighborSampler,
    build_model,
    fake_graph_tensors,
    graph_layout,
    minibatch_bound,
)
from gnnsched.portable.step import run_step
from gnnsched.portable.tracer import (
    _META,
    CATEGORIES,
    CUDA_STEPS,
    CudaOperatorPaths,
    Trace,
    UntraceableModel,
    _categorise,
    _LivenessMode,
    _pair_reused_frees,  # noqa: F401 - re-exported: tests pin the pairing through the estimator's name
    _Record,
    allocator_peak,
    cuda_allocation_events,
    gradient_records,
    prime_optimizer,
    refuse_untraceable,
    resident_records,
    scale_for_workers,
)
from gnnsched.spec import GNNJobSpec, SpecError

Device = Literal["cpu", "cuda"]
Engine = Literal["meta", "fake"]

DEFAULT_SAFETY_FACTOR_CPU = 1.02
"""Margin on the traced peak on CPU: the benchmark's worst case is within 1 % (README, "Estimator")."""
DEFAULT_SAFETY_FACTOR_CUDA = 1.09
"""Margin on a GPU, where kernels and the allocator are not measured here: what a class gets before the closed loop
has its own ratios (``gnnsched.closed_loop``). Chosen from measurement, not the papers' 1.1-1.15: of the 123 cases
measured on real GPUs (an H100's 84, an H200's 39, ``tests/test_gpu_measured_tables.py``), the largest need,
(context + measured reserved) / (context + predicted reserved), is PNA training's 1.069 on the H200; 1.09 covers it
with 2 % to spare. A larger margin is pure cost where estimates are right: at 1.10 two cells of the robustness grid
queued a job that fitted (1.039x and 1.026x the best baseline), at 1.09 none does (docs/simulator.md). A job that
overruns its margin fails alone at its MPS limit and is resized, and its class's ratios then raise the factor."""

@dataclass(frozen=True)
class Estimate:
    """The estimator's answer for one job on one device (the JSON of ``gnnsched estimate --json``).

    ``cuda_reserved_bytes`` / ``cuda_allocated_bytes`` (``None`` on cpu): the caching-allocator model's peak
    reserved and allocated bytes for the traced sequence plus the cuBLAS workspaces (``gnnsched.cuda_allocator``),
    the predictions of ``torch.cuda.max_memory_reserved`` / ``max_memory_allocated``."""

    pmc_bytes: int
    breakdown: dict[str, int]
    device_overhead_bytes: int
    safety_factor: float
    admit_bytes: int
    seconds: float
    cuda_reserved_bytes: int | None = None
    cuda_allocated_bytes: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pmc_bytes": self.pmc_bytes,
            "breakdown": dict(self.breakdown),
            "cuda_reserved_bytes": self.cuda_reserved_bytes,
            "cuda_allocated_bytes": self.cuda_allocated_bytes,
            "device_overhead_bytes": self.device_overhead_bytes,
            "safety_factor": self.safety_factor,
            "admit_bytes": self.admit_bytes,
            "seconds": self.seconds,
        }


def _compile_pyg_templates() -> None:
    """PyG generates each message-passing class's ``propagate`` from a jinja template the first time the class is
    instantiated (about 0.1-0.3 s per class); doing it once at import keeps that out of every timed estimate."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    with torch.device("meta"):
        GCNConv(1, 1), SAGEConv(1, 1), GINConv(torch.nn.Linear(1, 1)), GATConv(1, 1)


_compile_pyg_templates()


SPLICE_DEPTH = 5
"""Layers of the model actually traced for a deeper one (see ``_splice``): the first layer, three identical hidden
layers (the middle one has a hidden layer on both sides, the pattern every repeated layer follows) and the last."""


def trace_step(
    spec: GNNJobSpec,
    layout: GraphLayout | None = None,
    device: Device = "cpu",
    engine: Engine = "meta",
    splice: bool = True,
) -> tuple[Trace, dict[str, int], int]:
    """Trace one steady-state step of ``spec``; returns the trace, the breakdown at the peak and the peak.

    ``engine="meta"`` runs on meta-device tensors with the per-trace memo (fast); ``engine="fake"`` runs under
    ``FakeTensorMode`` (the same numbers, several times slower; kept as a cross-check). Mini-batch jobs trace a
    batch of the largest size the sampler can produce (``minibatch_bound``); on ``cpu`` the full graph and the
    sampler's arrays are resident too, on ``cuda`` they stay in host memory and only batches reach the device.

    With ``splice`` (meta engine only) a model deeper than ``SPLICE_DEPTH`` layers is traced at that depth and its
    timeline extended layer by layer (``_splice``); ``splice=False`` traces every layer (the reference the splice is
    tested against). A template whose layers do not line up as ``_splice`` requires falls back to the full trace.
    """
    layout = layout if layout is not None else graph_layout(spec)
    minibatch = spec.batching.mode == "minibatch"
    step_layout = (
        minibatch_bound(layout, int(spec.batching.batch_size or layout.nodes), spec.fanouts) if minibatch else layout
    )
    layers = spec.model.layers
    # Only the built-in stacks are spliced: their layers repeat exactly (a PyG class may not: jumping knowledge's
    # "cat" widens its last linear layer with the depth), and a full trace of 16 layers is still fast.
    splicing = splice and engine == "meta" and layers > SPLICE_DEPTH and spec.model.arch is not None
    # The template differs from the job only in its depth (the graph, sampler and fanouts stay the job's).
    model_spec = (
        spec.model_copy(update={"model": spec.model.model_copy(update={"layers": SPLICE_DEPTH})}) if splicing else spec
    )
    tracker = _LivenessMode(self_loops=step_layout.self_loops, cpu=device == "cpu")
    tracker.labelling = splicing
    outer = FakeTensorMode(allow_non_fake_inputs=False) if engine == "fake" else nullcontext()
    placement = torch.device("meta") if engine == "meta" else nullcontext()
    paths = CudaOperatorPaths() if device == "cuda" else nullcontext()
    with outer, tracker, paths:
        with placement:
            resident: list[Any] = []
            if minibatch and device == "cpu":
                full = fake_graph_tensors(layout)
                resident.append(NeighborSampler(full, spec))
                del full
            graph = fake_graph_tensors(step_layout)
            model_from = len(tracker.records)
            model = build_model(model_spec, features=layout.features, classes=layout.classes)
            refuse_untraceable(model)
            if engine == "meta" and any(t.device != _META for t in (*model.parameters(), *model.buffers())):
                # A layer that makes a weight with the legacy ``Tensor(n)`` constructor (ResGatedGraphConv's bias)
                # ignores the device context; the real run moves it with the model, so the trace does too
                # (``.to`` keeps the parameter objects, which the optimizer holds).
                model.to(_META)
        optimizer = prime_optimizer(model, spec.mode)
        weights, state = resident_records(tracker, model, optimizer)
        hooks = _label_layers(tracker, model) if splicing else []
        window_start = len(tracker.events)
        tracker.phase = "forward"
        try:
            run_step(model, graph, spec.mode)
        except Exception as exc:
            if spec.model.arch is not None:
                raise
            raise _step_failed(spec, exc) from None
        tracker.finish()
        grads = gradient_records(tracker, model)
        for hook in hooks:
            hook.remove()
        whole = Trace(records=tracker.records, events=list(tracker.events), window_start=window_start)
        trace: Trace | None = whole
        if splicing:
            try:
                trace, (weights, state, grads) = _splice(
                    whole, tracker.labels, tracker.owners, model_from, layers, (weights, state, grads)
                )
            except _SpliceMismatch:
                trace = None
        if trace is not None:
            peak, at = trace.peak()
            breakdown = _categorise(trace, at, weights, state, grads)
        del graph, model, optimizer, resident
    if trace is None:
        return trace_step(spec, layout, device=device, engine=engine, splice=False)
    return trace, breakdown, peak


def _step_failed(spec: GNNJobSpec, exc: Exception) -> SpecError:
    """A PyG class, layer or entrypoint that cannot run one step on the job's graph, as an error naming the field.
    An entrypoint is traced on data-less tensors: code that reads values cannot run there."""
    kind = spec.model.kind
    hint = (
        " (the model must not read tensor values: no .item(), .tolist() or shapes that depend on values)"
        if kind == "entrypoint" else " (a GNNJob's graph gives node features and edges, no edge features)"
    )
    return SpecError(f"spec.model.{kind}", f"{getattr(spec.model, kind)} cannot run one step on the job's graph"
                     f"{hint}: {type(exc).__name__}: {exc}")


def _label_layers(tracker: _LivenessMode, model: Any) -> list[Any]:
    """Attribute the resident records (weights, their gradients and optimizer state) to their layers, tell the
    tracker which layer each parameter belongs to, and hook every layer's forward to label the events it causes."""
    layer_of: dict[int, int] = {}
    for layer, conv in enumerate(model.convs, start=1):
        for t in list(conv.parameters()) + list(conv.buffers()):
            layer_of[id(t)] = layer
    optimizer = getattr(model, "optimizer", None)
    for p in list(model.parameters()) + list(model.buffers()):
        layer = layer_of.get(id(p), 0)
        owned = [p, p.grad] + ([] if optimizer is None else list(optimizer.state.get(p, {}).values()))
        for t in owned:
            if isinstance(t, torch.Tensor):
                rec = tracker.record_of(t)
                if rec is not None:
                    tracker.owners[rec] = layer
    tracker.param_layers = [layer_of.get(id(p), 0) for p in model.parameters()]
    tracker.block = 0
    return [
        conv.register_forward_pre_hook(lambda _module, args, layer=layer: tracker.enter_layer(layer, args[0]))
        for layer, conv in enumerate(model.convs, start=1)
    ]


class _SpliceMismatch(Exception):
    """The template trace does not have the layer structure ``_splice`` relies on (the caller traces in full)."""


def _splice(
    template: Trace,
    labels: list[int],
    owners: list[int],
    model_from: int,
    layers: int,
    sets: tuple[set[int], set[int], set[int]],
) -> tuple[Trace, tuple[set[int], set[int], set[int]]]:
    """The timeline of the ``layers``-deep model, built from the trace of its ``SPLICE_DEPTH``-layer template.

    Template layers are 1 (first), 2, 3, 4 (hidden, same shapes) and 5 (last); target layer 1 is template layer 1,
    2 is 2, 3 .. L-2 are copies of 3 (a hidden layer between two hidden layers), L-1 is 4 and L is 5. Every window
    event carries the layer it happened in (forward: the layer whose forward was running; backward: the layer whose
    autograd node was running; 0 = none: before the first layer, the optimizer) and every record the layer that
    owns it (allocated in its forward or backward, or its weights, gradients, optimizer state, or a ``_foreach_``
    output for its parameters; 0 = the graph and other single allocations).

    The window is rebuilt group by group: a run of events of layer t is replayed for each target layer mapped to t
    (copies of 3 in layer order, forwards ascending and backwards descending), a reference to a record of the
    neighbouring layer t+-1 becoming one to the target's neighbour (through the allocation-order correspondence of
    the identical layers 2, 3 and 4); an unattributed event (layer 0) on a layer-3 record is repeated for every copy
    next to it. Such events come in runs of one sign in a real trace too (a ``_foreach_`` operator allocates one
    output per parameter at once, ``zero_grad`` and a dying output list free them at once), so the result differs
    from a full trace only in the order within a run of allocations (or of frees), which leaves every live-byte
    total between runs, hence the peak and its breakdown, unchanged. The setup before the window is replaced by the
    allocations live at its start (all the peak reads of it). Anything that does not fit this shape raises
    ``_SpliceMismatch``; ``tests/test_estimator_splice.py`` and ``bench/pmc_accuracy.py --check-splice`` (every grid
    case at depths 6-16, cpu and cuda) compare spliced and full traces run by run.
    """
    depth, last = SPLICE_DEPTH, layers
    if len(labels) != len(template.events) or len(owners) != len(template.records):
        raise _SpliceMismatch("labels do not cover the trace")
    records, events, start = template.records, template.events, template.window_start

    single = {0: 0, 1: 1, 2: 2, 4: last - 1, 5: last}  # template layer -> its one target layer (0: no layer)

    def targets(owner: int) -> range:
        """Target layers a template layer's records stand for (the copies, for layer 3)."""
        if owner == 3:
            return range(3, last - 1)
        return range(single[owner], single[owner] + 1)

    def template_of(layer: int) -> int:
        if layer <= 2:
            return layer
        if layer >= last - 1:
            return layer - last + depth
        return 3

    # Window groups: maximal runs of one label. Labelled groups must read 1..5 (forward) then 4..1 (backward).
    groups: list[tuple[int, int, int]] = []
    for i in range(start, len(events)):
        if groups and groups[-1][0] == labels[i]:
            groups[-1] = (labels[i], groups[-1][1], i + 1)
        else:
            groups.append((labels[i], i, i + 1))
    inner = [g for g in groups if g[0] != 0]
    expected = list(range(1, depth + 1)) + list(range(depth - 1, 0, -1))
    if [g[0] for g in inner] not in (expected, expected[:depth]):
        raise _SpliceMismatch(f"layer order {[g[0] for g in inner]}")
    if inner and any(g[0] == 0 for g in groups[groups.index(inner[0]) : groups.index(inner[-1])]):
        raise _SpliceMismatch("unattributed events between layers")

    # Correspondence of the identical hidden layers' records: k-th allocation of a group of layer 2 or 4 <-> the
    # k-th allocation of the same pass's group of layer 3.
    allocated: dict[int, list[int]] = {}  # group index -> record indices allocated in it
    group_at = {}
    for gi, (_, g0, g1) in enumerate(groups):
        for i in range(g0, g1):
            group_at[i] = gi
    for r in range(len(records)):
        owner = group_at.get(records[r].alloc_at)
        if owner is not None:
            allocated.setdefault(owner, []).append(r)
    weights, state, grads = sets

    def kind(r: int) -> tuple:
        return (records[r].nbytes, records[r].phase, r in weights, r in state, r in grads)

    corr: dict[int, dict[int, int]] = {2: {}, 4: {}}
    for pass_no in range(2 if len(inner) > depth else 1):
        by_layer = {}
        for layer in (2, 3, 4):
            g = inner[layer - 1] if pass_no == 0 else inner[2 * depth - 1 - layer]
            by_layer[layer] = allocated.get(groups.index(g), [])
        for layer in (2, 4):
            a, b = by_layer[layer], by_layer[3]
            if len(a) != len(b) or any(kind(x) != kind(y) for x, y in zip(a, b, strict=True)):
                raise _SpliceMismatch(f"hidden layers {layer} and 3 allocate differently")
            corr[layer].update(zip(a, b, strict=True))

    out_records: list[_Record] = []
    out_events: list[tuple[int, int] | None] = []
    index: dict[tuple[int, int], int] = {}
    out_sets: tuple[set[int], set[int], set[int]] = (set(), set(), set())
    freed: set[int] = set()

    member: dict[int, list[int]] = {}  # template record -> the category sets (weights, state, grads) it is in
    for k, src in enumerate(sets):
        for r in src:
            member.setdefault(r, []).append(k)

    def new_record(key: tuple[int, int]) -> int:
        r = key[1]
        idx = len(out_records)
        index[key] = idx
        out_records.append(_Record(records[r].nbytes, records[r].phase, len(out_events), marker=records[r].marker))
        for k in member.get(r, ()):
            out_sets[k].add(idx)
        return idx

    def emit(sign: int, key: tuple[int, int]) -> None:
        if sign > 0:
            if key in index:
                raise _SpliceMismatch(f"record {key} allocated twice")
            idx = new_record(key)
        else:
            idx = index.get(key, -1)
            if idx < 0 and events[records[key[1]].alloc_at] is None:
                # An accumulation output counted in its input's buffer (the in-place correction cancelled its
                # allocation and the input's free): its own free stands for that buffer's, as in the template.
                idx = new_record(key)
            elif idx < 0 or idx in freed:
                raise _SpliceMismatch(f"record {key} freed before allocation or twice")
            freed.add(idx)
            out_records[idx].free_at = len(out_events)
        out_events.append((sign, idx))

    def reference(layer: int, template_layer: int, r: int) -> tuple[int, int]:
        owner = owners[r]
        if owner == 0:
            return (0, r)
        if owner != 3 and template_layer != 3:  # both layers occur once in the target
            return (targets(owner)[0], r)
        shift = owner - template_layer
        if abs(shift) > 1:
            raise _SpliceMismatch(f"layer {template_layer} touches a record of layer {owner}")
        other = layer + shift
        if template_of(other) == owner:
            return (other, r)
        mapped = corr.get(owner, {}).get(r)
        if mapped is None:
            raise _SpliceMismatch(f"no layer-3 counterpart of record {r} of layer {owner}")
        return (other, mapped)

    # Before the window: what is live at its start, layer-3 records once per copy.
    for r in template.live_at(start):
        if owners[r] == 0 and r >= model_from:
            raise _SpliceMismatch(f"resident record {r} belongs to no layer")
        for layer in targets(owners[r]):
            emit(1, (layer, r))
    window_start = len(out_events)

    passes_seen: dict[int, int] = {}
    for label, g0, g1 in groups:
        if label == 0:
            for ev in events[g0:g1]:
                if ev is not None:
                    sign, r = ev
                    for layer in targets(owners[r]):
                        emit(sign, (layer, r) if owners[r] else (0, r))
            continue
        pass_no = passes_seen.get(label, 0)
        passes_seen[label] = pass_no + 1
        copies = list(targets(label))
        for layer in copies if pass_no == 0 else reversed(copies):
            for ev in events[g0:g1]:
                if ev is not None:
                    emit(ev[0], reference(layer, label, ev[1]))
    return Trace(records=out_records, events=out_events, window_start=window_start, traced_layers=depth), out_sets


def _cuda_device_terms(trace: Trace, peak: int, gpu: GPUModel, workers: int) -> tuple[int, int, int]:
    """(overhead over ``peak``, peak reserved, peak allocated) on ``gpu``: the allocator model's reserved peak (with
    the cuBLAS workspaces) plus the optional fragmentation allowance, and the per-process CUDA context and MPS
    client costs the allocator never sees."""
    result = allocator_peak(trace, workers, gpu.cublas_workspace_bytes, gpu.cublaslt_workspace_bytes)
    return device_overhead(gpu, peak, result.reserved_bytes), result.reserved_bytes, result.allocated_bytes


def device_overhead(gpu: GPUModel, peak: int, reserved: int) -> int:
    """Bytes a job takes on ``gpu`` beyond its traced ``peak``, given the allocator model's ``reserved`` peak: the
    reserved peak's excess over the live bytes, the GPU model's fragmentation allowance on it, the kernels' scratch
    segments no trace shows (``kernel_scratch_bytes``), and the per-process CUDA context and MPS client costs the
    allocator never sees. The operator applies it to a probe's result too."""
    allowance = math.ceil(gpu.allocator_overhead_fraction * reserved)
    return gpu.context_bytes + gpu.mps_client_bytes + reserved + allowance + gpu.kernel_scratch_bytes - peak


def admit_bytes(peak: int, overhead: int, safety_factor: float) -> int:
    """What a job is admitted with: its peak and device overhead times the safety factor (on a GPU the calibrated
    factor is observed / predicted device memory, and NVML's observation includes the context)."""
    return math.ceil((peak + overhead) * safety_factor)


def estimate(
    spec: GNNJobSpec,
    device: Device = "cpu",
    gpu_model: str | GPUModel | None = None,
    safety_factor: float | None = None,
    layout: GraphLayout | None = None,
    engine: Engine = "meta",
) -> Estimate:
    """Peak memory of one job step (see the module docstring); raises ``KeyError`` for an unknown GPU model.

    ``parallelism: N`` inference counts the weights and graph once and N concurrent forward passes' working sets
    (the worst case where all N workers peak together).
    """
    started = time.perf_counter()
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device: must be cpu or cuda, got {device!r}")
    trace, breakdown, peak = trace_step(spec, layout, device=device, engine=engine)
    workers = spec.parallelism if spec.mode == "infer" else 1
    peak, breakdown = scale_for_workers(trace, peak, breakdown, workers)
    reserved: int | None = None
    allocated: int | None = None
    if device == "cuda":
        if gpu_model is None:
            from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL

            gpu_model = DEFAULT_GPU_MODEL
        gpu = gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model)
        overhead, reserved, allocated = _cuda_device_terms(trace, peak, gpu, workers)
        factor = DEFAULT_SAFETY_FACTOR_CUDA if safety_factor is None else safety_factor
        admit = admit_bytes(peak, overhead, factor)  # context + MPS client + reserved peak, times the factor
    elif device == "cpu":
        overhead = 0
        factor = DEFAULT_SAFETY_FACTOR_CPU if safety_factor is None else safety_factor
        admit = math.ceil(peak * factor)
    else:
        raise ValueError(f"device: must be cpu or cuda, got {device!r}")
    return Estimate(
        pmc_bytes=int(peak),
        breakdown={k: int(v) for k, v in breakdown.items()},
        device_overhead_bytes=int(overhead),
        safety_factor=factor,
        admit_bytes=int(admit),
        seconds=round(time.perf_counter() - started, 6),
        cuda_reserved_bytes=reserved,
        cuda_allocated_bytes=allocated,
    )


__all__ = [
    "CATEGORIES", "CUDA_STEPS", "Estimate", "Trace", "UntraceableModel", "admit_bytes", "cuda_allocation_events",
    "device_overhead", "estimate", "trace_step",
]
