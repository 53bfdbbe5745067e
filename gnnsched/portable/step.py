"""One training or inference step around any model, the optimizers, and the user's model factory (entrypoint).

The entrypoint contract (``spec.model.entrypoint: "package.module:function"``): gnnsched imports ``package.module``
in the job's image, calls ``function(dims)`` with a ``GraphDims`` (``num_nodes``, ``num_edges``, ``num_features``,
``num_classes``) and expects a ``torch.nn.Module`` that is called as ``model(x, edge_index)`` and returns one row of
logits per node (``[num_nodes, num_classes]``). gnnsched runs the step around it: cross-entropy on the labelled
nodes, backward, then the spec's optimizer; or a forward pass under ``torch.no_grad`` for inference. The function
must build the model from the dimensions alone (it is called on data-less tensors when gnnsched traces the step), so
it may not read the data, call ``.item()`` on values, or make shapes depend on values.

Only the standard library and torch are imported here (see the package's docstring).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

OPTIMIZERS = ("adam", "adamw", "sgd")


class EntrypointError(Exception):
    """The user's entrypoint cannot give a model: it does not import, names nothing callable, or returns no
    ``torch.nn.Module``. The message says which, in words a user can act on."""


class EntrypointBuildFailed(EntrypointError):
    """The user's function raised while building the model. Unlike the other entrypoint errors this one may be the
    trace's alone (the function ran on the meta device, with no data), so the probe reports it as a failure to trace,
    not as a wrong spec."""


@dataclass(frozen=True)
class GraphDims:
    """What an entrypoint is told about the job's graph (the argument of the user's function)."""

    num_nodes: int
    num_edges: int
    num_features: int
    num_classes: int


class StepGraph(Protocol):
    """What a step reads of a graph: features, edges, labels and the integer index of the nodes the loss covers."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor


def load_entrypoint(ref: str) -> Callable[..., Any]:
    """The callable ``package.module:function`` names; ``EntrypointError`` says why not."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise EntrypointError(f"{ref!r} is not package.module:function")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is the user's to see, named
        raise EntrypointError(f"cannot import {module_name!r}: {type(exc).__name__}: {exc}") from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise EntrypointError(f"module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise EntrypointError(f"{ref!r} is a {type(target).__name__}, not a function")
    return target


def build_entrypoint_model(ref: str, dims: GraphDims) -> torch.nn.Module:
    """Call the user's function with the graph's dimensions; the result must be a ``torch.nn.Module``."""
    factory = load_entrypoint(ref)
    try:
        model = factory(dims)
    except Exception as exc:
        raise EntrypointBuildFailed(f"{ref}(dims) raised {type(exc).__name__}: {exc}") from None
    if not isinstance(model, torch.nn.Module):
        raise EntrypointError(f"{ref}(dims) returned {type(model).__name__}, not a torch.nn.Module")
    return model


def make_optimizer(
    params: Iterable[torch.nn.Parameter], name: str, lr: float, weight_decay: float, momentum: float | None = None
) -> torch.optim.Optimizer:
    """The training step's optimizer. The multi-tensor implementations (``foreach=True``, PyTorch's default on
    CUDA) run on every device, so a CPU trace has the temporaries a GPU run has."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, weight_decay=weight_decay, momentum=momentum or 0.0, foreach=True)
    raise ValueError(f"optimizer: unknown {name!r} (one of {', '.join(OPTIMIZERS)})")


def attach_optimizer(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
    """Keep the optimizer on the model (``model.optimizer``), where ``run_step`` finds it: any module can carry it,
    the built-in stacks and a user's own alike."""
    object.__setattr__(model, "optimizer", optimizer)


def run_step(model: torch.nn.Module, graph: StepGraph, mode: str) -> torch.Tensor | None:
    """One step: training = zero grads, forward, cross-entropy on ``graph.target``, backward, optimizer step (returns
    the detached loss tensor, left on its device so no step waits for a device sync); inference = one forward pass
    under ``torch.no_grad`` in eval mode (returns None)."""
    if mode == "train":
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None:
            raise ValueError("run_step(mode='train') needs a model built for a training spec (it has no optimizer)")
        model.train()
        optimizer.zero_grad(set_to_none=True)
        out = model(graph.x, graph.edge_index)
        loss = F.cross_entropy(out[graph.target], graph.y[graph.target])
        del out
        loss.backward()
        optimizer.step()
        return loss.detach()
    model.eval()
    with torch.no_grad():
        out = model(graph.x, graph.edge_index)
        del out
    return None


class _Batches(Protocol):
    def batches(self, seed: int = 0) -> Iterator[Any]: ...


def step_inputs(graph: Any, sampler: _Batches | None, device: str, seed: int, rank: int,
                lock: threading.Lock) -> Iterator[Any]:
    """Endless step inputs, one rule for the built-in worker and the portable runner: the whole (device-resident)
    ``graph`` every step, or ``sampler``'s batches moved to ``device``, each epoch reshuffled with its own seed, each
    worker ``rank`` with its own.

    One sampler serves every inference thread, and its global-to-local id map is a scratch buffer that each batch
    writes and clears: two threads sampling at once corrupted each other's edge indices (IndexError in message
    passing, found by the local cluster's generated jobs). ``lock`` serialises the sampling only; the forward passes
    still run in parallel, and the map stays one copy, as the estimator counts it."""
    if sampler is None:
        while True:
            yield graph
    epoch = 0
    while True:
        batches = sampler.batches(seed=seed + 1000 * rank + epoch)
        while True:
            with lock:
                batch = next(batches, None)
            if batch is None:
                break
            yield batch.to(device)
        epoch += 1


def serve_parallel(model: torch.nn.Module, stream_of: Callable[[int], Iterator[StepGraph]], total: int, workers: int,
                   on_step: Callable[[], None], thread_modes: Callable[[], AbstractContextManager[Any]]) -> None:
    """Parallel inference, one rule for the built-in worker and the portable runner: ``workers`` threads share the
    model and the graph, thread i serves requests i, i+N, ... from ``stream_of(i)`` under ``thread_modes()`` (the
    memory meters are per thread), and ``on_step`` runs under one lock after each request. The first error of any
    thread is raised in the caller's."""
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve(rank: int) -> None:
        try:
            with thread_modes():
                stream = stream_of(rank)
                for _ in range(rank, total, workers):
                    run_step(model, next(stream), "infer")
                    with lock:
                        on_step()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(rank,), name=f"gnnsched-infer-{rank}") for rank in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
