"""``gnnsched estimate --gpu-model``: the catalogue name or NVML's; an unknown name refused in one line naming it and
the known ones (exit 2); the output says which device constants were measured and which assumed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.gpu.catalogue import get_gpu_model

pytest.importorskip("gnnsched.estimator")
ROOT = Path(__file__).resolve().parents[1]
JOB = str(ROOT / "examples" / "gcn-train-cora.yaml")
runner = CliRunner()


def _json(*args: str) -> dict:
    result = runner.invoke(app, ["estimate", JOB, "--json", "--device", "cuda", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_nvml_name_is_the_catalogue_model() -> None:
    by_nvml, by_name = _json("--gpu-model", "NVIDIA H200"), _json("--gpu-model", "H200")
    assert by_nvml["gpu_model"] == by_name["gpu_model"] == "H200"
    assert by_nvml["admit_bytes"] == by_name["admit_bytes"]
    provenance = by_nvml["constants_provenance"]
    assert list(provenance) == ["context", "cublas_workspace", "cublaslt_workspace"]
    # the H200's workspaces were measured on it; its context is Hopper's, measured on the H100
    assert provenance["cublas_workspace"]["status"] == "measured"
    assert provenance["context"]["status"] == "architecture" and "H100" in provenance["context"]["source"]
    assert provenance["context"]["bytes"] == get_gpu_model("H200").context_bytes


def test_the_human_output_names_the_unmeasured_constants() -> None:
    result = runner.invoke(app, ["estimate", JOB, "--device", "cuda", "--gpu-model", "NVIDIA L40S"])
    assert result.exit_code == 0, result.output
    assert "gpu model:        L40S (Ada" in result.stdout
    assert "assumed: Ada's default, never measured" in result.stdout
    assert "not measured on this model: context, cublas_workspace, cublaslt_workspace" in result.stdout


def test_an_unknown_name_is_refused_in_one_line_naming_it_and_the_known_ones() -> None:
    result = runner.invoke(app, ["estimate", JOB, "--device", "cuda", "--gpu-model", "NVIDIA X9000"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.output
    assert "--gpu-model" in lines[0] and "'NVIDIA X9000'" in lines[0]
    assert "H200" in lines[0] and "A100-80GB" in lines[0]
