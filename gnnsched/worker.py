"""``gnnsched worker``: run a GNNJob for real and report the peak memory it used.

The worker is what a job's pod runs (behind the gate). It builds the graph and the model with the same functions the
estimator traces (``gnnsched.models``), runs the job's steps (training epochs or inference requests) and reports one
JSON line, a ``gnnsched.closed_loop.AttemptResult``: ``outcome``, ``observed_peak_bytes`` (on CPU the peak of live
tensor bytes, from ``torch.profiler`` allocation events over the first steps (``profiled_steps``); on CUDA what the GPU
counts: ``torch.cuda.max_memory_reserved`` plus the CUDA context), ``seconds`` (wall time of the steps), ``steps`` and
``limit_bytes`` (the MPS limit it ran under).

A CUDA out-of-memory error inside the attempt's own MPS limit is not a crash but an outcome (``memory-exceeded``) that
the operator answers with a larger retry: :func:`run_attempt` catches it and reports what the process held and the
request that failed. A fatal GPU/MPS error (``cudaErrorMpsClientTerminated``, an illegal address, ...) is reported as
``fault`` with its text, so the node agent can tell the victims of a co-located fault from its suspect. Under a fake
GPU (``GNNSCHED_FAKE_GPU_MEMORY``, ``gnnsched.gpu.fake_memory``) the limit is enforced here, with the same error.

Inference with ``parallelism: N`` runs N threads that share one copy of the model and the graph (the model-sharing
seed: read-only weights need one copy), each serving its share of the requests.

Mini-batch jobs (sage/gat with ``batching.mode: minibatch``) sample neighbours with ``gnnsched.models``' pure-torch
sampler: an epoch visits every labelled node once in batches; an inference request is one sampled batch.

Start-up behind the wait: under ``gnnsched gate --prestart`` the worker builds the graph and the model on the CPU
(:func:`prepare_job`) before its admission, and only after it moves them to the device (``prepared=`` of
:func:`run_job`), so the process's start-up overlaps its wait at the gate and no device memory is touched before it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch._C._profiler import _EventType

from gnnsched.closed_loop import AttemptResult, classify_log, failed_request_bytes
from gnnsched.gpu.fake_faults import FakeGPUFaultWatch
from gnnsched.gpu.fake_memory import FakeGPUMemory
from gnnsched.models import Graph, NeighborSampler, build_model, make_graph
from gnnsched.portable.checkpoint import Checkpointer, checkpointed_steps
from gnnsched.portable.step import run_step, serve_parallel, step_inputs
from gnnsched.portable.storage_booking import storage_booking_mode
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
        model = build_model(spec, graph=graph)
        inputs = _StepInputs(spec, graph, "cpu", seed)
        stream = inputs.stream()
        run_step(model, next(stream), spec.mode)
        batch = next(stream)
        workers = spec.parallelism if spec.mode == "infer" else 1
        with torch.profiler.record_function(STEP_MARK):
            if workers == 1:
                run_step(model, batch, spec.mode)
            else:
                meter = ConcurrentMeter(_resident_tensors(model, batch))
                barrier = threading.Barrier(workers)

                def one(step_batch: Graph) -> None:
                    with meter.thread_mode():
                        barrier.wait()
                        run_step(model, step_batch, spec.mode)

                # the batch goes in as an argument, not a closure: ``del batch`` below must drop the last reference
                # (a Thread releases its args when it finishes) so its free is recorded inside the profile
                threads = [threading.Thread(target=one, args=(batch,)) for _ in range(workers)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
        del batch
    resident = profiled_peak(prof, last_only=True)
    return resident if workers == 1 else resident + meter.peak


class ConcurrentMeter:
    """Peak of tensor bytes created by several threads at once (the profiler records only the thread that started it).

    Each worker thread enters its own ``thread_mode()``; all of them add to one counter under a lock. A storage is
    counted from the operator that creates it until its last reference dies. Used for parallel inference only, where
    no autograd runs, so a dispatch mode sees exactly the allocations a plain run makes.
    """

    def __init__(self, resident: list[torch.Tensor] | tuple[torch.Tensor, ...] = ()) -> None:
        self._lock = threading.Lock()
        self.live = 0
        self.peak = 0
        self._known: set[int] = set()
        # Storages that exist before the threads start (graph, weights) are already counted by the caller; a view
        # of one (``edge_index[0]``) must not count its whole storage again.
        self._resident = {id(t.untyped_storage()) for t in resident}
        self._resident_refs = [t.untyped_storage() for t in resident]  # keep ids stable while the meter lives

    def _book(self, key: int, nbytes: int) -> int | None:
        with self._lock:
            if key in self._known or key in self._resident:
                return None
            self._known.add(key)
            self.live += nbytes
            self.peak = max(self.peak, self.live)
            return nbytes

    def _drop(self, key: int, nbytes: int) -> None:
        with self._lock:
            self._known.discard(key)
            self.live -= nbytes

    def thread_mode(self) -> Any:
        """This thread's dispatch mode adding to the shared count."""
        return storage_booking_mode(self._book, self._drop)


def _resident_tensors(model: Any, graph: Graph) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), graph.x, graph.edge_index, graph.y, graph.target]


class _StepInputs:
    """What each step consumes: the whole graph every step (full-batch), or sampled batches from one sampler that
    lives for the whole job (mini-batch; the full graph stays in host memory and only batches move to ``device``)."""

    def __init__(self, spec: GNNJobSpec, graph: Graph, device: str, seed: int) -> None:
        self.minibatch = spec.batching.mode == "minibatch"
        self.device = device
        self.seed = seed
        self._sample_lock = threading.Lock()
        if self.minibatch:
            self.sampler: NeighborSampler | None = NeighborSampler(graph, spec)
            self.graph = graph
        else:
            self.sampler = None
            self.graph = graph.to(device)

    def stream(self, rank: int = 0) -> Iterator[Graph]:
        """Endless step inputs; each worker rank reshuffles with its own seed (``step_inputs``)."""
        return step_inputs(self.graph, self.sampler, self.device, self.seed, rank, self._sample_lock)


def steps_for(spec: GNNJobSpec, graph: Graph, epochs: int | None) -> int:
    """Number of steps: epochs (times batches per epoch for mini-batch training), or inference requests."""
    if spec.mode == "infer":
        return spec.steps
    n = epochs if epochs is not None else spec.steps
    if spec.batching.mode == "minibatch":
        per_epoch = -(-graph.target.numel() // int(spec.batching.batch_size or 1))
        return n * per_epoch
    return n


PROFILED_STEPS = 20
"""On CPU the profiler records the first this-many mini-batch steps, then stops: its event buffer grows with every
operator, so profiling a million-request job whole would cost more memory than the job; the peak is the peak over the
first batches."""

PROFILED_FULL_BATCH_STEPS = 3
"""Full-batch steps after the second are identical (the first creates the optimizer's state, the second is the steady
state the estimator predicts), so three are profiled. Profiling is not free: measured on the shared two-core machine,
a step of ``examples/gin-train-custom.yaml`` took 7.4-8.1 s plain and 9.0-14.6 s under the memory profiler, so
profiling 20 of its 50 epochs cost about a minute for nothing."""


def profiled_steps(spec: GNNJobSpec) -> int:
    """How many of the job's first steps the CPU memory profiler records (see the two constants above)."""
    return PROFILED_STEPS if spec.batching.mode == "minibatch" else min(PROFILED_STEPS, PROFILED_FULL_BATCH_STEPS)


class _PeakMeter:
    """Peak live tensor bytes of a run: the profiler's allocation events on CPU, CUDA's allocator stats on GPU."""

    def __init__(self, device: str, profiled: int = PROFILED_STEPS, limit_bytes: int | None = None) -> None:
        self.device = device
        self.profiled = profiled
        self.limit_bytes = limit_bytes
        self._prof: Any = None
        self._peak: int | None = None

    def __enter__(self) -> _PeakMeter:
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            from torch.profiler import ProfilerActivity, profile

            self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self._prof.start()
        return self

    def step_done(self, index: int) -> None:
        if self._prof is not None and index + 1 == self.profiled:
            self._stop()

    def _stop(self) -> None:
        if self._prof is not None:
            self._prof.stop()
            self._peak = profiled_peak(self._prof)
            self._prof = None

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is not None and self._prof is not None:
            # The run failed (e.g. out of memory before its first step): stop profiling, keep the error.
            self._prof.stop()
            self._prof = None
            return
        self._stop()

    def peak(self) -> int:
        if self.device == "cuda":
            return int(torch.cuda.max_memory_reserved()) + cuda_context_bytes(self.limit_bytes)
        if self._peak is None:
            raise RuntimeError("peak() before the meter stopped")
        return self._peak


def cuda_context_bytes(limit_bytes: int | None = None) -> int:
    """What this process holds on its GPU beside the caching allocator's reserved bytes (the CUDA context, loaded
    kernels, library state), which NVML and the MPS memory limit count: measured where the GPU tells, else the
    catalogue's constant (``gnnsched.gpu.catalogue``).

    Measured on an H100 (docs/gpu-measurements.md): 610 MiB after the first tensor, 742 MiB after GNN training steps
    (kernels load lazily, so it grows with what the job ran; hence measured at the end). Under an MPS memory limit
    the driver reports this client's free memory as the limit minus everything the client holds, so the context is
    limit - free - reserved, in any PID namespace. Without a limit, NVML's used memory of this PID minus reserved,
    when the PID is visible to NVML (not from inside a container's PID namespace)."""
    reserved = int(torch.cuda.memory_reserved())
    if limit_bytes:
        free, _total = torch.cuda.mem_get_info()
        held = limit_bytes - int(free)
        if held >= reserved:
            return held - reserved
    used = _nvml_used_by_this_process()
    if used is not None and used >= reserved:
        return used - reserved
    from gnnsched.gpu.catalogue import ARCHITECTURES, architecture_of, match_device_name

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    model = match_device_name(props.name, int(props.total_memory))
    if model is not None:
        return model.context_bytes
    # Not catalogued: its architecture's context, else the largest any architecture has (never another board's).
    arch = architecture_of((int(props.major), int(props.minor)))
    return arch.context_bytes if arch is not None else max(a.context_bytes for a in ARCHITECTURES)


@dataclass
class Prepared:
    """The CPU-side start-up of a job, done before its admission: its graph and its model, both in host memory."""

    graph: Graph | None
    model: Any
    seconds: float  # wall time of the graph load and the model build

    def take(self) -> tuple[Graph, Any]:
        """Hand the graph and the model over once (the run drops this record's references, so a CPU run's copies do
        not double the job's host memory)."""
        if self.graph is None:
            raise RuntimeError("a prepared job runs once")
        graph, model = self.graph, self.model
        self.graph = self.model = None
        return graph, model


def prepare_job(spec: GNNJobSpec, seed: int = 0, root: str | Path | None = None) -> Prepared:
    """Build the graph and the model on the CPU, touching no device: what the worker does while it waits at the gate.

    Seeds torch exactly as :func:`run_job` does before it builds them, so a prepared run draws the same weights,
    dropout masks and samples as a plain one."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    graph = make_graph(spec, seed, root)
    model = build_model(spec, graph=graph, device="cpu")
    return Prepared(graph=graph, model=model, seconds=time.perf_counter() - started)


def _on_device(prepared: Prepared, device: str) -> tuple[Graph, Any]:
    """The prepared graph and model, now on ``device`` (after admission).

    On CUDA the model's parameters move (the optimizer keeps the same parameter objects, as ``build_model`` relies
    on); the graph moves with the step inputs. On the CPU both are copied: the copies are made inside the run's peak
    meters (the profiler, a fake GPU's count), which count only what is allocated while they run, so a prepared run
    observes the same resident bytes as one that builds its graph and model there, and a fake GPU's limit applies to
    them as a real GPU's does to the host-to-device copy."""
    g, model = prepared.take()
    if device == "cpu":
        model = model._apply(lambda t: t.clone())
        graph = Graph(x=g.x.clone(), edge_index=g.edge_index.clone(), y=g.y.clone(), target=g.target.clone(),
                      layout=g.layout)
        del g
        return graph, model
    return g, model.to(device)


def _nvml_used_by_this_process() -> int | None:
    """NVML's used device memory of this PID on any GPU, ``None`` when NVML or the PID is not visible."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML (no driver, a CPU-only test machine): the caller falls back
        return None
    try:
        pid = os.getpid()
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if proc.pid == pid and proc.usedGpuMemory:
                    return int(proc.usedGpuMemory)
        return None
    except pynvml.NVMLError:
        return None
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def run_job(
    spec: GNNJobSpec,
    device: str = "cpu",
    epochs: int | None = None,
    seed: int = 0,
    root: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    fake_memory: FakeGPUMemory | None = None,
    fault_watch: FakeGPUFaultWatch | None = None,
    limit_bytes: int | None = None,
    prepared: Prepared | None = None,
    checkpointer: Checkpointer | None = None,
    reached: list[int] | None = None,
) -> WorkerResult:
    """Run the job; ``progress(n)`` is called after every n finished steps, ``on_start(total)`` once before.

    ``fake_memory``: count (and limit) device bytes as a fake GPU would; the observed peak is then its count.
    ``fault_watch``: a fake GPU's fatal faults; checked after every step, it raises CUDA's MPS client-terminated
    error as the next CUDA call after a real fault would.
    ``prepared``: the graph and model :func:`prepare_job` built before admission (``seed`` and ``root`` are then
    theirs); they are moved to ``device`` here.
    ``checkpointer``: ``spec.checkpoint``'s contract (``gnnsched.portable.checkpoint``): resume from the last save,
    save every interval and at SIGTERM (serial steps; parallel inference keeps no state worth saving and restarts).
    ``reached``: a one-item list the run keeps at the number of steps done (resumed ones included), so a caller
    learns the step an attempt failed at."""
    if device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available to this process")
    if prepared is None:
        torch.manual_seed(seed)
    fake_mode = fake_memory.mode() if fake_memory is not None else nullcontext()
    with _PeakMeter(device, profiled_steps(spec), limit_bytes) as meter_, fake_mode:
        if prepared is None:
            graph = make_graph(spec, seed, root)
            model = build_model(spec, graph=graph, device=device)
        else:
            graph, model = _on_device(prepared, device)
        inputs = _StepInputs(spec, graph, device, seed)
        total = steps_for(spec, graph, epochs)
        if on_start is not None:
            on_start(total)
        started = time.perf_counter()
        workers = spec.parallelism if spec.mode == "infer" else 1
        if workers == 1:
            stream = inputs.stream()
            steps = checkpointed_steps(checkpointer, model, getattr(model, "optimizer", None), stream, total,
                                       progress)
            for ran, index in enumerate(steps):  # ``ran``: this attempt's steps, the profiler's count
                if reached is not None:
                    reached[:] = [index]
                with torch.profiler.record_function(STEP_MARK):
                    run_step(model, next(stream), spec.mode)
                meter_.step_done(ran)
                if reached is not None:
                    reached[:] = [index + 1]
                if fault_watch is not None:
                    fault_watch.check(index + 1)
                if progress is not None:
                    progress(1)
        else:
            meter = ConcurrentMeter(_resident_tensors(model, inputs.graph)) if device == "cpu" else None
            with torch.profiler.record_function(STEP_MARK):
                pass  # marks the resident level when serving starts (child threads are invisible to the profiler)
            _serve_parallel(model, inputs, total, workers, progress, meter, fake_memory, fault_watch)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    observed = meter_.peak()
    if workers > 1 and device == "cpu":
        observed += meter.peak  # type: ignore[union-attr]
    if fake_memory is not None:
        observed = fake_memory.peak
    return WorkerResult(observed_peak_bytes=observed, seconds=round(seconds, 6), steps=total)


def _serve_parallel(
    model: Any,
    inputs: _StepInputs,
    total: int,
    workers: int,
    progress: Callable[[int], None] | None,
    meter: ConcurrentMeter | None = None,
    fake_memory: FakeGPUMemory | None = None,
    fault_watch: FakeGPUFaultWatch | None = None,
) -> None:
    """``serve_parallel`` with the worker's meters (the concurrent peak meter, the fake GPU's counter) entered in each
    thread and, after each request, progress and the fake GPU's fault check (inference only)."""

    def thread_modes() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if meter is not None:
            stack.enter_context(meter.thread_mode())
        if fake_memory is not None:
            stack.enter_context(fake_memory.mode())
        return stack

    def on_step() -> None:
        if progress is not None:
            progress(1)
        if fault_watch is not None:
            fault_watch.check()

    serve_parallel(model, inputs.stream, total, workers, on_step, thread_modes)


def run_attempt(
    spec: GNNJobSpec,
    device: str = "cpu",
    epochs: int | None = None,
    seed: int = 0,
    root: str | Path | None = None,
    progress: Callable[[int], None] | None = None,
    on_start: Callable[[int], None] | None = None,
    limit_bytes: int | None = None,
    fake_memory: FakeGPUMemory | None = None,
    fault_watch: FakeGPUFaultWatch | None = None,
    prepared: Prepared | None = None,
    checkpointer: Checkpointer | None = None,
) -> AttemptResult:
    """One attempt of the job, ended as the closed loop sees it: ``succeeded``, ``memory-exceeded`` or ``fault``.

    ``limit_bytes`` is the MPS limit the gate set (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``), reported so the operator
    knows what the attempt ran under. Any other error is not an outcome of the loop and propagates (the pod fails as
    an ordinary failure).

    With ``checkpointer`` the result line also says the step the attempt resumed from, the last step it saved and,
    for a failed attempt, the seconds of steps it lost since that save (``steps``: the step it failed at)."""
    reached = [0]
    extra: dict[str, Any] = {}
    try:
        result = run_job(spec, device=device, epochs=epochs, seed=seed, root=root, progress=progress,
                         on_start=on_start, fake_memory=fake_memory, fault_watch=fault_watch,
                         limit_bytes=limit_bytes, prepared=prepared, checkpointer=checkpointer, reached=reached)
    except torch.OutOfMemoryError as exc:
        text = str(exc)
        if fake_memory is not None:
            held, requested, peak = fake_memory.held_at_failure, fake_memory.failed_request, fake_memory.peak
        elif device == "cuda":
            context = cuda_context_bytes(limit_bytes)
            held = int(torch.cuda.memory_reserved()) + context
            requested = failed_request_bytes(text)
            peak = int(torch.cuda.max_memory_reserved()) + context
        else:  # a host allocation failure reported as OOM without a device: what the message says is all there is
            held, requested, peak = None, failed_request_bytes(text), None
        if checkpointer is not None:
            extra = checkpointer.result_fields(succeeded=False)
        return AttemptResult(outcome="memory-exceeded", observed_peak_bytes=peak, limit_bytes=limit_bytes,
                             held_bytes=held, requested_bytes=requested, message=text[:1024], **extra)
    except RuntimeError as exc:
        text = str(exc)
        if classify_log(text) != "fault":
            raise
        peak = None
        if device == "cuda":
            try:
                peak = int(torch.cuda.max_memory_reserved()) + cuda_context_bytes(limit_bytes)
            except RuntimeError:  # the context itself may be gone after a fatal error
                peak = None
        elif fake_memory is not None:
            peak = fake_memory.peak
        if checkpointer is not None:
            extra = checkpointer.result_fields(succeeded=False)
        return AttemptResult(outcome="fault", observed_peak_bytes=peak, limit_bytes=limit_bytes, message=text[:1024],
                             steps=reached[0], **extra)
    if checkpointer is not None:
        extra = checkpointer.result_fields(succeeded=True)
    return AttemptResult(outcome="succeeded", observed_peak_bytes=result.observed_peak_bytes, seconds=result.seconds,
                         steps=result.steps, limit_bytes=limit_bytes, **extra)
