"""``gnnsched worker JOB.yaml``: run a GNNJob for real (what a job's pod runs) and report its observed peak.

Torch-free at import; the worker module loads when the command runs. Progress goes to stderr, and behind
``gnnsched gate`` to the node agent too (``$GNNSCHED_PROGRESS_FD``, :class:`gnnsched.progress.StepReporter`: steps done,
total and step time, at most every five seconds); the result is one JSON line on stdout (and in
``$GNNSCHED_RESULT_FILE``): a ``gnnsched.closed_loop.AttemptResult``, e.g.
``{"outcome": "succeeded", "observed_peak_bytes": ..., "seconds": ..., "steps": ..., "limit_bytes": ...}``.

Exit status: 0 when the attempt succeeded; 1 when it ended ``memory-exceeded`` (CUDA out of memory inside its MPS
limit) or ``fault`` (a fatal GPU/MPS error), after writing the result line that says which; 2 for bad input.

Started by ``gnnsched gate --prestart`` (``$GNNSCHED_GATE_HANDOFF_FD`` set), the worker first does its CPU-side
start-up (imports, graph, model) under ``gnnsched.gpu.cuda_guard.PreAdmissionGuard`` (nothing may initialise CUDA while
no GPU is visible), then waits for the gate's hand-off (``gnnsched.gate_handoff``), removes the guard and only then
reads its MPS limit and fake-GPU settings and touches the device; it exits 3 when the gate rejected it and 4 when no
admission came (as the gate would). Where the prestarted process cannot use its admitted GPU (its start-up tried to
initialise CUDA before admission, or with ``--device cuda`` the runtime sees no device once admitted), it still waits
for its admission, then re-executes itself as a plain admitted worker (``$GNNSCHED_PRESTART_FALLBACK`` says why; the
result line's ``prestart_fallback`` too): the start-up is paid twice, the job is not lost.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gnnsched.cliutil import UserError, fail, user_errors
from gnnsched.contract import (
    ENV_CPU_REQUEST,
    ENV_FAKE_GPU_MEMORY,
    ENV_FAKE_GPU_USAGE,
    ENV_GATE_HANDOFF_FD,
    ENV_MPS_MEMORY_LIMIT,
    ENV_PRESTART_FALLBACK,
    ENV_RESULT_FILE,
)

if TYPE_CHECKING:
    from gnnsched.progress import StepReporter
    from gnnsched.spec import GNNJobSpec
    from gnnsched.worker import Prepared

EXIT_ATTEMPT_FAILED = 1
"""The attempt ended ``memory-exceeded`` or ``fault``; its result line says which (the pod fails, the operator reads
the termination message)."""


def intra_op_threads(environ: Mapping[str, str], available: int) -> int | None:
    """Threads for torch's intra-op pool: the job's CPU request (``$GNNSCHED_CPU_REQUEST``, whole CPUs) capped at the
    CPUs this process may run on; None leaves torch's default (no request, or ``OMP_NUM_THREADS`` set: an explicit
    choice wins).

    Why: torch sizes its pool by the node's cores, not by what the pod asked for, so several jobs on one node each run
    one thread per core. Measured on the project's shared two-core machine, four processes each training
    ``examples/gin-train-custom.yaml`` side by side: 49.5-52.7 s per step with torch's default of 2 threads each,
    43.6-49.8 s with 1. Raises :class:`UserError` naming the variable when it is not a whole number."""
    if environ.get("OMP_NUM_THREADS", "").strip():
        return None
    raw = environ.get(ENV_CPU_REQUEST, "").strip()
    if not raw:
        return None
    try:
        request = int(raw)
    except ValueError:
        raise UserError(f"{ENV_CPU_REQUEST}: expected a whole number of CPUs, got {raw!r}") from None
    if request < 0:
        raise UserError(f"{ENV_CPU_REQUEST}: must not be negative, got {request}")
    if request == 0:  # the pod requests no CPU: nothing to size by
        return None
    return max(1, min(request, available))


def worker_command(
    job: Path = typer.Argument(..., help="GNNJob manifest (YAML or JSON)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    epochs: int = typer.Option(None, "--epochs", help="Override spec.epochs (training only), e.g. for a quick run."),
    seed: int = typer.Option(0, "--seed", help="Seed for the synthetic graph, the weights and sampling."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Run a GNN job (train epochs or serve inference requests) and print its observed peak memory as JSON."""
    began = time.perf_counter()
    with user_errors():
        from gnnsched.gate_handoff import NotAdmitted, handoff_fd
        from gnnsched.spec import load_job

        try:
            gate_fd = handoff_fd()
        except NotAdmitted as exc:
            raise UserError(str(exc)) from None
        fallback = os.environ.get(ENV_PRESTART_FALLBACK, "").strip() or None
        if fallback is not None and gate_fd is not None:  # reexec_admitted removes the hand-off variable: no loop
            raise UserError(f"{ENV_PRESTART_FALLBACK}: set together with {ENV_GATE_HANDOFF_FD}; a re-executed worker "
                            "does not wait at the gate again")

        if device not in ("cpu", "cuda"):
            raise UserError(f"--device: must be cpu or cuda, got {device!r}")
        spec = load_job(job).spec
        if epochs is not None:
            if spec.mode != "train":
                raise UserError("--epochs: applies only to training jobs (spec.mode is infer)")
            if epochs < 1:
                raise UserError(f"--epochs: must be at least 1, got {epochs}")
        threads = intra_op_threads(os.environ, len(os.sched_getaffinity(0)))
        from gnnsched.progress import StepReporter

        try:
            # the gate's progress pipe: the node agent's seconds left for this pod come from these reports
            reporter = StepReporter.from_env(os.environ)
        except ValueError as exc:
            raise UserError(str(exc)) from None
    if fallback is not None:
        typer.echo(f"gnnsched worker: prestart fallback: re-executed after admission ({fallback}); the start-up runs "
                   "again with the admitted GPU visible", err=True)
    prepared = None
    if gate_fd is not None:
        prepared = _prestarted(gate_fd, spec, seed, threads, device, began)
    with user_errors():
        from gnnsched.portable.mps_limit import parse_mps_memory_limit

        limit_bytes = None
        raw_limit = os.environ.get(ENV_MPS_MEMORY_LIMIT, "").strip()
        if raw_limit:
            try:
                limit_bytes = parse_mps_memory_limit(raw_limit)
            except ValueError as exc:
                raise UserError(str(exc)) from None
        fake = None
        raw_fake = os.environ.get(ENV_FAKE_GPU_MEMORY, "").strip()
        if raw_fake:
            from gnnsched.gpu.fake_memory import FakeGPUMemory, parse_fake_gpu_memory

            if device != "cpu":
                raise UserError(
                    f"{ENV_FAKE_GPU_MEMORY}: a fake GPU runs the job on the CPU; not with --device {device}"
                )
            try:
                footprint = parse_fake_gpu_memory(raw_fake)
            except ValueError as exc:
                raise UserError(str(exc)) from None
            fake = FakeGPUMemory(limit_bytes=limit_bytes, footprint=footprint)
            usage_dir = os.environ.get(ENV_FAKE_GPU_USAGE, "").strip()
            gpu_uuid = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
            if usage_dir and gpu_uuid:  # the stand-in driver's per-process view (node agent --fake-gpu-usage)
                from functools import partial

                from gnnsched.gpu.fake_memory import write_usage

                fake.on_peak = partial(write_usage, usage_dir, gpu_uuid)
        from gnnsched.gpu.fake_faults import watch_from_env

        try:
            fault_watch = watch_from_env(os.environ)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        if fault_watch is not None and device != "cpu":
            raise UserError("GNNSCHED_FAKE_GPU_FAULTS: a fake GPU runs the job on the CPU; not with --device cuda")
        from gnnsched.worker import run_attempt

        if threads is not None:
            import torch

            torch.set_num_threads(threads)

        if device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise UserError("--device: cuda requested but no CUDA device is available to this process")
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    bar = Progress(
        TextColumn(f"{spec.mode} {spec.model.model_class}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not progress,
        transient=False,
    )
    with user_errors():
        checkpointer = _checkpointer()
    with bar, _checkpoint_ends():
        task = bar.add_task("steps", total=None)
        result = run_attempt(
            spec,
            device=device,
            epochs=epochs,
            seed=seed,
            progress=lambda n: _advance(bar, task, reporter, n),
            on_start=lambda total: _start(bar, task, reporter, total),
            limit_bytes=limit_bytes,
            fake_memory=fake,
            fault_watch=fault_watch,
            prepared=prepared,
            checkpointer=checkpointer,
        )
    if fallback is not None:
        result = result.model_copy(update={"prestart_fallback": fallback})
    line = result.line() + "\n"
    sys.stdout.write(line)
    result_file = os.environ.get(ENV_RESULT_FILE)
    if result_file:
        # In a pod this is /dev/termination-log: Kubernetes copies it into the container status on success too,
        # which is how the operator learns the observed peak without reading logs.
        try:
            with open(result_file, "w", encoding="utf-8") as handle:
                handle.write(line)
        except OSError as exc:
            typer.echo(f"warning: cannot write the result to {ENV_RESULT_FILE}={result_file}: {exc}", err=True)
    if result.outcome != "succeeded":
        detail = (result.message or "").splitlines()[0] if result.message else ""
        typer.echo(f"gnnsched worker: {result.outcome}: {detail}", err=True)
        raise typer.Exit(EXIT_ATTEMPT_FAILED)


@contextlib.contextmanager
def _checkpoint_ends() -> Iterator[None]:
    """A drain (SIGTERM) after the checkpoint was saved ends the worker with 143, the exit status of a process that
    SIGTERM ended, and one line saying where it stopped; the next attempt resumes there. A checkpoint file it cannot
    read is bad input, one line naming the file. (The portable runner's ``main`` ends the same ways.)"""
    from gnnsched.portable.checkpoint import EXIT_DRAINED, CheckpointError, Drained

    try:
        yield
    except CheckpointError as exc:
        fail(str(exc))
    except Drained as exc:
        typer.echo(f"gnnsched worker: {exc}", err=True)
        raise typer.Exit(EXIT_DRAINED) from None


def _checkpointer() -> Any:
    """``spec.checkpoint``'s contract from the pod's environment (``gnnsched.portable.checkpoint``), with SIGTERM
    turned into a save at the end of the current step; None when the job does not checkpoint."""
    from gnnsched.portable.checkpoint import Checkpointer

    try:
        checkpointer = Checkpointer.from_env()
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    if checkpointer is not None:
        checkpointer.install_sigterm()
    return checkpointer


def _advance(bar: Any, task: Any, reporter: StepReporter | None, n: int) -> None:
    bar.advance(task, n)
    if reporter is not None:
        reporter.advance(n)


def _start(bar: Any, task: Any, reporter: StepReporter | None, total: int) -> None:
    bar.update(task, total=total)
    if reporter is not None:
        reporter.start(total)


def _prestarted(gate_fd: int, spec: GNNJobSpec, seed: int, threads: int | None, device: str,
                began: float) -> Prepared | None:
    """Start-up behind the wait: imports, graph and model on the CPU now, the device only once admitted; returns the
    prepared job, with the admitted environment in force.

    Fail-safe: where this process cannot use its admitted GPU, it still keeps its place at the gate, takes its
    admission, then re-executes as a plain admitted worker (``gnnsched.gate_handoff.reexec_admitted``: same pid, so
    the keeper keeps the reservation; a fresh process, so a fresh CUDA driver). That happens when the start-up tried to
    initialise CUDA before admission (stopped by the guard, whatever library asked), when CUDA was initialised anyway,
    and, for ``--device cuda``, when the runtime sees no device although the admission named one (the driver latched
    "no device" through a path the guard does not cover). The cost is the start-up paid twice, only there; the job is
    not lost for it. Exits with the gate's status when the gate did not admit it."""
    # The guard goes in before anything imports PyG: its import asks torch.__config__.show(), which initialised the
    # CUDA driver with no device visible on a real GPU (gnnsched.gpu.cuda_guard).
    from gnnsched.gate_handoff import NotAdmitted, apply_admission, cuda_initialised, read_handoff, reexec_admitted
    from gnnsched.gpu.cuda_guard import CudaInitBlocked, PreAdmissionGuard, runtime_device_count

    guard = PreAdmissionGuard()
    prepared = None
    reason = None
    try:
        guard.install()
        from gnnsched.worker import prepare_job

        if threads is not None:  # the start-up runs on the pod's CPUs too
            import torch

            torch.set_num_threads(threads)
        prepared = prepare_job(spec, seed)
    except CudaInitBlocked as exc:
        reason = f"start-up tried to initialise CUDA before admission: {exc}"
        typer.echo(f"gnnsched worker: {exc}", err=True)
    ready = time.perf_counter()
    if reason is None:
        typer.echo(f"gnnsched worker: ready in {ready - began:.2f} s (imports, graph and model on the CPU; "
                   "no device touched); waiting for the gate", err=True)
    else:
        typer.echo(f"gnnsched worker: start-up stopped after {ready - began:.2f} s; keeping the place at the gate, "
                   "will re-execute once admitted; waiting for the gate", err=True)
    try:
        handoff = read_handoff(gate_fd)
        if reason is None and cuda_initialised():
            reason = "CUDA was initialised before admission (not through a call the guard covers)"
        apply_admission(handoff, reexec=reason is not None)
    except NotAdmitted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from None
    guard.remove()
    for attempt in guard.attempts:  # stopped before the driver (a library caught the error, or a count query)
        typer.echo(f"gnnsched worker: before admission, blocked: {attempt}", err=True)
    typer.echo(f"gnnsched worker: admitted after {time.perf_counter() - ready:.2f} s at the gate", err=True)
    visible = handoff.env.get("CUDA_VISIBLE_DEVICES", "")
    if reason is None and device == "cuda" and visible:
        import torch

        count = runtime_device_count(torch)
        if count == 0:
            reason = (f"admitted to CUDA_VISIBLE_DEVICES={visible} but the CUDA runtime sees no device (the driver "
                      "latched 'no device' before admission)")
    if reason is None:
        return prepared
    typer.echo(f"gnnsched worker: prestart fallback: {reason}; re-executing as a plain admitted worker", err=True)
    try:
        reexec_admitted(reason)
    except NotAdmitted as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(exc.exit_code) from None
