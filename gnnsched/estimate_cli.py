"""``gnnsched estimate JOB.yaml``: the job's predicted peak memory (PMC) and what the gate must reserve.

Kept free of torch at import time: ``gnnsched --help`` imports this module; torch, PyG and the estimator load only
when the command runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from gnnsched.cliutil import UserError, user_errors


def _human(nbytes: int) -> str:
    from gnnsched.quantity import format_bytes

    return format_bytes(nbytes)


def estimate_command(
    job: Path = typer.Argument(..., help="GNNJob manifest (YAML or JSON)."),
    json_output: bool = typer.Option(False, "--json", help="Print one JSON object (stable keys) instead of a table."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda (cuda adds the GPU model's device overheads)."),
    gpu_model: str = typer.Option(
        None, "--gpu-model", help="GPU model for --device cuda (see gnnsched.gpus); default A100-80GB."
    ),
) -> None:
    """Estimate a job's peak memory by tracing its model on fake tensors (no data, any graph size)."""
    with user_errors():
        from gnnsched.gpus import get_gpu_model
        from gnnsched.spec import load_job

        if device not in ("cpu", "cuda"):
            raise UserError(f"--device: must be cpu or cuda, got {device!r}")
        if gpu_model is not None:
            if device != "cuda":
                raise UserError("--gpu-model: applies only with --device cuda")
            try:
                get_gpu_model(gpu_model)
            except KeyError as exc:
                raise UserError(f"--gpu-model: {exc.args[0]}") from None
        spec = load_job(job).spec
        from gnnsched.estimator import estimate
        from gnnsched.models import pyg_backends

        result = estimate(spec, device=device, gpu_model=gpu_model)  # type: ignore[arg-type]
    extensions = [name for name, present in pyg_backends().items() if present]
    if extensions:
        typer.echo(
            f"warning: {', '.join(extensions)} installed; PyG may use them instead of its pure-torch paths, "
            "which the estimator's accuracy figures were measured on",
            err=True,
        )
    if json_output:
        sys.stdout.write(json.dumps(result.as_dict(), sort_keys=False) + "\n")
        return
    typer.echo(f"pmc:              {_human(result.pmc_bytes)} ({result.pmc_bytes} bytes)")
    for name, value in result.breakdown.items():
        typer.echo(f"  {name + ':':17} {_human(value)}")
    typer.echo(f"device overhead:  {_human(result.device_overhead_bytes)} ({device})")
    typer.echo(f"safety factor:    {result.safety_factor}")
    typer.echo(f"admit:            {_human(result.admit_bytes)} ({result.admit_bytes} bytes)")
    typer.echo(f"estimated in:     {result.seconds * 1000:.1f} ms")
