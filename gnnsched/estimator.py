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
metadata of repeated functional operators within one trace, and skips the shape-only re-checks of in-place
``_foreach_*_`` optimizer updates; that keeps a 10-layer trace well under 150 ms. ``engine="fake"`` runs the same
trace under ``FakeTensorMode`` (same numbers, tested; about twice as slow), as a cross-check.

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

Device overhead. On ``cpu`` it is 0. On ``cuda`` it adds, per the GPU model's documented constants in
``gnnsched.gpus`` (unverified until a GPU measures them): the CUDA context, one cuBLAS workspace per worker thread,
the MPS client's own footprint, the caching allocator's rounding of each traced allocation (computed from the trace:
the peak of rounded block sizes minus the peak of exact sizes) and a fragmentation allowance
(``allocator_overhead_fraction`` of the peak).
"""

from __future__ import annotations

import math
import time
import weakref
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch._dynamo  # noqa: F401 - imported here, not inside the first trace (dispatch modes pull it in lazily)
import torch_geometric.nn  # noqa: F401 - same: keep one-time imports out of the timed estimate
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from gnnsched.gpus import GPUModel, get_gpu_model
from gnnsched.models import (
    GraphLayout,
    NeighborSampler,
    build_model,
    fake_graph_tensors,
    graph_layout,
    minibatch_bound,
    run_step,
)
from gnnsched.spec import GNNJobSpec

Device = Literal["cpu", "cuda"]
Engine = Literal["meta", "fake"]
CATEGORIES = ("weights", "optimizer_state", "activations", "gradients", "ephemeral")

DEFAULT_SAFETY_FACTOR_CPU = 1.02
"""Margin on the traced peak on CPU: the benchmark's worst case is within 1 % (README, "Estimator")."""
DEFAULT_SAFETY_FACTOR_CUDA = 1.10
"""Margin on a GPU, where kernels and the allocator are not measured here; the low end of the papers' 1.1-1.15."""

_aten = torch.ops.aten
_INPLACE_IN_PLAIN_RUN = {_aten.add.Tensor, _aten.index_add.default}
"""Backward ops autograd runs in place outside a dispatch mode (gradient accumulation, index_select's backward)."""


@dataclass(frozen=True)
class Estimate:
    """The estimator's answer for one job on one device (the JSON of ``gnnsched estimate --json``)."""

    pmc_bytes: int
    breakdown: dict[str, int]
    device_overhead_bytes: int
    safety_factor: float
    admit_bytes: int
    seconds: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "pmc_bytes": self.pmc_bytes,
            "breakdown": dict(self.breakdown),
            "device_overhead_bytes": self.device_overhead_bytes,
            "safety_factor": self.safety_factor,
            "admit_bytes": self.admit_bytes,
            "seconds": self.seconds,
        }


@dataclass
class _Record:
    """One storage's life in the trace."""

    nbytes: int
    phase: str  # setup | forward | backward | optimizer
    alloc_at: int  # index into the event list
    free_at: int | None = None


@dataclass(frozen=True)
class Trace:
    """The traced timeline: ``events`` holds ``(+1 | -1, record index)`` in program order (``None`` = cancelled)."""

    records: list[_Record]
    events: list[tuple[int, int] | None]
    window_start: int  # first event of the measured step

    def peak(self, rounding: int | None = None) -> tuple[int, int]:
        """(peak live bytes over the measured step, event index of the peak); live bytes at its start count too."""
        live = 0
        best, best_at = -1, self.window_start
        for i, ev in enumerate(self.events):
            if i == self.window_start and live > best:
                best, best_at = live, i
            if ev is None:
                continue
            sign, idx = ev
            live += sign * _round(self.records[idx].nbytes, rounding)
            if i >= self.window_start and live > best:
                best, best_at = live, i + 1
        if best < 0:
            best, best_at = live, len(self.events)
        return best, best_at

    def live_at(self, position: int) -> list[int]:
        """Indices of the records allocated before event ``position`` and not freed before it."""
        alive: dict[int, None] = {}
        for ev in self.events[:position]:
            if ev is None:
                continue
            sign, idx = ev
            if sign > 0:
                alive[idx] = None
            else:
                alive.pop(idx, None)
        return list(alive)


def _round(nbytes: int, rounding: int | None) -> int:
    """CUDA caching-allocator block size for a request (None = exact bytes).

    PyTorch rounds requests up to 512 bytes, and requests above 1 MiB to a multiple of 2 MiB (``kMinBlockSize``,
    ``kRoundLarge`` in c10/cuda/CUDACachingAllocator.cpp); ``rounding`` is the small-block granularity.
    """
    if rounding is None or nbytes == 0:
        return nbytes
    if nbytes <= 1 << 20:
        return -(-nbytes // rounding) * rounding
    return -(-nbytes // (2 << 20)) * (2 << 20)


class _LivenessMode(TorchDispatchMode):
    """Records every storage an operator creates and when it dies; applies the two corrections described above."""

    def __init__(self, self_loops: int) -> None:
        super().__init__()
        self.self_loops = self_loops
        self.records: list[_Record] = []
        self.events: list[tuple[int, int] | None] = []
        self._by_storage: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._pending: list[tuple[int, list[int]]] = []
        self._mask_true: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._cacheable: dict[Any, bool] = {}
        self._inplace_void: set[Any] = set()
        self._memo: dict[tuple, tuple[bool, list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]]] = {}
        self.phase = "setup"

    # --- bookkeeping -------------------------------------------------------------------------------------------

    def _freed(self, idx: int) -> None:
        self.records[idx].free_at = len(self.events)
        self.events.append((-1, idx))
        self._refs.pop(idx, None)

    def track(self, tensor: torch.Tensor) -> int | None:
        """Register ``tensor``'s storage if new; returns its record index (None for an already-known storage)."""
        storage = tensor.untyped_storage()
        if storage in self._by_storage:
            return None
        idx = len(self.records)
        self.records.append(_Record(nbytes=storage.nbytes(), phase=self.phase, alloc_at=len(self.events)))
        self.events.append((1, idx))
        self._by_storage[storage] = idx
        self._refs[idx] = weakref.ref(storage, lambda _ref, idx=idx: self._freed(idx))
        return idx

    def record_of(self, tensor: torch.Tensor) -> int | None:
        return self._by_storage.get(tensor.untyped_storage())

    def finish(self) -> None:
        """Apply the in-place correction to the last operator of the trace."""
        self._settle_pending()

    def _settle_pending(self) -> None:
        """Cancel the out-of-place allocation of an accumulation whose input died right after it (in-place reuse)."""
        for out_idx, candidates in self._pending:
            out = self.records[out_idx]
            for in_idx in candidates:
                rec = self.records[in_idx]
                if rec.free_at is not None and rec.free_at > out.alloc_at and self.events[rec.free_at] is not None:
                    self.events[out.alloc_at] = None
                    self.events[rec.free_at] = None
                    break
        self._pending.clear()

    # --- dispatch ----------------------------------------------------------------------------------------------

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if self._pending:
            self._settle_pending()
        if self.phase in ("forward", "backward", "optimizer"):
            in_backward = torch._C._current_autograd_node() is not None
            if in_backward:
                self.phase = "backward"
            elif self.phase == "backward":
                self.phase = "optimizer"
        if func is _aten.index.Tensor:
            args = self._boolean_index_as_integers(args)
        out = self._run(func, args, kwargs)
        created: list[int] = []
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                idx = self.track(t)
                if idx is not None:
                    created.append(idx)
        if func in (_aten.ne.Tensor, _aten.eq.Tensor) and isinstance(out, torch.Tensor) and out.dim() == 1:
            self._mask_from_comparison(func, args, out)
        elif func in (_aten.bitwise_not.default, _aten.logical_not.default) and args[0] in self._mask_true:
            self._mask_true[out] = args[0].numel() - self._mask_true[args[0]]
        if self.phase == "backward" and func in _INPLACE_IN_PLAIN_RUN and len(created) == 1:
            size = self.records[created[0]].nbytes
            candidates = []
            for a in args[:3]:
                if isinstance(a, torch.Tensor):
                    rec = self.record_of(a)
                    if rec is not None and self.records[rec].nbytes == size and a.untyped_storage().nbytes() == size:
                        candidates.append(rec)
            if candidates:
                self._pending.append((created[0], candidates))
        return out

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``func`` on meta tensors, reusing output metadata for a repeated (operator, input metadata) pair.

        Meta kernels of many operators are Python reference implementations (about a millisecond each); the layers
        of a GNN repeat the same operators on the same shapes, so a per-trace memo of output sizes, strides and
        dtypes makes the trace several times faster. Only functional operators whose outputs alias nothing are
        memoised; views and in-place operators always run.
        """
        if func in self._inplace_void and _all_meta(args[0]):
            return None
        cacheable = self._cacheable.get(func)
        if cacheable is None:
            schema = func._schema
            if schema.name.startswith("aten::_foreach_") and schema.name.endswith("_") and not schema.returns:
                # In-place foreach updates (the optimizer's moments and weights) allocate nothing and return
                # nothing; their meta kernels only re-check shapes, per tensor, in Python.
                self._inplace_void.add(func)
                if _all_meta(args[0]):
                    return None
            schema = func._schema
            cacheable = not schema.is_mutable and all(r.alias_info is None for r in schema.returns)
            self._cacheable[func] = cacheable
        key = _meta_key(func, args, kwargs) if cacheable else None
        if key is not None:
            hit = self._memo.get(key)
            if hit is not None:
                single, metas = hit
                outs = [torch.empty_strided(size, stride, dtype=dtype, device="meta") for size, stride, dtype in metas]
                return outs[0] if single else tuple(outs)
        out = func(*args, **kwargs)
        if key is not None:
            single = isinstance(out, torch.Tensor)
            items = (out,) if single else out
            if isinstance(items, (tuple, list)) and all(
                isinstance(t, torch.Tensor)
                and t.device.type == "meta"
                and t.storage_offset() == 0
                and t.untyped_storage().nbytes() == _strided_nbytes(t)
                for t in items
            ):
                self._memo[key] = (single, [(tuple(t.shape), t.stride(), t.dtype) for t in items])
        return out

    def _mask_from_comparison(self, func: Any, args: tuple, out: torch.Tensor) -> None:
        """``edge_index[0] != edge_index[1]`` keeps edges - self_loops entries; ``==`` keeps self_loops."""
        a, b = args[0], args[1]
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return
        if a.dtype != torch.long or a.shape != b.shape or a.untyped_storage() is not b.untyped_storage():
            return
        if a._base is None and b._base is None:
            return
        loops = min(self.self_loops, out.numel())
        self._mask_true[out] = out.numel() - loops if func is _aten.ne.Tensor else loops

    def _boolean_index_as_integers(self, args: tuple) -> tuple:
        """Replace boolean indices by integer indices of the known (or all-true) length, counting ATen's nonzero."""
        indices = args[1]
        if not any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
            return args
        new = []
        for i in indices:
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                if i.dim() != 1:
                    raise NotImplementedError("boolean index with more than one dimension")
                kept = self._mask_true.get(i, i.numel())
                positions = torch.empty(kept, 1, dtype=torch.long, device=i.device)
                self.track(positions)  # ATen's nonzero() result: [kept, 1] int64, freed after the gather
                new.append(positions.view(-1))
            else:
                new.append(i)
        return (args[0], new, *args[2:])


_SCALARS = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _meta_part(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        if value.device.type != "meta":
            raise _Unkeyable
        return (tuple(value.shape), value.stride(), value.dtype, value.storage_offset())
    if isinstance(value, _SCALARS):
        return (type(value), value)
    if isinstance(value, (list, tuple)):
        return tuple(_meta_part(v) for v in value)
    raise _Unkeyable


class _Unkeyable(Exception):
    pass


def _meta_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """A hashable description of an operator call on meta tensors, or None when an argument has no such form."""
    try:
        return (func, _meta_part(args), tuple(sorted((k, _meta_part(v)) for k, v in kwargs.items())))
    except _Unkeyable:
        return None


def _all_meta(tensors: Any) -> bool:
    return isinstance(tensors, (list, tuple)) and all(
        isinstance(t, torch.Tensor) and t.device.type == "meta" for t in tensors
    )


def _strided_nbytes(t: torch.Tensor) -> int:
    """Bytes ``empty_strided`` allocates for ``t``'s sizes and strides."""
    if t.numel() == 0:
        return 0
    extent = 1 + sum((n - 1) * st for n, st in zip(t.shape, t.stride(), strict=True))
    return extent * t.element_size()


def _categorise(trace: Trace, at: int, weights: set[int], state: set[int], grads: set[int]) -> dict[str, int]:
    out = dict.fromkeys(CATEGORIES, 0)
    for idx in trace.live_at(at):
        rec = trace.records[idx]
        if idx in weights:
            category = "weights"
        elif idx in state:
            category = "optimizer_state"
        elif idx in grads:
            category = "gradients"
        elif rec.phase in ("setup", "forward"):
            category = "activations"
        else:
            category = "ephemeral"
        out[category] += rec.nbytes
    return out


def _compile_pyg_templates() -> None:
    """PyG generates each message-passing class's ``propagate`` from a jinja template the first time the class is
    instantiated (about 0.1-0.3 s per class); doing it once at import keeps that out of every timed estimate."""
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv

    with torch.device("meta"):
        GCNConv(1, 1), SAGEConv(1, 1), GINConv(torch.nn.Linear(1, 1)), GATConv(1, 1)


_compile_pyg_templates()


def trace_step(
    spec: GNNJobSpec,
    layout: GraphLayout | None = None,
    device: Device = "cpu",
    engine: Engine = "meta",
) -> tuple[Trace, dict[str, int], int]:
    """Trace one steady-state step of ``spec``; returns the trace, the breakdown at the peak and the peak.

    ``engine="meta"`` runs on meta-device tensors with the per-trace memo (fast); ``engine="fake"`` runs under
    ``FakeTensorMode`` (the same numbers, several times slower; kept as a cross-check). Mini-batch jobs trace a
    batch of the largest size the sampler can produce (``minibatch_bound``); on ``cpu`` the full graph and the
    sampler's arrays are resident too, on ``cuda`` they stay in host memory and only batches reach the device.
    """
    layout = layout if layout is not None else graph_layout(spec)
    minibatch = spec.batching.mode == "minibatch"
    step_layout = (
        minibatch_bound(layout, int(spec.batching.batch_size or layout.nodes), spec.fanouts) if minibatch else layout
    )
    tracker = _LivenessMode(self_loops=step_layout.self_loops)
    outer = FakeTensorMode(allow_non_fake_inputs=False) if engine == "fake" else nullcontext()
    placement = torch.device("meta") if engine == "meta" else nullcontext()
    with outer, tracker:
        with placement:
            resident: list[Any] = []
            if minibatch and device == "cpu":
                full = fake_graph_tensors(layout)
                resident.append(NeighborSampler(full, spec))
                del full
            graph = fake_graph_tensors(step_layout)
            model = build_model(spec, features=layout.features, classes=layout.classes)
        optimizer = model.optimizer
        if spec.mode == "train" and optimizer is not None:
            # Steady state: the optimizer creates its state with its own code; the previous step's gradients are
            # alive until run_step's zero_grad frees them.
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
        weights = {tracker.record_of(t) for t in list(model.parameters()) + list(model.buffers())}
        state = {
            tracker.record_of(v)
            for s in (optimizer.state.values() if optimizer is not None else ())
            for v in s.values()
            if isinstance(v, torch.Tensor)
        }
        window_start = len(tracker.events)
        tracker.phase = "forward"
        run_step(model, graph, spec.mode)
        tracker.finish()
        grads = {tracker.record_of(p.grad) for p in model.parameters() if p.grad is not None}
        trace = Trace(records=tracker.records, events=list(tracker.events), window_start=window_start)
        peak, at = trace.peak()
        breakdown = _categorise(trace, at, weights, state, grads)
        del graph, model, optimizer, resident
    return trace, breakdown, peak


def _device_overhead(trace: Trace, peak: int, gpu: GPUModel, workers: int) -> int:
    rounded, _ = trace.peak(rounding=512)
    rounding = max(0, rounded - peak)
    fragmentation = math.ceil(gpu.allocator_overhead_fraction * rounded)
    return gpu.context_bytes + workers * gpu.cublas_workspace_bytes + gpu.mps_client_bytes + rounding + fragmentation


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
    if workers > 1:
        shared = _resident_inputs(trace)
        per_worker = max(0, peak - shared)
        extra = (workers - 1) * per_worker
        peak += extra
        breakdown = dict(breakdown)
        breakdown["ephemeral"] += extra
    if device == "cuda":
        if gpu_model is None:
            from gnnsched.gpus import DEFAULT_GPU_MODEL

            gpu_model = DEFAULT_GPU_MODEL
        gpu = gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model)
        overhead = _device_overhead(trace, peak, gpu, workers)
        factor = DEFAULT_SAFETY_FACTOR_CUDA if safety_factor is None else safety_factor
    elif device == "cpu":
        overhead = 0
        factor = DEFAULT_SAFETY_FACTOR_CPU if safety_factor is None else safety_factor
    else:
        raise ValueError(f"device: must be cpu or cuda, got {device!r}")
    admit = math.ceil(peak * factor) + overhead
    return Estimate(
        pmc_bytes=int(peak),
        breakdown={k: int(v) for k, v in breakdown.items()},
        device_overhead_bytes=int(overhead),
        safety_factor=factor,
        admit_bytes=int(admit),
        seconds=round(time.perf_counter() - started, 6),
    )


def _resident_inputs(trace: Trace) -> int:
    """Bytes created before the measured step and alive at its start (graph, weights, state): shared by workers."""
    return sum(trace.records[i].nbytes for i in trace.live_at(trace.window_start))


__all__ = ["CATEGORIES", "Estimate", "Trace", "estimate", "trace_step"]
