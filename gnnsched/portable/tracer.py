"""The estimator's tracer: one step of any model on data-less (meta) tensors, recorded as an allocation timeline.

``_LivenessMode`` is a dispatch mode that sees every operator and every tensor storage it creates, and a weak
reference on each storage records the moment it dies; ``Trace`` is the resulting timeline, whose peak of live bytes is
what ``torch.profiler``'s allocation events (and ``torch.cuda.max_memory_allocated``) measure. ``gnnsched.estimator``
documents the method and its corrections; this module holds the machinery because it must also run where gnnsched
is not installed: the probe (``probe.py``) traces a user's entrypoint inside the user's own image, and the numbers
it reports are the estimator's because the code is the same.

Only the standard library and torch are imported here, siblings by relative imports (see the package's docstring).
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

from .cuda_allocator import AllocatorPeak, replay

CATEGORIES = ("weights", "optimizer_state", "activations", "gradients", "ephemeral")


class UntraceableModel(Exception):
    """The model runs operators whose memory a trace cannot see (fused recurrent kernels), so no exact peak exists
    for it: the job needs ``spec.resources.gpuMemory``, or runs alone on a whole GPU and is observed."""


def refuse_untraceable(model: torch.nn.Module) -> None:
    """Raise ``UntraceableModel`` for a model with recurrent layers (their fused kernels allocate unseen)."""
    recurrent = sorted({type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.RNNBase)})
    if recurrent:
        raise UntraceableModel(
            f"the model has recurrent layers ({', '.join(recurrent)}): PyTorch runs them as fused kernels "
            f"(oneDNN on CPU, cuDNN on a GPU) whose workspaces no trace sees"
        )

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


class CudaOperatorPaths(TorchFunctionMode):
    """Run, on meta tensors, the operator a CUDA tensor would run where ATen picks the implementation by device above
    the dispatcher (where a dispatch mode on meta tensors would otherwise see the CPU's choice).

    Dropout is the one that matters for GNNs: ``at::dropout`` calls the fused ``native_dropout`` when
    ``is_fused_kernel_acceptable`` holds (a CUDA, XPU, lazy or PrivateUse1 tensor, 0 < p < 1, non-empty;
    ``aten/src/ATen/native/Dropout.cpp``), which keeps a *bool* mask (1 byte per element) for the backward; anywhere
    else it builds a float noise tensor (``empty_like`` + ``bernoulli_`` + ``div_``: 4 bytes per element) and
    multiplies. Traced on meta, every training step of a model with dropout carried the CPU's float noise, so on a GPU
    the allocated peak was over-predicted (+6.9 % for GIN and GraphSAGE on the H200) and, because the blocks were
    sized differently, the reserved peak came out under in five of 30 PyG training cases (PNA by 132 MiB).
    In-place dropout (``dropout_``) and feature / alpha dropout take the decomposed path on CUDA too and pass
    through unchanged. Only used for CUDA traces (``device="cuda"``); CPU traces keep the CPU's path."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.dropout:
            fused = _fused_dropout_args(args, kwargs, ("input", "p", "training", "inplace"), (0.5, True, False))
        elif func is torch.dropout:
            fused = _fused_dropout_args(args, kwargs, ("input", "p", "train"), (None, None))
        else:
            fused = None
        if fused is not None:
            return torch.native_dropout(fused[0], fused[1], True)[0]
        return func(*args, **kwargs)


def _fused_dropout_args(
    args: tuple, kwargs: dict, names: tuple[str, ...], defaults: tuple[Any, ...]
) -> tuple[torch.Tensor, float] | None:
    """``(input, p)`` when a dropout call with these arguments takes CUDA's fused kernel, else None."""
    values = dict(zip(names, args, strict=False))
    values.update(kwargs)
    for name, default in zip(names[1:], defaults, strict=True):
        values.setdefault(name, default)
    tensor, p = values.get("input"), values.get("p")
    train = values.get("training", values.get("train"))
    if not isinstance(tensor, torch.Tensor) or not isinstance(p, (int, float)) or values.get("inplace"):
        return None
    if not train or not 0 < p < 1 or tensor.numel() == 0:
        return None
    return tensor, float(p)


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


# --- the steady-state step, shared by the estimator's trace_step and the probe --------------------------------------


def prime_optimizer(model: torch.nn.Module, mode: str) -> torch.optim.Optimizer | None:
    """Bring a training model to its steady state: the optimizer creates its state with its own code (one step on
    zero gradients), and the previous step's gradients stay alive until ``run_step``'s ``zero_grad`` frees them.
    Returns the model's optimizer (``model.optimizer``; None for inference or a model without one)."""
    optimizer: torch.optim.Optimizer | None = getattr(model, "optimizer", None)
    if mode == "train" and optimizer is not None:
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        optimizer.step()
    return optimizer


def resident_records(
    tracker: _LivenessMode, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None
) -> tuple[set[int], set[int]]:
    """The records of the model's weights (parameters and buffers) and of its optimizer's state."""
    weights = tracker.records_of([*model.parameters(), *model.buffers()])
    state = tracker.records_of(
        v for s in (optimizer.state.values() if optimizer is not None else ()) for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    return weights, state


def gradient_records(tracker: _LivenessMode, model: torch.nn.Module) -> set[int]:
    """The records of the parameter gradients the traced backward left."""
    return tracker.records_of(p.grad for p in model.parameters() if p.grad is not None)


def resident_inputs(trace: Trace) -> int:
    """Bytes created before the measured step and alive at its start (graph, weights, state): shared by workers."""
    return sum(trace.records[i].nbytes for i in trace.live_at(trace.window_start))


def scale_for_workers(trace: Trace, peak: int, breakdown: dict[str, int], workers: int) -> tuple[int, dict[str, int]]:
    """``parallelism: N`` inference: the weights and graph once, N concurrent forward passes' working sets (the
    worst case, where all N workers peak together); the extra working sets count as ``ephemeral``."""
    if workers <= 1:
        return peak, breakdown
    extra = (workers - 1) * max(0, peak - resident_inputs(trace))
    scaled = dict(breakdown)
    scaled["ephemeral"] += extra
    return peak + extra, scaled


def allocator_peak(trace: Trace, workers: int, workspace_bytes: int, lt_workspace_bytes: int) -> AllocatorPeak:
    """The CUDA caching-allocator model's peak reserved and allocated bytes for the trace's first steps on a GPU whose
    cuBLAS / cuBLASLt workspaces have these sizes (``cuda_allocation_events``)."""
    return replay(cuda_allocation_events(trace, workers, workspace_bytes, lt_workspace_bytes))
