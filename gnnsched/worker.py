"""``gnnsched worker``: run a GNNJob for real and report the peak memory it used.

The worker is what a job's pod runs (behind the gate). It builds the graph and the model with the same functions the
estimator traces (``gnnsched.models``), runs the job's steps (training epochs or inference requests) and reports one
JSON line: ``observed_peak_bytes`` (peak of live tensor bytes over the steps: ``torch.profiler`` allocation events on
CPU, ``torch.cuda.max_memory_allocated`` on CUDA), ``seconds`` (wall time of the steps) and ``steps``.

Inference with ``parallelism: N`` runs N threads that share one copy of the model and the graph (the model-sharing
seed: read-only weights need one copy), each serving its share of the requests.

Mini-batch jobs (sage/gat with ``batching.mode: minibatch``) sample neighbours with ``gnnsched.models``' pure-torch
sampler: an epoch visits every labelled node once in batches; an inference request is one sampled batch.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _EventType

from gnnsched.models import Graph, build_model, make_graph, run_step, sample_batches
from gnnsched.spec import GNNJobSpec


@dataclass(frozen=True)
class WorkerResult:
    observed_peak_bytes: int
    seconds: float
    steps: int

    def as_dict(self) -> dict[str, Any]:
        return {"observed_peak_bytes": self.observed_peak_bytes, "seconds": self.seconds, "steps": self.steps}


STEP_MARK = "gnnsched.step"
"""``record_function`` label around each step, so allocation events can be attributed to the steps."""


def _allocation_events(prof: Any) -> list[tuple[int, int]]:
    """``(time_ns, live bytes after the event)`` for every CPU allocation/free seen by the profiler, in time order.

    Live bytes are summed from the session's own events: the profiler's ``total_allocated`` is a counter that only
    moves while a profiler is on, so it drifts across sessions, and a free of memory allocated before the session
    (garbage of earlier code) is ignored because the session never counted its allocation.
    """
    raw: list[tuple[int, int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation and node.extra_fields.device.type == "cpu":
            raw.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        stack.extend(node.children)
    raw.sort(key=lambda e: e[0])
    owned: dict[int, int] = {}
    level = 0
    out: list[tuple[int, int]] = []
    for when, ptr, size in raw:
        if size > 0:
            owned[ptr] = size
        elif owned.pop(ptr, None) is None:
            continue
        level += size
        out.append((when, level))
    return out


def _marked_windows(prof: Any, label: str) -> list[tuple[int, int]]:
    windows: list[tuple[int, int]] = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.TorchOp and node.name == label:
            windows.append((node.start_time_ns, node.end_time_ns))
        stack.extend(node.children)
    windows.sort()
    return windows


def profiled_peak(prof: Any, label: str = STEP_MARK, last_only: bool = False) -> int:
    """Peak of live CPU bytes (counted from the profiler's start) during the windows marked ``label``.

    The level just before a window counts too (what is resident when the step starts). ``last_only`` restricts
    the peak to the last window: the steady-state step the estimator predicts.
    """
    events = _allocation_events(prof)
    windows = _marked_windows(prof, label)
    if last_only:
        windows = windows[-1:]
    if not windows:
        raise RuntimeError(f"no profiler window labelled {label!r}")
    peak = 0
    pos = 0
    level = 0
    for start, end in windows:
        while pos < len(events) and events[pos][0] < start:
            level = events[pos][1]
            pos += 1
        peak = max(peak, level)
        while pos < len(events) and events[pos][0] <= end:
            level = events[pos][1]
            peak = max(peak, level)
            pos += 1
    return peak


def measure_step_peak_cpu(spec: GNNJobSpec, seed: int = 0, root: str | Path | None = None) -> int:
    """Ground truth for the estimator: the profiler's peak of one steady-state step on CPU.

    Profiles everything from graph creation on (so every resident byte is counted), runs one warm-up step (the
    optimizer creates its state) and reports the peak of the second step. For ``parallelism: N`` inference it runs
    the N workers' forward passes concurrently, as the worker does.
    """
    import gc

    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        graph = make_graph(spec, seed, root)
        model = build_model(spec, features=graph.layout.features, classes=graph.layout.classes)
        run_step(model, _first_batch(spec, graph, seed), spec.mode)
        batch = _first_batch(spec, graph, seed)
        workers = spec.parallelism if spec.mode == "infer" else 1
        with torch.profiler.record_function(STEP_MARK):
            if workers == 1:
                run_step(model, batch, spec.mode)
            else:
                barrier = threading.Barrier(workers)

                def one() -> None:
                    barrier.wait()
                    run_step(model, batch, spec.mode)

                threads = [threading.Thread(target=one) for _ in range(workers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        del batch
    return profiled_peak(prof, last_only=True)


def _first_batch(spec: GNNJobSpec, graph: Graph, seed: int) -> Graph:
    if spec.batching.mode != "minibatch":
        return graph
    return next(iter(sample_batches(graph, spec, seed=seed)))


def _batches(spec: GNNJobSpec, graph: Graph, seed: int) -> Iterator[Graph]:
    """The step inputs: the whole graph each step, or sampled batches (endlessly, reshuffled each pass)."""
    if spec.batching.mode != "minibatch":
        while True:
            yield graph
    epoch = 0
    while True:
        yield from sample_batches(graph, spec, seed=seed + epoch)
        epoch += 1


def steps_for(spec: GNNJobSpec, graph: Graph, epochs: int | None) -> int:
    """Number of steps: epochs (times batches per epoch for mini-batch training), or inference requests."""
    if spec.mode == "infer":
        return spec.steps
    n = epochs if epochs is not None else spec.steps
    if spec.batching.mode == "minibatch":
        per_epoch = -(-graph.target.numel() // int(spec.batching.batch_size or 1))
        return n * per_epoch
    return n


@contextmanager
def _peak_meter(device: str) -> Iterator[Callable[[], int]]:
    """Yields a function returning the peak bytes seen inside the block (profiler on CPU, CUDA stats on GPU)."""
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        yield lambda: int(torch.cuda.max_memory_allocated())
        return
    from torch.profiler import ProfilerActivity, profile

    holder: dict[str, int] = {}
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        yield lambda: holder["peak"]
    holder["peak"] = profiled_peak(prof)


def run_job(
    spec: GNNJobSpec,
    device: str = "cpu",
    epochs: int | None = None,
    seed: int = 0,
    root: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
) -> WorkerResult:
    """Run the job; ``progress(n)`` is called after every n finished steps, ``on_start(total)`` once before."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available to this process")
    torch.manual_seed(seed)
    with _peak_meter(device) as peak:
        graph = make_graph(spec, seed, root)
        model = build_model(spec, features=graph.layout.features, classes=graph.layout.classes, device=device)
        graph = graph.to(device)
        total = steps_for(spec, graph, epochs)
        if on_start is not None:
            on_start(total)
        started = time.perf_counter()
        workers = spec.parallelism if spec.mode == "infer" else 1
        if workers == 1:
            batches = _batches(spec, graph, seed)
            for _ in range(total):
                with torch.profiler.record_function(STEP_MARK):
                    run_step(model, next(batches).to(device), spec.mode)
                if progress is not None:
                    progress(1)
        else:
            _serve_parallel(spec, model, graph, total, workers, device, seed, progress)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    return WorkerResult(observed_peak_bytes=peak(), seconds=round(seconds, 6), steps=total)


def _serve_parallel(
    spec: GNNJobSpec,
    model: Any,
    graph: Graph,
    total: int,
    workers: int,
    device: str,
    seed: int,
    progress: Callable[[int], None] | None,
) -> None:
    """N threads share ``model`` and ``graph``; thread i serves requests i, i+N, ... (inference only)."""
    lock = threading.Lock()
    errors: list[BaseException] = []

    def serve(rank: int) -> None:
        try:
            batches = _batches(spec, graph, seed + 1000 * rank)
            for _ in range(rank, total, workers):
                with torch.profiler.record_function(STEP_MARK):
                    run_step(model, next(batches).to(device), "infer")
                if progress is not None:
                    with lock:
                        progress(1)
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(rank,), name=f"gnnsched-infer-{rank}") for rank in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
