"""The portable step runner: an entrypoint job's GPU pod, run in the user's own image with no gnnsched installed.

The operator's init container copies this directory into an ``emptyDir``; the job's container runs, with the image's
own Python, torch and PyG::

    python <copy>/gnnsched_portable/gate_launch.py -- python <copy>/gnnsched_portable/run_launch.py \
        --request '<json>' --device cuda

The gate (``gate.py``) waits for the node agent's admission and ``exec``s this runner with the admitted GPU and MPS
limits in its environment. The request (``gnnsched.entrypoint_probe.run_request``, built by the operator from the
spec) carries what the image cannot read itself (it has no YAML parser and no gnnsched): the entrypoint, the mode,
the optimizer, the graph's dimensions, the number of steps and inference workers, and the seed.

What it does is the built-in worker's (``gnnsched worker``) loop, from the same modules: the
synthetic graph (``graph.py``), the user's model and the step (``step.py``), the progress lines on the gate's pipe
(``progress.py``), and a fake GPU's limit when the agent asks for one (``fake_memory.py``). Its one JSON result line
(stdout and ``$GNNSCHED_RESULT_FILE``, the termination message) has the worker's keys and meaning
(``gnnsched.closed_loop.AttemptResult``): ``outcome`` ``succeeded``/``memory-exceeded``/``fault``,
``observed_peak_bytes``, ``seconds``, ``steps``, ``limit_bytes`` and, when it failed, ``held_bytes``,
``requested_bytes`` and ``message``. Exit status: 0 succeeded, 1 another outcome (after the line), 2 bad input (one
line on stderr naming the field or the unreadable checkpoint), 143 stopped by SIGTERM after saving its checkpoint.

The observed peak: on CUDA what the GPU counts (``torch.cuda.max_memory_reserved`` plus, under an MPS limit, what the
client holds beyond it: limit - free - reserved, the CUDA context and kernels; without a limit the reserved bytes
alone, and the node agent's NVML measurement, which wins over this number anyway); on the CPU the peak of live tensor
bytes, counted by the storage-booking dispatch mode from the graph's creation on (the fake GPU's count).

Mini-batch jobs sample with the worker's own sampler (``sampler.py``). Not here: the start-up-first gate
(``--prestart``: the runner starts after its admission) and a fake GPU's injected faults.

Checkpoints (``spec.checkpoint``; ``checkpoint.py``): with ``$GNNSCHED_CHECKPOINT_DIR`` and
``$GNNSCHED_CHECKPOINT_EVERY_S`` set, the runner resumes from the directory's checkpoint, saves there every that many
seconds and, on SIGTERM, at the end of the current step, then exits 143 with one line on stderr and no result line;
its result line adds ``resumed_from_step``, ``checkpoint_step``, ``checkpoint_saves``, ``checkpoint_seconds`` and
``lost_seconds``. The loop around the steps is the worker's own (``checkpoint.checkpointed_steps``), so both save the
same file at the same points and resume either's. Parallel inference keeps no state worth saving and restarts, as
the worker's does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from .checkpoint import EXIT_DRAINED, Checkpointer, CheckpointError, Drained, checkpointed_steps
from .fake_memory import ENV_FAKE_GPU_MEMORY, FakeGPUMemory, out_of_memory_error, parse_footprint
from .mps_limit import ENV_MPS_MEMORY_LIMIT, parse_mps_memory_limit
from .progress import ENV_PROGRESS_FD, StepReporter
from .step import (
    EntrypointError,
    GraphDims,
    attach_optimizer,
    build_entrypoint_model,
    make_optimizer,
    run_step,
    serve_parallel,
    step_inputs,
)

ENV_RESULT_FILE = "GNNSCHED_RESULT_FILE"
ENV_CPU_REQUEST = "GNNSCHED_CPU_REQUEST"
"""``gnnsched.contract``'s names, spelled out (``tests/test_portable_gpu_pod.py`` checks they agree)."""

EXIT_ATTEMPT_FAILED = 1
EXIT_USAGE = 2
MAX_MESSAGE = 1024

# The worker's classification of a failed step (``gnnsched.closed_loop``; the test checks the patterns agree).
FAULT_PATTERNS = re.compile(
    r"cudaErrorMpsClientTerminated|MPS client has been terminated|CUDA error: an illegal memory access"
    r"|cudaErrorIllegalAddress|CUDA error: unspecified launch failure|cudaErrorLaunchFailure"
    r"|CUDA error: uncorrectable ECC error|cudaErrorECCUncorrectable",
)
_TRIED_TO_ALLOCATE = re.compile(r"Tried to allocate ([0-9.]+) ([KMGT]i?B)")
_UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 2**10, "MB": 2**20, "GB": 2**30, "TB": 2**40}


class RunError(Exception):
    """Bad input to the runner; the message names the field (the request's, a flag or an environment variable)."""


@dataclass(frozen=True)
class RunRequest:
    """What the operator tells the runner (``gnnsched.entrypoint_probe.run_request`` writes it)."""

    entrypoint: str
    mode: str
    nodes: int
    edges: int
    features: int
    classes: int
    steps: int
    parallelism: int = 1
    optimizer: str = "adam"
    learning_rate: float = 0.01
    weight_decay: float = 0.0
    momentum: float | None = None
    seed: int = 0
    batch_size: int | None = None  # mini-batch jobs: seed nodes per batch, and the fanout of each hop
    fanouts: tuple[int, ...] = ()

    @classmethod
    def from_json(cls, text: str) -> RunRequest:
        try:
            raw = json.loads(text)
        except ValueError as exc:
            raise RunError(f"--request: not JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise RunError("--request: must be a JSON object")
        graph_raw, opt_raw = raw.get("graph"), raw.get("optimizer")
        graph: dict[str, Any] = graph_raw if isinstance(graph_raw, dict) else {}
        opt: dict[str, Any] = opt_raw if isinstance(opt_raw, dict) else {}

        def whole(where: str, value: Any, low: int) -> int:
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise RunError(f"--request: {where}: must be a whole number >= {low}, got {value!r}")
            return value

        def number(where: str, value: Any, default: float | None) -> float | None:
            if value is None:
                return default
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise RunError(f"--request: {where}: must be a number >= 0, got {value!r}")
            return float(value)

        entrypoint, mode = raw.get("entrypoint"), raw.get("mode")
        if not isinstance(entrypoint, str) or not entrypoint:
            raise RunError("--request: entrypoint: must be package.module:function")
        if mode not in ("train", "infer"):
            raise RunError(f"--request: mode: must be train or infer, got {mode!r}")
        name = opt.get("name", "adam")
        if mode == "train" and name not in ("adam", "adamw", "sgd"):
            raise RunError(f"--request: optimizer.name: must be adam, adamw or sgd, got {name!r}")
        batching_raw = raw.get("batching")
        batch_size: int | None = None
        fanouts: tuple[int, ...] = ()
        if batching_raw is not None:
            if not isinstance(batching_raw, dict):
                raise RunError("--request: batching: must be an object")
            batch_size = whole("batching.batchSize", batching_raw.get("batchSize"), 1)
            hops = batching_raw.get("fanouts")
            if not isinstance(hops, list) or not hops:
                raise RunError(f"--request: batching.fanouts: must be a non-empty list, got {hops!r}")
            fanouts = tuple(whole(f"batching.fanouts[{i}]", f, 1) for i, f in enumerate(hops))
        return cls(
            entrypoint=entrypoint, mode=mode, batch_size=batch_size, fanouts=fanouts,
            nodes=whole("graph.nodes", graph.get("nodes"), 1), edges=whole("graph.edges", graph.get("edges"), 0),
            features=whole("graph.features", graph.get("features"), 1),
            classes=whole("graph.classes", graph.get("classes"), 1),
            steps=whole("steps", raw.get("steps"), 1), parallelism=whole("parallelism", raw.get("parallelism", 1), 1),
            optimizer=str(name), learning_rate=number("optimizer.learningRate", opt.get("learningRate"), 0.01) or 0.0,
            weight_decay=number("optimizer.weightDecay", opt.get("weightDecay"), 0.0) or 0.0,
            momentum=number("optimizer.momentum", opt.get("momentum"), None),
            seed=whole("seed", raw.get("seed", 0), 0),
        )


@dataclass
class StepGraphTensors:
    """The graph one step reads (``step.StepGraph``)."""

    x: torch.Tensor
    edge_index: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor

    def to(self, device: str) -> StepGraphTensors:
        return StepGraphTensors(self.x.to(device), self.edge_index.to(device), self.y.to(device),
                                self.target.to(device))


def mps_limit_bytes(text: str, device: int = 0) -> int | None:
    """``mps_limit.parse_mps_memory_limit`` (the worker's rule too), with ``RunError`` naming the variable when it
    cannot be read."""
    try:
        return parse_mps_memory_limit(text, device)
    except ValueError as exc:
        raise RunError(str(exc)) from None


def intra_op_threads(environ: dict[str, str], available: int) -> int | None:
    """``gnnsched.worker_cli.intra_op_threads``: torch's pool sized by the pod's CPU request, not the node's cores."""
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    raw = environ.get(ENV_CPU_REQUEST, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise RunError(f"{ENV_CPU_REQUEST}: expected a whole number of CPUs, got {raw!r}")
    request = int(raw)
    return None if request == 0 else max(1, min(request, available))


def failed_request_bytes(text: str) -> int | None:
    match = _TRIED_TO_ALLOCATE.search(text)
    return None if match is None else int(float(match.group(1)) * _UNIT[match.group(2)])


def _cuda_peak(limit_bytes: int | None) -> int:
    reserved_peak = int(torch.cuda.max_memory_reserved())
    if limit_bytes:
        free, _total = torch.cuda.mem_get_info()
        beside = limit_bytes - int(free) - int(torch.cuda.memory_reserved())
        return reserved_peak + max(0, beside)
    return reserved_peak


def run(request: RunRequest, device: str, limit_bytes: int | None, meter: FakeGPUMemory,
        progress: Callable[[int], None], on_start: Callable[[int], None],
        checkpointer: Checkpointer | None = None, reached: list[int] | None = None) -> dict[str, Any]:
    """The job's steps; returns the succeeded result's fields. Errors propagate (``attempt`` classifies them).
    ``reached`` is kept at the number of steps done (resumed ones included): the step a failed attempt stopped at."""
    torch.manual_seed(request.seed)
    with meter.mode():
        x, edge_index, y, target = _synthetic(request)
        graph = StepGraphTensors(x, edge_index, y, target)
        del x, edge_index, y, target
        dims = GraphDims(num_nodes=request.nodes, num_edges=request.edges, num_features=request.features,
                         num_classes=request.classes)
        try:
            model = build_entrypoint_model(request.entrypoint, dims)
        except EntrypointError as exc:
            raise RunError(f"spec.model.entrypoint: {exc}") from None
        if device != "cpu":
            model = model.to(device)
        inputs = _StepInputs(request, graph, device)
        del graph
        optimizer = None
        if request.mode == "train":
            optimizer = make_optimizer(model.parameters(), request.optimizer, request.learning_rate,
                                       request.weight_decay, request.momentum)
        attach_optimizer(model, optimizer)
        total = inputs.total_steps()
        on_start(total)
        started = time.perf_counter()
        workers = request.parallelism if request.mode == "infer" else 1
        if workers == 1:
            stream = inputs.stream()
            for index in checkpointed_steps(checkpointer, model, optimizer, stream, total, progress):
                if reached is not None:
                    reached[:] = [index]
                run_step(model, next(stream), request.mode)
                if reached is not None:
                    reached[:] = [index + 1]
                progress(1)
        else:
            serve_parallel(model, inputs.stream, total, workers, lambda: progress(1), meter.mode)
        if device == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
    peak = _cuda_peak(limit_bytes) if device == "cuda" else meter.peak
    return {"observed_peak_bytes": peak, "seconds": round(seconds, 6), "steps": total}


class _StepInputs:
    """What each step consumes, as the worker's ``_StepInputs``: the whole graph every step (full-batch, moved to the
    device once), or sampled batches from one sampler that lives for the whole job (mini-batch: the full graph stays
    in host memory and only batches move to the device; each inference worker reshuffles with its own seed)."""

    def __init__(self, request: RunRequest, graph: StepGraphTensors, device: str) -> None:
        self.request = request
        self.device = device
        self.lock = threading.Lock()
        self.sampler: Any = None
        if request.batch_size is not None:
            from .sampler import PortableSampler

            self.sampler = PortableSampler(graph.x, graph.edge_index, graph.y, graph.target, request.nodes,
                                           request.batch_size, list(request.fanouts))
            self.graph = graph
        else:
            self.graph = graph.to(device)

    def total_steps(self) -> int:
        """Epochs (times batches per epoch for mini-batch training), or inference requests (``steps_for``)."""
        r = self.request
        if r.mode == "train" and r.batch_size is not None:
            return r.steps * -(-int(self.graph.target.numel()) // r.batch_size)
        return r.steps

    def stream(self, rank: int = 0) -> Iterator[Any]:
        return step_inputs(self.graph, self.sampler, self.device, self.request.seed, rank, self.lock)


def _synthetic(request: RunRequest) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from .graph import synthetic_tensors

    return synthetic_tensors(request.nodes, request.edges, request.features, request.classes, request.seed)


def attempt(request: RunRequest, device: str, environ: dict[str, str],
            progress: Callable[[int], None] = lambda n: None,
            on_start: Callable[[int], None] = lambda total: None,
            checkpointer: Checkpointer | None = None) -> dict[str, Any]:
    """One attempt as the closed loop sees it: the result line's fields (None values left out). With
    ``checkpointer`` (:func:`checkpointer_from`) it resumes, saves and reports as the worker's ``run_attempt``; a
    SIGTERM's save ends it with :class:`checkpoint.Drained`."""
    raw_limit = environ.get(ENV_MPS_MEMORY_LIMIT, "").strip()
    limit_bytes = mps_limit_bytes(raw_limit) if raw_limit else None
    raw_fake = environ.get(ENV_FAKE_GPU_MEMORY, "").strip()
    if raw_fake:
        if device != "cpu":
            raise RunError(f"{ENV_FAKE_GPU_MEMORY}: a fake GPU runs the job on the CPU; not with --device {device}")
        try:
            meter = FakeGPUMemory(limit_bytes=limit_bytes, footprint=parse_footprint(raw_fake))
        except ValueError as exc:
            raise RunError(f"{ENV_FAKE_GPU_MEMORY}: {exc}") from None
    else:  # no limit: the same count, as the peak of live tensor bytes
        meter = FakeGPUMemory(limit_bytes=None)
    if device == "cuda" and not torch.cuda.is_available():
        raise RunError("--device: cuda requested but no CUDA device is available to this process")
    result: dict[str, Any]
    reached = [0]
    try:
        result = {"outcome": "succeeded", **run(request, device, limit_bytes, meter, progress, on_start,
                                                checkpointer, reached)}
    except out_of_memory_error() as exc:
        text = str(exc)
        if raw_fake:
            held, requested, peak = meter.held_at_failure, meter.failed_request, meter.peak
        elif device == "cuda":
            beside = _cuda_peak(limit_bytes) - int(torch.cuda.max_memory_reserved())
            held = int(torch.cuda.memory_reserved()) + beside
            requested, peak = failed_request_bytes(text), _cuda_peak(limit_bytes)
        else:
            held, requested, peak = None, failed_request_bytes(text), None
        result = {"outcome": "memory-exceeded", "observed_peak_bytes": peak, "held_bytes": held,
                  "requested_bytes": requested, "message": text[:MAX_MESSAGE]}
    except RuntimeError as exc:
        text = str(exc)
        if not FAULT_PATTERNS.search(text):
            raise
        result = {"outcome": "fault", "observed_peak_bytes": meter.peak if raw_fake else None,
                  "message": text[:MAX_MESSAGE], "steps": reached[0]}
    result["limit_bytes"] = limit_bytes
    if checkpointer is not None:
        result.update(checkpointer.result_fields(succeeded=result["outcome"] == "succeeded"))
    return {k: v for k, v in result.items() if v is not None}


def checkpointer_from(environ: dict[str, str]) -> Checkpointer | None:
    """``spec.checkpoint``'s contract from the pod's environment, with SIGTERM turned into a save at the end of the
    current step (the worker's ``_checkpointer``); None when the job does not checkpoint. Bad values are a
    ``RunError`` naming the variable."""
    try:
        checkpointer = Checkpointer.from_env(environ)
    except (ValueError, OSError) as exc:
        raise RunError(str(exc)) from None
    if checkpointer is not None:
        checkpointer.install_sigterm()
    return checkpointer


class _OneLineParser(argparse.ArgumentParser):
    """Bad flags (``spec.args`` reach the runner) are one line naming the flag, as every other bad input."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (spec.args)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="run_launch.py", description="Run an entrypoint job's steps (gnnsched).")
    parser.add_argument("--request", required=True, help="the operator's JSON run request")
    parser.add_argument("--device", default="cuda", help="cuda or cpu")
    parser.add_argument("--epochs", type=int, default=None, help="override the request's steps (training only)")
    parser.add_argument("--seed", type=int, default=None, help="override the request's seed")
    parser.add_argument("--progress", "--no-progress", action="store_true", dest="ignored",
                        help="accepted as gnnsched worker does; the runner draws no progress bar")
    args = parser.parse_args(argv)
    environ = dict(os.environ)
    try:
        if args.device not in ("cpu", "cuda"):
            raise RunError(f"--device: must be cpu or cuda, got {args.device!r}")
        request = RunRequest.from_json(args.request)
        if args.epochs is not None:
            if request.mode != "train" or args.epochs < 1:
                raise RunError(f"--epochs: a positive number, for training jobs only; got {args.epochs}")
            request = RunRequest(**{**request.__dict__, "steps": args.epochs})
        if args.seed is not None:
            request = RunRequest(**{**request.__dict__, "seed": args.seed})
        threads = intra_op_threads(environ, len(os.sched_getaffinity(0)))
        if threads is not None:
            torch.set_num_threads(threads)
        try:
            reporter = StepReporter.from_env(environ)
        except ValueError as exc:
            raise RunError(str(exc)) from None

        def advance(n: int) -> None:
            if reporter is not None:
                reporter.advance(n)

        def start(total: int) -> None:
            if reporter is not None:
                reporter.start(total)

        result = attempt(request, args.device, environ, advance, start, checkpointer_from(environ))
    except (RunError, CheckpointError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Drained as exc:  # SIGTERM, after the save: the next attempt resumes here
        print(f"gnnsched runner: {exc}", file=sys.stderr)
        return EXIT_DRAINED
    line = json.dumps(result, separators=(",", ":")) + "\n"
    sys.stdout.write(line)
    sys.stdout.flush()
    result_file = environ.get(ENV_RESULT_FILE)
    if result_file:
        try:
            with open(result_file, "w", encoding="utf-8") as handle:
                handle.write(line)
        except OSError as exc:
            print(f"warning: cannot write the result to {ENV_RESULT_FILE}={result_file}: {exc}", file=sys.stderr)
    if result["outcome"] != "succeeded":
        first = str(result.get("message") or "").splitlines()[:1]
        print(f"gnnsched runner: {result['outcome']}: {first[0] if first else ''}", file=sys.stderr)
        return EXIT_ATTEMPT_FAILED
    return 0


__all__ = ["ENV_PROGRESS_FD", "RunError", "RunRequest", "attempt", "main"]
