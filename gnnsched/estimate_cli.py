"""``gnnsched estimate JOB.yaml``: the job's predicted peak memory (PMC) and what the gate must reserve.

Kept free of torch at import time: ``gnnsched --help`` imports this module; torch, PyG and the estimator load only
when the command runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

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
        None, "--gpu-model",
        help="GPU model for --device cuda: a catalogue name, alias or the name NVML reports (e.g. 'NVIDIA H200'; "
        "see gnnsched.gpu.catalogue); default A100-80GB. An unknown name is refused: no other model's constants.",
    ),
    calibration: Path = typer.Option(
        None, "--calibration",
        help="Calibration table (JSON/YAML, or the calibration object as kubectl prints it): use the job's class's "
        "calibrated safety factor instead of the static one (--device cuda only).",
    ),
) -> None:
    """Estimate a job's peak memory by tracing its model on fake tensors (no data, any graph size)."""
    calibrated = None
    with user_errors():
        from gnnsched.gpu.catalogue import DEFAULT_GPU_MODEL, get_gpu_model
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
        model = get_gpu_model(gpu_model or DEFAULT_GPU_MODEL)
        if calibration is not None and device != "cuda":
            raise UserError("--calibration: applies only with --device cuda (the ratios are per GPU model)")
        table = _load_calibration(calibration) if calibration is not None else None
        spec = load_job(job).spec
        factor = None
        if table is not None:
            calibrated = _calibration_factor(table, spec, model.name)
            factor = calibrated["factor"]
        from gnnsched.estimator import UntraceableModel, estimate
        from gnnsched.models import pyg_backends

        try:
            result = estimate(spec, device=device, gpu_model=model, safety_factor=factor)  # type: ignore[arg-type]
        except UntraceableModel as exc:
            raise UserError(f"spec.model: {exc}; give spec.resources.gpuMemory (the cluster then runs it at that "
                            "reservation and records what it really used)") from None
    verified = model.overheads_verified
    constants = _constants(model) if device == "cuda" else None
    extensions = [name for name, present in pyg_backends().items() if present]
    if extensions:
        typer.echo(
            f"warning: {', '.join(extensions)} installed; PyG may use them instead of its pure-torch paths, "
            "which the estimator's accuracy figures were measured on",
            err=True,
        )
    if json_output:
        doc = result.as_dict()
        doc["calibration"] = calibrated
        doc["gpu_model"] = model.name if device == "cuda" else None
        doc["constants_provenance"] = constants
        sys.stdout.write(json.dumps(doc, sort_keys=False) + "\n")
        return
    typer.echo(f"pmc:              {_human(result.pmc_bytes)} ({result.pmc_bytes} bytes)")
    for name, value in result.breakdown.items():
        typer.echo(f"  {name + ':':17} {_human(value)}")
    if result.cuda_reserved_bytes is not None:
        # The allocator model was measured on an H100 and an H200 (docs/gpu-measurements.md); which of this GPU
        # model's constants were measured is said per constant below (GPUModel.provenance).
        how = ("caching-allocator model; every constant measured on this GPU model" if verified
               else "caching-allocator model; see below for which constants were measured")
        typer.echo(f"cuda reserved:    {_human(result.cuda_reserved_bytes)} ({result.cuda_reserved_bytes} bytes; "
                   f"{how})")
    typer.echo(f"device overhead:  {_human(result.device_overhead_bytes)} ({device})")
    if constants is not None:
        typer.echo(f"gpu model:        {model.name} ({model.architecture}, compute capability "
                   f"{'.'.join(map(str, model.compute_capability))})")
        for name, row in constants.items():
            typer.echo(f"  {name + ':':17} {_human(row['bytes'])} ({row['status']}: {row['source']})")
        unmeasured = model.unmeasured()
        if unmeasured:
            typer.echo(f"  not measured on this model: {', '.join(unmeasured)} (taken from its architecture or "
                       "assumed; a node's own measurement, published in its GPUNode, replaces them in the cluster's "
                       "plans)")
    if calibrated is None:
        typer.echo(f"safety factor:    {result.safety_factor}")
    else:
        source = {"class": "calibrated", "pool": f"calibrated from its pool {calibrated['pool']}, "
                  f"{calibrated['pool_samples']} samples",
                  "static": "static: too few samples"}[calibrated["source"]]
        typer.echo(f"safety factor:    {result.safety_factor} ({calibrated['class']}, {calibrated['samples']} "
                   f"samples, {source})")
    typer.echo(f"admit:            {_human(result.admit_bytes)} ({result.admit_bytes} bytes)")
    typer.echo(f"estimated in:     {result.seconds * 1000:.1f} ms")


def _constants(model: Any) -> dict[str, dict[str, Any]]:
    """Per device constant of ``model``: its bytes, whether it was ``measured`` on this model, taken from its
    ``architecture`` (measured on another model of it) or ``assumed``, and where from (``GPUModel.provenance``).
    Why print it: an estimate on assumed constants can be off by tens of percent (the H200 on the A100's were 15-72 %
    low), and the user should see which figures stand on a measurement."""
    from gnnsched.gpu.catalogue import CONSTANTS

    values = {"context": model.context_bytes, "cublas_workspace": model.cublas_workspace_bytes,
              "cublaslt_workspace": model.cublaslt_workspace_bytes}
    out: dict[str, dict[str, Any]] = {}
    for name in CONSTANTS:
        text = str(model.provenance.get(name) or "assumed: no provenance recorded")
        status, _, source = text.partition(":")
        out[name] = {"bytes": values[name], "status": status.strip(), "source": source.strip()}
    return out


def _load_calibration(path: Path) -> Any:
    """The table from ``--calibration``; an unreadable or invalid file is a one-line ``--calibration`` error."""
    from gnnsched.closed_loop import load_calibration_file
    from gnnsched.errors import FieldError

    try:
        return load_calibration_file(path)
    except FieldError as exc:
        raise UserError(str(exc)) from None


def _calibration_factor(table: Any, spec: Any, gpu_model: str) -> dict[str, Any]:
    """The job's calibration class (GPU model, arch, mode, built-in or custom container) and the factor the table
    gives it: the calibrated high quantile once the class (or else its pool) has enough samples, else the static
    factor; the resize of a memory-exceeded lower bound where the bounds leave the quantile unknown."""
    from gnnsched.closed_loop import CalibrationClass

    cls = CalibrationClass(
        gpu_model=gpu_model, arch=spec.model.model_class, mode=spec.mode,
        container="custom" if (spec.image or spec.command) else "builtin",
    )
    got = table.factor(cls)
    return {"class": cls.key(), "factor": got.factor, "samples": got.samples, "calibrated": got.calibrated,
            "source": got.source, "pool": cls.pool_key(), "pool_samples": got.pool_samples,
            "lower_bounds": got.lower_bounds, "censored": got.censored, "padded": got.padded}
