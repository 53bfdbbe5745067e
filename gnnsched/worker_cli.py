"""``gnnsched worker JOB.yaml``: run a GNNJob for real (what a job's pod runs) and report its observed peak.

Torch-free at import; the worker module loads when the command runs. Progress goes to stderr, the result is one
JSON line on stdout: ``{"observed_peak_bytes": ..., "seconds": ..., "steps": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from gnnsched.cliutil import UserError, user_errors
from gnnsched.contract import ENV_RESULT_FILE


def worker_command(
    job: Path = typer.Argument(..., help="GNNJob manifest (YAML or JSON)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    epochs: int = typer.Option(None, "--epochs", help="Override spec.epochs (training only), e.g. for a quick run."),
    seed: int = typer.Option(0, "--seed", help="Seed for the synthetic graph, the weights and sampling."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show a progress bar on stderr."),
) -> None:
    """Run a GNN job (train epochs or serve inference requests) and print its observed peak memory as JSON."""
    with user_errors():
        from gnnsched.spec import load_job

        if device not in ("cpu", "cuda"):
            raise UserError(f"--device: must be cpu or cuda, got {device!r}")
        spec = load_job(job).spec
        if epochs is not None:
            if spec.mode != "train":
                raise UserError("--epochs: applies only to training jobs (spec.mode is infer)")
            if epochs < 1:
                raise UserError(f"--epochs: must be at least 1, got {epochs}")
        from gnnsched.worker import run_job

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
        TextColumn(f"{spec.mode} {spec.model.arch}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not progress,
        transient=False,
    )
    with bar:
        task = bar.add_task("steps", total=None)
        result = run_job(
            spec,
            device=device,
            epochs=epochs,
            seed=seed,
            progress=lambda n: bar.advance(task, n),
            on_start=lambda total: bar.update(task, total=total),
        )
    line = json.dumps(result.as_dict()) + "\n"
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
