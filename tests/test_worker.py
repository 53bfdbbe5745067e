"""``gnnsched worker``: real runs, their observed peak, parallel inference and the command line."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.estimator import estimate
from gnnsched.spec import parse_spec
from gnnsched.worker import run_job

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _spec(arch="gat", mode="train", **extra):
    model = {"arch": arch, "layers": 2, "hidden": 16}
    if arch == "gat":
        model["heads"] = 2
    graph = extra.pop("graph", {"nodes": 600, "edges": 5_000, "features": 12, "classes": 4})
    return parse_spec({"mode": mode, "model": model, "graph": graph, **extra})


def _job(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text("apiVersion: gnnsched.io/v1alpha1\nkind: GNNJob\nmetadata: {name: j}\nspec:\n" + body)
    return path


def test_training_run_reports_steps_time_and_the_peak_the_estimator_predicts():
    spec = _spec(epochs=3)
    calls: list[Any] = []
    result = run_job(spec, progress=calls.append, on_start=lambda total: calls.append(("total", total)))
    assert result.steps == 3 and calls == [("total", 3), 1, 1, 1]
    assert result.seconds > 0
    predicted = estimate(spec).pmc_bytes
    # steady-state steps dominate the run; a few wrapped-scalar bytes aside the two agree
    assert result.observed_peak_bytes == pytest.approx(predicted, rel=0.005)


def test_epochs_override_and_inference_requests():
    assert run_job(_spec(epochs=50), epochs=2).steps == 2
    infer = run_job(_spec(mode="infer", requests=4))
    assert infer.steps == 4
    assert infer.observed_peak_bytes == pytest.approx(estimate(_spec(mode="infer", requests=4)).pmc_bytes, rel=0.005)


def test_parallel_inference_threads_share_one_model_and_split_the_requests(monkeypatch):
    import gnnsched.worker as worker

    seen_models: list[int] = []
    seen_threads: set[str] = set()
    real_run_step = worker.run_step

    def spy(model, graph, mode):
        seen_models.append(id(model))
        seen_threads.add(threading.current_thread().name)
        return real_run_step(model, graph, mode)

    monkeypatch.setattr(worker, "run_step", spy)
    spec = _spec("sage", mode="infer", requests=9, parallelism=3,
                 graph={"nodes": 3_000, "edges": 30_000, "features": 32, "classes": 4})
    result = run_job(spec)
    assert result.steps == 9 and len(seen_models) == 9
    assert len(set(seen_models)) == 1  # one copy of the weights
    assert seen_threads == {f"gnnsched-infer-{i}" for i in range(3)}
    single = estimate(_spec("sage", mode="infer", graph={"nodes": 3_000, "edges": 30_000, "features": 32,
                                                           "classes": 4})).pmc_bytes
    assert single <= result.observed_peak_bytes <= estimate(spec).pmc_bytes


def test_minibatch_training_runs_every_batch_of_every_epoch():
    spec = _spec("sage", epochs=2, batching={"mode": "minibatch", "batchSize": 128, "fanouts": [5, 5]})
    result = run_job(spec)
    assert result.steps == 2 * -(-600 // 128)
    assert 0 < result.observed_peak_bytes <= estimate(spec).pmc_bytes


def test_cli_prints_one_json_line(tmp_path):
    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn, layers: 2, hidden: 8}\n"
                         "  graph: {nodes: 300, edges: 2000, features: 8, classes: 3}\n  epochs: 30\n")
    result = runner.invoke(app, ["worker", str(job), "--epochs", "2", "--no-progress"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    data = json.loads(lines[-1])
    assert list(data) == ["observed_peak_bytes", "seconds", "steps"] and data["steps"] == 2
    assert data["observed_peak_bytes"] > 300 * 8 * 4


def test_cli_also_writes_the_result_where_the_pod_asks(tmp_path, monkeypatch):
    """The operator points GNNSCHED_RESULT_FILE at /dev/termination-log, so the result reaches the pod status."""
    from gnnsched.contract import ENV_RESULT_FILE

    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn, layers: 2, hidden: 8}\n"
                         "  graph: {nodes: 300, edges: 2000, features: 8, classes: 3}\n  epochs: 1\n")
    result_file = tmp_path / "termination-log"
    monkeypatch.setenv(ENV_RESULT_FILE, str(result_file))
    result = runner.invoke(app, ["worker", str(job), "--no-progress"])
    assert result.exit_code == 0, result.output
    assert json.loads(result_file.read_text()) == json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("args", "body", "field"),
    [
        (["--epochs", "3"], "  mode: infer\n  model: {arch: gcn}\n  graph: {dataset: cora}\n", "--epochs"),
        (["--epochs", "0"], "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n", "--epochs"),
        (["--device", "tpu"], "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n", "--device"),
        ([], "  mode: train\n  model: {arch: gcn, hidden: 0}\n  graph: {dataset: cora}\n", "spec.model.hidden"),
    ],
)
def test_cli_bad_input_exits_2_naming_the_field(tmp_path, args, body, field):
    result = runner.invoke(app, ["worker", str(_job(tmp_path, body)), *args])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0], result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_cli_cuda_without_a_gpu_exits_2(tmp_path):
    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n")
    result = runner.invoke(app, ["worker", str(job), "--device", "cuda"])
    assert result.exit_code == 2 and "--device" in result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_run_reports_max_memory_allocated_near_the_estimate():
    spec = _spec(epochs=3)
    result = run_job(spec, device="cuda")
    est = estimate(spec, device="cuda")
    assert result.observed_peak_bytes <= est.pmc_bytes * est.safety_factor


def test_cpu_profiling_stops_after_the_first_steps_and_keeps_the_peak(monkeypatch):
    import gnnsched.worker as worker

    monkeypatch.setattr(worker, "PROFILED_STEPS", 2)
    spec = _spec("gcn", epochs=6)
    result = run_job(spec)
    assert result.steps == 6
    assert result.observed_peak_bytes == pytest.approx(estimate(spec).pmc_bytes, rel=0.005)
