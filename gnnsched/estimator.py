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
``allocator_overhead_fraction`` of it) times the safety factor, and ``device_overhead_bytes`` is everything in that
sum beyond ``pmc_bytes``. The context and workspace constants are the GPU model's documented values in
``gnnsched.gpus``; neither they nor the allocator model have been checked on a GPU here ("unverified").
"""

from __future__ import annotations

import bisect
import math
import time
import weakref
from collections.abc import Hashable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
import torch._dynamo
import torch_geometric.nn  # noqa: F401 - same: keep one-time imports out of the timed estimate
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from gnnsched.cuda_allocator import replay
from gnnsched.gpus import GPUModel, get_gpu_model
from gnnsched.models import (
    GraphLayout,
    NeighborSampler,
    build_model,
    fake_graph_tensors,
    graph_layout,
    minibatch_bound,
)
from gnnsched.portable.step import run_step
from gnnsched.spec import GNNJobSpec, SpecError

Device = Literal["cpu", "cuda"]
Engine = Literal["meta", "fake"]
CATEGORIES = ("weights", "optimizer_state", "activations", "gradients", "ephemeral")

DEFAULT_SAFETY_FACTOR_CPU = 1.02
"""Margin on the traced peak on CPU: the benchmark's worst case is within 1 % (README, "Estimator")."""
DEFAULT_SAFETY_FACTOR_CUDA = 1.10
"""Margin on a GPU, where kernels and the allocator are not measured here; the low end of the papers' 1.1-1.15."""

_aten = torch.ops.aten
_META = torch.device("meta")
_NO_SEQUENCE_NR = 2**64 - 1
"""``Node._sequence_nr()`` of AccumulateGrad nodes (UINT64_MAX)."""
_INPLACE_IN_PLAIN_RUN = {_aten.add.Tensor, _aten.index_add.default}
"""Backward ops autograd runs in place outside a dispatch mode (gradient accumulation, index_select's backward)."""
# Steps the CUDA replay runs (``cuda_allocation_events``): the measurement in bench/pmc_accuracy.py --device cuda
# runs three; in the five allocator histories recorded on an H100 the reserved peak came in the first or second.
CUDA_STEPS = 3
# Elementwise operators built on TensorIterator with ``promote_inputs_to_common_dtype`` (binary arithmetic and
# comparisons, ATen's BinaryOps.cpp / TensorIterator.cpp): on the CPU a mixed-dtype call copies its odd input first.
_PROMOTING_OPS = {
    getattr(getattr(_aten, name), overload)
    for name in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "maximum", "minimum",
                 "add_", "sub_", "mul_", "div_")
    for overload in ("Tensor", "default")
    if hasattr(getattr(_aten, name), overload)
}
# Operators PyTorch runs through cuBLAS on CUDA: the first one on a thread takes that thread's cuBLAS workspace.
_CUBLAS_OPS = {
    _aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default, _aten.addbmm.default,
    _aten.mv.default, _aten.addmv.default,
}


class UntraceableModel(Exception):
    """The model runs operators whose memory a trace cannot see (fused recurrent kernels), so no exact peak exists
    for it: the job needs ``spec.resources.gpuMemory``, or runs alone on a whole GPU and is observed."""


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


@dataclass
class _Record:
    """One storage's life in the trace."""

    nbytes: int
    phase: str  # setup | forward | backward | optimizer
    alloc_at: int  # index into the event list
    free_at: int | None = None
    # A zero-byte record that marks where the CUDA process would take a library workspace from the caching allocator
    # (``cuda_allocation_events`` turns it into that allocation): ``cublas-workspace:<phase>``, ``cublaslt-workspace``;
    # or ``cpu-promotion``: an input cast a CPU kernel makes for itself (``_LivenessMode.promotion_temporaries``),
    # which a CUDA kernel never allocates (the CUDA replay skips it).
    marker: str | None = None


@dataclass(frozen=True)
class Trace:
    """The traced timeline: ``events`` holds ``(+1 | -1, record index)`` in program order (``None`` = cancelled)."""

    records: list[_Record]
    events: list[tuple[int, int] | None]
    window_start: int  # first event of the measured step
    traced_layers: int | None = None  # depth of the template the timeline was spliced from (None: traced in full)

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

    def run_totals(self) -> list[int]:
        """Live bytes at the step's start and after every maximal run of allocations or of frees in the step
        (repeats dropped): every value the peak can take, independent of the order within a run."""
        live = sum(self.records[i].nbytes for i in self.live_at(self.window_start))
        totals = [live]
        events = [e for e in self.events[self.window_start :] if e is not None]
        for k, (sign, idx) in enumerate(events):
            live += sign * self.records[idx].nbytes
            if k + 1 == len(events) or events[k + 1][0] != sign:
                totals.append(live)
        return [v for k, v in enumerate(totals) if k == 0 or v != totals[k - 1]]

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

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        """No ``torch._dynamo.disable`` wrapper around ``__torch_dispatch__``: nothing here is ever compiled, and the
        wrapper (two eval-frame switches per operator) was a tenth of the trace's time."""
        return False

    def __init__(self, self_loops: int, cpu: bool = True) -> None:
        super().__init__()
        self.self_loops = self_loops
        self.cpu = cpu
        self.records: list[_Record] = []
        self.events: list[tuple[int, int] | None] = []
        self._by_storage: dict[int, int] = {}  # id(storage) -> record index, for live storages only
        self._refs: dict[int, weakref.ref[Any]] = {}
        self._pending: list[tuple[int, list[int]]] = []
        self._mask_true: WeakIdKeyDictionary = WeakIdKeyDictionary()
        # Per operator, keyed by id() (OpOverload hashes in Python; ``_ops_seen`` keeps the ids valid): memoisable,
        # in-place foreach returning nothing, positions of a functional foreach operator's list arguments.
        self._op_info: dict[int, tuple[bool, bool, tuple[int, ...]]] = {}
        self._ops_seen: list[Any] = []
        self._memo: dict[tuple, tuple[bool, list[tuple[tuple[int, ...], tuple[int, ...], torch.dtype]]]] = {}
        self.phase = "setup"
        # Layer labels, only for a trace that will be spliced (``_LayerSplice``): ``block`` is the layer whose
        # operators are running (0 = none), ``labels[i]`` the block of event i, ``owners[r]`` the layer record r
        # belongs to; ``boundaries[i]`` the autograd sequence number of layer i+1's input (backward attribution).
        self.labelling = False
        self.block = 0
        self.labels: list[int] = []
        self.owners: list[int] = []
        self.boundaries: list[int] = []
        self.param_layers: list[int] = []
        self._workspaces_marked: set[str] = set()

    # --- bookkeeping -------------------------------------------------------------------------------------------

    def _storage_died(self, idx: int, key: int, _ref: object) -> None:
        """The weakref callback: the storage's last reference went away."""
        self._freed(idx, key)

    def _freed(self, idx: int, key: int) -> None:
        self.records[idx].free_at = len(self.events)
        self.events.append((-1, idx))
        if self.labelling:
            self.labels.append(self.block)
        del self._refs[idx]
        del self._by_storage[key]

    def track(self, tensor: torch.Tensor) -> int | None:
        """Register ``tensor``'s storage if new; returns its record index (None for an already-known storage).

        Storages are keyed by the identity of their Python object, which PyTorch keeps one-to-one with the C++
        storage while it lives; the weak reference's callback removes the key when the storage dies, before its
        ``id`` can be reused (a plain dict: ``WeakIdKeyDictionary`` cost a third of the dispatch overhead).
        """
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._by_storage:
            return None
        idx = len(self.records)
        events = self.events
        self.records.append(_Record(storage.nbytes(), self.phase, len(events)))
        events.append((1, idx))
        if self.labelling:
            self.labels.append(self.block)
            self.owners.append(self.block)
        self._by_storage[key] = idx
        self._refs[idx] = weakref.ref(storage, partial(self._storage_died, idx, key))
        return idx

    def record_of(self, tensor: torch.Tensor) -> int | None:
        return self._by_storage.get(id(tensor.untyped_storage()))

    def mark_workspaces(self, func: Any) -> None:
        """After a cuBLAS operator's output: mark where the step's thread takes its cuBLAS workspace (the first such
        operator of the forward, on the main thread, and of the backward, on the autograd engine's device thread)
        and, at the first ``addmm`` (a bias epilogue, run through cuBLASLt), the cuBLASLt workspace.

        Measured on an H100 (torch 2.11, docs/gpu-measurements.md): both are taken right after the operator's output
        is allocated and kept for the process; where they land among the step's cached blocks decides how the
        allocator fragments, so a model that put them at the step's start under-predicted reserved memory by up
        to 200 MiB on mid-sized graphs."""
        if self.phase not in ("forward", "backward"):
            return
        kinds = [f"cublas-workspace:{self.phase}"]
        if func is _aten.addmm.default:
            kinds.append("cublaslt-workspace")
        for kind in kinds:
            if kind in self._workspaces_marked:
                continue
            self._workspaces_marked.add(kind)
            idx = len(self.records)
            self.records.append(_Record(0, self.phase, len(self.events), marker=kind))
            self.events.append((1, idx))
            if self.labelling:
                self.labels.append(self.block)
                self.owners.append(self.block)

    def promotion_temporaries(self, func: Any, args: tuple) -> list[int]:
        """Allocate the input casts a CPU TensorIterator makes when an elementwise operator's tensor inputs differ in
        dtype (``(src == value) * grad``: the boolean input is first copied as float). PyTorch's
        ``TensorIteratorBase::compute_types`` does this only when the common device is the CPU ("Promotes inputs by
        creating temporaries of the correct dtype"); CUDA kernels cast as they load. Each cast copies the input
        (``Tensor.to``) and lives until the operator returns. Zero-dimensional inputs (a few bytes) are left out."""
        tensors = [a for a in args[:2] if isinstance(a, torch.Tensor)]
        if len(tensors) < 2 or tensors[0].dtype == tensors[1].dtype:
            return []
        common = torch.result_type(args[0], args[1])
        created: list[int] = []
        for t in tensors:
            if t.dim() == 0 or t.dtype == common:
                continue
            idx = len(self.records)
            nbytes = t.numel() * torch.empty((), dtype=common, device=_META).element_size()
            self.records.append(_Record(nbytes, self.phase, len(self.events), marker="cpu-promotion"))
            self.events.append((1, idx))
            if self.labelling:
                self.labels.append(self.block)
                self.owners.append(self.block)
            created.append(idx)
        return created

    def records_of(self, tensors: Iterable[torch.Tensor]) -> set[int]:
        """The records of the tensors' storages (a storage allocated before tracing began has none)."""
        return {r for t in tensors if (r := self.record_of(t)) is not None}

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
            node = torch._C._current_autograd_node()
            if node is not None:
                self.phase = "backward"
                if self.labelling:
                    self._label_backward(node)
            elif self.phase == "backward":
                self.phase = "optimizer"
                self.block = 0
        if func is _aten.index.Tensor:
            args = self._boolean_index_as_integers(args)
        temporaries = self.promotion_temporaries(func, args) if self.cpu and func in _PROMOTING_OPS else ()
        out = self._run(func, args, kwargs)
        created: list[int] = []
        for t in _output_tensors(out):
            idx = self.track(t)
            if idx is not None:
                created.append(idx)
        for idx in temporaries:
            self.records[idx].free_at = len(self.events)
            self.events.append((-1, idx))
            if self.labelling:
                self.labels.append(self.block)
        if func in _CUBLAS_OPS:
            self.mark_workspaces(func)
        if self.labelling and self.phase == "optimizer" and isinstance(out, (list, tuple)) and created:
            self._label_per_parameter(out, created)
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

    # --- layer labels (see _splice) -------------------------------------------------------------------------------

    def enter_layer(self, layer: int, x: Any) -> None:
        """Forward pre-hook of layer ``layer`` (1-based): later events belong to it; autograd nodes created from now
        on have sequence numbers above that of the input's ``grad_fn``, which is how backward ops are attributed."""
        self.block = layer
        grad_fn = getattr(x, "grad_fn", None)
        self.boundaries.append(grad_fn._sequence_nr() if grad_fn is not None else -1)

    def _label_backward(self, node: Any) -> None:
        seq = node._sequence_nr()
        if seq != _NO_SEQUENCE_NR:  # AccumulateGrad nodes have none: they keep the layer of the op before them
            self.block = bisect.bisect_left(self.boundaries, seq)

    def _label_per_parameter(self, out: Any, created: list[int]) -> None:
        """An optimizer operator returning one tensor per parameter (``_foreach_*``): output k belongs to the layer
        of parameter k. Any other optimizer allocation stays unattributed (0)."""
        if len(out) != len(self.param_layers):
            return
        fresh = set(created)
        for k, t in enumerate(out):
            if isinstance(t, torch.Tensor):
                rec = self.record_of(t)
                if rec in fresh:
                    self.owners[rec] = self.param_layers[k]

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run ``func`` on meta tensors, reusing output metadata for a repeated (operator, input metadata) pair.

        Meta kernels of many operators are Python reference implementations (about a millisecond each); the layers
        of a GNN repeat the same operators on the same shapes, so a per-trace memo of output sizes, strides and
        dtypes makes the trace several times faster. Only functional operators whose outputs alias nothing are
        memoised; views and in-place operators always run.
        """
        info = self._op_info.get(id(func))
        if info is None:
            info = self._op_info[id(func)] = _op_info(func, len(args))
            self._ops_seen.append(func)
        cacheable, void, split = info
        if void and _all_meta(args[0]):
            return None
        if split and split[-1] < len(args):
            n = len(args[split[0]])
            if n > 1 and all(len(args[i]) == n and _all_meta_or_scalars(args[i]) for i in split):
                # Functional foreach operators compute each list element on its own: memoise per element, so the
                # optimizer's first step costs one meta kernel per distinct weight shape, not one per weight.
                outs: list[Any] = []
                for k in range(n):
                    part = list(args)
                    for i in split:
                        part[i] = [args[i][k]]
                    outs.extend(self._run(func, tuple(part), kwargs))
                return outs
        key = _meta_key(func, args, kwargs) if cacheable else None
        if key is not None:
            hit = self._memo.get(key)
            if hit is not None:
                single, metas = hit
                outs = [torch.empty_strided(size, stride, dtype=dtype, device=_META) for size, stride, dtype in metas]
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
_SCALAR_TYPES = frozenset(_SCALARS)


def _meta_part(value: Any) -> Any:
    """A hashable stand-in for one operator argument: metadata for a meta tensor, (type, value) for a scalar."""
    kind = type(value)
    if kind in _SCALAR_TYPES:
        return (kind, value)
    if isinstance(value, torch.Tensor):
        if not value.is_meta:
            raise _Unkeyable
        return (value.shape, value.stride(), value.dtype, value.storage_offset())
    if isinstance(value, (list, tuple)):
        return tuple([_meta_part(v) for v in value])
    if isinstance(value, _SCALARS):
        return (kind, value)
    raise _Unkeyable


class _Unkeyable(Exception):
    pass


def _meta_key(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """A hashable description of an operator call on meta tensors, or None when an argument has no such form."""
    try:
        # id(func): the trace keeps every operator it saw alive (``_op_info``), and OpOverload hashes in Python
        named = tuple(sorted((k, _meta_part(v)) for k, v in kwargs.items())) if kwargs else ()
        return (id(func), _meta_part(args), named)
    except _Unkeyable:
        return None


def _output_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors in an operator's result (a tensor, a tuple/list of tensors and non-tensors, or None)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if out is None:
        return []
    if isinstance(out, (tuple, list)) and all(not isinstance(t, (tuple, list, dict)) for t in out):
        return [t for t in out if isinstance(t, torch.Tensor)]
    return [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _op_info(func: Any, positional: int) -> tuple[bool, bool, tuple[int, ...]]:
    """What ``_run`` needs to know about an operator, from its schema: whether its output metadata can be memoised
    (functional, outputs alias nothing), whether it is an in-place foreach update that returns nothing (the
    optimizer's moments and weights: it allocates nothing, and its meta kernel only re-checks shapes, per tensor,
    in Python, so it is skipped), and for a functional foreach operator the positions of its list arguments."""
    schema = func._schema
    name = schema.name
    void = name.startswith("aten::_foreach_") and name.endswith("_") and not schema.returns
    cacheable = not schema.is_mutable and all(r.alias_info is None for r in schema.returns)
    split: tuple[int, ...] = ()
    if cacheable and name.startswith("aten::_foreach_") and len(schema.returns) == 1:
        arguments = schema.arguments[:positional]
        split = tuple(i for i, a in enumerate(arguments) if isinstance(a.type, torch.ListType))
    return cacheable, void, split


def _all_meta_or_scalars(values: Any) -> bool:
    """A list argument of a foreach operator made of meta tensors and plain numbers (with one tensor at least)."""
    return isinstance(values, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in values) and all(
        (isinstance(v, torch.Tensor) and v.is_meta) or isinstance(v, (int, float, bool)) for v in values
    )


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
    with outer, tracker:
        with placement:
            resident: list[Any] = []
            if minibatch and device == "cpu":
                full = fake_graph_tensors(layout)
                resident.append(NeighborSampler(full, spec))
                del full
            graph = fake_graph_tensors(step_layout)
            model_from = len(tracker.records)
            model = build_model(model_spec, features=layout.features, classes=layout.classes)
            recurrent = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)})
            if recurrent:
                raise UntraceableModel(
                    f"the model has recurrent layers ({', '.join(recurrent)}): PyTorch runs them as fused kernels "
                    f"(oneDNN on CPU, cuDNN on a GPU) whose workspaces no trace sees"
                )
            if engine == "meta" and any(t.device != _META for t in (*model.parameters(), *model.buffers())):
                # A layer that makes a weight with the legacy ``Tensor(n)`` constructor (ResGatedGraphConv's bias)
                # ignores the device context; the real run moves it with the model, so the trace does too
                # (``.to`` keeps the parameter objects, which the optimizer holds).
                model.to(_META)
        optimizer: torch.optim.Optimizer | None = getattr(model, "optimizer", None)
        if spec.mode == "train" and optimizer is not None:
            # Steady state: the optimizer creates its state with its own code; the previous step's gradients are
            # alive until run_step's zero_grad frees them.
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            optimizer.step()
        weights = tracker.records_of([*model.parameters(), *model.buffers()])
        state = tracker.records_of(
            v for s in (optimizer.state.values() if optimizer is not None else ()) for v in s.values()
            if isinstance(v, torch.Tensor)
        )
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
        grads = tracker.records_of(p.grad for p in model.parameters() if p.grad is not None)
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


def cuda_allocation_events(
    trace: Trace, workers: int = 1, workspace_bytes: int = 0, lt_workspace_bytes: int = 0, steps: int = CUDA_STEPS
) -> list[tuple[int, Hashable, int]]:
    """The trace's allocations and frees, in program order, as the CUDA caching allocator of a fresh job process sees
    them over its first ``steps`` steps.

    Everything before the measured step is replayed as traced (what it cached stays reserved). The step is then
    replayed ``steps`` times: a job's reserved memory can grow after its first step, when a block kept from one step
    (a gradient, a workspace) sits inside a segment the next step's large transient buffers would have reused.
    A later step frees what the step before it kept where the traced step frees the pre-step storage of the same
    size (the previous step's gradients, say); a free with no such storage is dropped, which can only raise the
    replayed use. In the first step each workspace marker (``_LivenessMode.mark_workspaces``) becomes the workspace
    it marks, kept for the process: ``workspace_bytes`` for a thread's cuBLAS workspace (PyTorch takes one per
    (handle, stream) and handles are per thread, CublasHandlePool.cpp v2.6.0 lines 166-167 and 213-215: the forward
    and the autograd engine's backward thread each hold one) and ``lt_workspace_bytes`` for cuBLASLt's.

    For ``workers`` > 1 (parallel inference: threads on the one default stream, hence one allocator pool) each step
    is replayed once per worker, interleaved event by event, so that all workers reach their peak together, the
    worst case ``estimate`` counts; each worker takes its own workspaces; a pre-step storage the step frees is freed
    once. Cancelled events are skipped; zero-byte storages pass through (the model skips them).

    The in-place correction leaves an accumulation's output without an allocation (it reuses its input's buffer,
    whose own free is cancelled): the output's free is the free of that buffer, taken here as the most recently
    allocated live storage of the same size that the trace never frees (``_pair_reused_frees``).
    """
    records, events, start = trace.records, trace.events, trace.window_start
    out: list[tuple[int, Hashable, int]] = [
        (ev[0], ev[1], records[ev[1]].nbytes) for ev in events[:start] if ev is not None
    ]
    sizes = {"cublaslt-workspace": lt_workspace_bytes}

    def workspace(idx: int) -> int:
        kind = records[idx].marker or ""
        return sizes.get(kind, workspace_bytes if kind.startswith("cublas-workspace") else 0)

    window = [ev for ev in events[start:] if ev is not None]
    # One step, workers interleaved, as (sign, key, bytes, record); markers as zero-byte allocations.
    step: list[tuple[int, Hashable, int, int]] = []
    for sign, idx in window:
        nbytes = records[idx].nbytes
        if workers > 1 and records[idx].alloc_at < start:  # a pre-step storage: one copy, freed by the first worker
            step.append((sign, idx, nbytes, idx))
        elif workers > 1:
            step.extend((sign, (w, idx), nbytes, idx) for w in range(workers))
        else:
            step.append((sign, idx, nbytes, idx))
    freed_in_step = {key for sign, key, _, _ in step if sign < 0}
    kept_keys = {key for sign, key, _, _ in step if sign > 0 and key not in freed_in_step}
    previous: dict[int, list[Hashable]] = {}  # size -> what the previous step kept, oldest first
    for rep in range(max(1, steps)):
        kept: dict[int, list[Hashable]] = {}
        for sign, key, nbytes, base in step:
            if records[base].marker is not None:
                if rep == 0 and (size := workspace(base)) > 0:
                    out.append((1, ("workspace", key), size))
                continue
            if sign > 0:
                out.append((1, (rep, key) if rep else key, nbytes))
                if key in kept_keys:
                    kept.setdefault(nbytes, []).append((rep, key) if rep else key)
            elif rep == 0:
                out.append((-1, key, nbytes))
            elif records[base].alloc_at >= start:  # the step's own storage (or an in-place output, paired below)
                out.append((-1, (rep, key), nbytes))
            elif previous.get(nbytes):  # a pre-step storage: what the previous step kept in its place
                out.append((-1, previous[nbytes].pop(0), nbytes))
        previous = kept
    return _pair_reused_frees(out)


def _pair_reused_frees(events: list[tuple[int, Hashable, int]]) -> list[tuple[int, Hashable, int]]:
    """Point each free of a never-allocated key at the live, never-freed storage of the same size allocated last (the
    buffer the in-place correction says it reused; never a cuBLAS workspace); a free with no such buffer is dropped
    (dropping a free can only raise the replayed use)."""
    allocated = {key for sign, key, _ in events if sign > 0}
    freed = {key for sign, key, _ in events if sign < 0}
    freed.update(key for sign, key, _ in events if sign > 0 and isinstance(key, tuple) and key[0] == "workspace")
    spare: dict[int, list[Hashable]] = {}  # size -> live allocations the trace never frees, oldest first
    fixed: list[tuple[int, Hashable, int]] = []
    for sign, key, nbytes in events:
        if sign > 0:
            if key not in freed:
                spare.setdefault(nbytes, []).append(key)
        elif key not in allocated:
            candidates = spare.get(nbytes)
            if not candidates:
                continue
            key = candidates.pop()
        fixed.append((sign, key, nbytes))
    return fixed


def _cuda_device_terms(trace: Trace, peak: int, gpu: GPUModel, workers: int) -> tuple[int, int, int]:
    """(overhead over ``peak``, peak reserved, peak allocated) on ``gpu``: the allocator model's reserved peak (with
    the cuBLAS workspaces) plus the optional fragmentation allowance, and the per-process CUDA context and MPS
    client costs the allocator never sees."""
    result = replay(
        cuda_allocation_events(trace, workers, gpu.cublas_workspace_bytes, gpu.cublaslt_workspace_bytes)
    )
    reserved = result.reserved_bytes
    allowance = math.ceil(gpu.allocator_overhead_fraction * reserved)
    overhead = gpu.context_bytes + gpu.mps_client_bytes + reserved + allowance - peak
    return overhead, reserved, result.allocated_bytes


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
    reserved: int | None = None
    allocated: int | None = None
    if device == "cuda":
        if gpu_model is None:
            from gnnsched.gpus import DEFAULT_GPU_MODEL

            gpu_model = DEFAULT_GPU_MODEL
        gpu = gpu_model if isinstance(gpu_model, GPUModel) else get_gpu_model(gpu_model)
        overhead, reserved, allocated = _cuda_device_terms(trace, peak, gpu, workers)
        factor = DEFAULT_SAFETY_FACTOR_CUDA if safety_factor is None else safety_factor
        # context + MPS client + reserved peak (workspaces included), then the safety factor on the whole: the
        # calibrated factor is observed / predicted device memory, and NVML's observation includes the context.
        admit = math.ceil((peak + overhead) * factor)
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


def _resident_inputs(trace: Trace) -> int:
    """Bytes created before the measured step and alive at its start (graph, weights, state): shared by workers."""
    return sum(trace.records[i].nbytes for i in trace.live_at(trace.window_start))


__all__ = ["CATEGORIES", "Estimate", "Trace", "UntraceableModel", "cuda_allocation_events", "estimate", "trace_step"]
