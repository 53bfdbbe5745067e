"""``gnnsched worker``: real runs, their observed peak, parallel inference and the command line."""

from __future__ import annotations

import json
import math
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.closed_loop import failed_request_bytes, is_mps_victim_text
from gnnsched.estimator import estimate
from gnnsched.spec import parse_spec
from gnnsched.worker import run_attempt, run_job

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
    from gnnsched import worker

    seen_models: list[int] = []
    seen_threads: set[str] = set()
    real_run_step = worker.run_step

    def spy(model, graph, mode):
        seen_models.append(id(model))
        seen_threads.add(threading.current_thread().name)
        return real_run_step(model, graph, mode)

    from gnnsched.portable import step

    monkeypatch.setattr(worker, "run_step", spy)
    monkeypatch.setattr(step, "run_step", spy)  # parallel inference runs the steps in portable.step.serve_parallel
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
    assert list(data) == ["outcome", "observed_peak_bytes", "seconds", "steps", "source"] and data["steps"] == 2
    assert data["outcome"] == "succeeded" and data["source"] == "worker"
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
def test_cuda_run_reports_reserved_plus_context_within_the_admit_bytes():
    spec = _spec(epochs=3)
    result = run_job(spec, device="cuda")
    est = estimate(spec, device="cuda", gpu_model=torch.cuda.get_device_name())  # the GPU in hand's constants
    assert torch.cuda.max_memory_reserved() < result.observed_peak_bytes <= est.admit_bytes


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")
def test_cuda_out_of_memory_is_a_memory_exceeded_outcome():
    """A real CUDA OOM (a per-process memory fraction stands in for the MPS limit) ends the attempt as
    memory-exceeded with what the process held and the request that failed."""
    spec = _spec(epochs=3, graph={"nodes": 200_000, "edges": 2_000_000, "features": 256, "classes": 8})
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(64 * 2**20 / total)
    try:
        result = run_attempt(spec, device="cuda", limit_bytes=64 * 2**20)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert result.outcome == "memory-exceeded" and result.requested_bytes and result.held_bytes
    assert result.limit_bytes == 64 * 2**20 and "CUDA out of memory" in (result.message or "")


# --- the closed loop's outcomes, on a fake GPU that enforces the MPS limit ---------------------------------------


def _fake_run(spec, limit: int | None, footprint: float = 1.0):
    from gnnsched.gpu.fake_memory import FakeGPUMemory

    memory = FakeGPUMemory(limit_bytes=limit, footprint=footprint)
    return run_attempt(spec, limit_bytes=limit, fake_memory=memory), memory


def test_fake_gpu_counts_what_the_profiler_counts():
    """Without a limit, the fake device's count of a run is the worker's measured peak (and so the estimate)."""
    spec = _spec(epochs=3)
    measured = run_job(spec).observed_peak_bytes
    result, memory = _fake_run(spec, None)
    assert result.outcome == "succeeded" and result.observed_peak_bytes == memory.peak
    assert memory.peak == pytest.approx(measured, rel=0.005)


def test_a_job_whose_real_footprint_is_1_3x_its_estimate_reports_memory_exceeded_with_the_right_bytes():
    spec = _spec(epochs=3)
    limit = estimate(spec).pmc_bytes  # the reservation the estimate gave it (byte-exact on the CPU)
    result, memory = _fake_run(spec, limit, footprint=1.3)
    assert result.outcome == "memory-exceeded" and result.limit_bytes == limit
    assert result.held_bytes is not None and result.requested_bytes is not None
    # It held at most its limit, the request that failed would have passed it, and what it needed is no more than
    # its real footprint: the operator's next reservation (needed x margin) is built on true bytes.
    assert result.held_bytes <= limit < result.held_bytes + result.requested_bytes
    assert result.needed_bytes() <= math.ceil(1.3 * limit) + result.requested_bytes
    assert result.observed_peak_bytes == memory.peak <= limit
    assert "CUDA out of memory. Tried to allocate" in (result.message or "")
    assert failed_request_bytes(result.message or "") == pytest.approx(result.requested_bytes, rel=0.01)
    # Retried at 1.5x (the default growth), the same job succeeds and reports its real footprint.
    bigger = math.ceil(1.5 * limit)
    retry, _ = _fake_run(spec, bigger, footprint=1.3)
    assert retry.outcome == "succeeded" and retry.observed_peak_bytes is not None
    assert retry.observed_peak_bytes == pytest.approx(1.3 * limit, rel=0.01)


def test_parallel_inference_threads_share_one_fake_device():
    spec = _spec(mode="infer", requests=8, parallelism=2)
    free, memory = _fake_run(spec, None)
    assert free.outcome == "succeeded"
    tight, _ = _fake_run(spec, memory.peak // 2)
    assert tight.outcome == "memory-exceeded"


def test_a_fatal_gpu_error_is_a_fault_outcome_and_other_errors_propagate(monkeypatch):
    from gnnsched import worker

    def mps_terminated(*args, **kwargs):
        raise RuntimeError("CUDA error: cudaErrorMpsClientTerminated: the MPS client has been terminated by the server")

    monkeypatch.setattr(worker, "run_step", mps_terminated)
    result = run_attempt(_spec(epochs=1), limit_bytes=2**30)
    assert result.outcome == "fault" and "cudaErrorMpsClientTerminated" in (result.message or "")
    assert is_mps_victim_text(result.message or "") and result.limit_bytes == 2**30

    def plain_bug(*args, **kwargs):
        raise RuntimeError("shape mismatch")

    monkeypatch.setattr(worker, "run_step", plain_bug)
    with pytest.raises(RuntimeError, match="shape mismatch"):
        run_attempt(_spec(epochs=1))


def test_cli_memory_exceeded_exits_1_after_writing_the_result_line(tmp_path, monkeypatch):
    from gnnsched.closed_loop import AttemptResult
    from gnnsched.contract import (
        ENV_FAKE_GPU_MEMORY,
        ENV_MPS_MEMORY_LIMIT,
        ENV_RESULT_FILE,
    )

    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn, layers: 2, hidden: 8}\n"
                         "  graph: {nodes: 3000, edges: 20000, features: 64, classes: 3}\n  epochs: 2\n")
    result_file = tmp_path / "termination-log"
    monkeypatch.setenv(ENV_RESULT_FILE, str(result_file))
    monkeypatch.setenv(ENV_MPS_MEMORY_LIMIT, "0=1M")
    monkeypatch.setenv(ENV_FAKE_GPU_MEMORY, "enforce")
    result = runner.invoke(app, ["worker", str(job), "--no-progress"])
    assert result.exit_code == 1, result.output
    attempt = AttemptResult.model_validate_json(result_file.read_text())
    assert attempt.outcome == "memory-exceeded" and attempt.limit_bytes == 2**20
    assert attempt.held_bytes is not None and attempt.held_bytes <= 2**20 < attempt.needed_bytes()
    assert json.loads(result.stdout.strip().splitlines()[-1]) == json.loads(result_file.read_text())
    assert "memory-exceeded: CUDA out of memory" in result.stderr


@pytest.mark.parametrize(
    ("env", "field"),
    [
        ({"GNNSCHED_FAKE_GPU_MEMORY": "always"}, "GNNSCHED_FAKE_GPU_MEMORY"),
        ({"GNNSCHED_FAKE_GPU_MEMORY": "enforce:0.5"}, "GNNSCHED_FAKE_GPU_MEMORY"),
        ({"GNNSCHED_FAKE_GPU_MEMORY": "enforce:x"}, "GNNSCHED_FAKE_GPU_MEMORY"),
        ({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=lots"}, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"),
    ],
)
def test_cli_bad_fake_gpu_or_limit_is_one_line_naming_it(tmp_path, monkeypatch, env, field):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n")
    result = runner.invoke(app, ["worker", str(job), "--no-progress"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and field in lines[0], result.stderr


def test_cpu_profiling_stops_after_the_first_steps_and_keeps_the_peak(monkeypatch):
    from gnnsched import worker

    monkeypatch.setattr(worker, "PROFILED_STEPS", 2)
    spec = _spec("gcn", epochs=6)
    result = run_job(spec)
    assert result.steps == 6
    assert result.observed_peak_bytes == pytest.approx(estimate(spec).pmc_bytes, rel=0.005)


@pytest.mark.parametrize("spec", [_spec(epochs=2), _spec("sage", mode="infer", requests=3),
                                  _spec("sage", epochs=1, batching={"mode": "minibatch", "batchSize": 128,
                                                                      "fanouts": [5, 5]})],
                         ids=["full-batch-train", "infer", "minibatch-train"])
def test_a_prepared_run_observes_what_a_plain_run_does(spec):
    """Start-up behind the wait: the graph and model built before admission are moved to the device after it, inside
    the run's meters, so the observed peak (the profiler's, and a fake GPU's count) is the plain run's. (Parallel
    inference is left out: its concurrent peak depends on how the threads interleave, run to run.)"""
    from gnnsched.gpu.fake_memory import FakeGPUMemory
    from gnnsched.worker import prepare_job

    plain = run_job(spec, seed=3)
    prepared = prepare_job(spec, seed=3)
    assert prepared.seconds > 0
    again = run_job(spec, seed=3, prepared=prepared)
    assert again.steps == plain.steps
    assert again.observed_peak_bytes == pytest.approx(plain.observed_peak_bytes, rel=0.001)
    with pytest.raises(RuntimeError, match="runs once"):
        prepared.take()
    fake_plain = run_job(spec, seed=3, fake_memory=FakeGPUMemory(limit_bytes=None))
    fake_prepared = run_job(spec, seed=3, fake_memory=FakeGPUMemory(limit_bytes=None),
                            prepared=prepare_job(spec, seed=3))
    assert fake_prepared.observed_peak_bytes == pytest.approx(fake_plain.observed_peak_bytes, rel=0.001)


def test_prepare_job_builds_what_run_job_builds_from_the_same_seed():
    """Same seeding order as ``run_job``: the prepared graph and weights are the ones a plain run would build."""
    from gnnsched.models import build_model, make_graph
    from gnnsched.worker import prepare_job

    spec = _spec("gcn", epochs=2)
    graph, model = prepare_job(spec, seed=5).take()
    torch.manual_seed(5)
    g = make_graph(spec, 5, None)
    m = build_model(spec, features=g.layout.features, classes=g.layout.classes)
    assert torch.equal(graph.x, g.x) and torch.equal(graph.edge_index, g.edge_index)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m.parameters(), strict=True))
    assert all(p.device.type == "cpu" for p in model.parameters())


@pytest.mark.parametrize(
    ("env", "available", "threads"),
    [
        ({}, 8, None),  # no request known: torch's default
        ({"GNNSCHED_CPU_REQUEST": "0"}, 8, None),  # the pod requests no CPU
        ({"GNNSCHED_CPU_REQUEST": "2"}, 64, 2),  # two CPUs asked on a 64-core node: two threads, not 64
        ({"GNNSCHED_CPU_REQUEST": "8"}, 2, 2),  # never more than the CPUs this process may run on
        ({"GNNSCHED_CPU_REQUEST": "2", "OMP_NUM_THREADS": "3"}, 8, None),  # an explicit choice wins
    ],
)
def test_worker_threads_follow_the_cpu_request(env, available, threads):
    from gnnsched.worker_cli import intra_op_threads

    assert intra_op_threads(env, available) == threads


@pytest.mark.parametrize("value", ["two", "-1", "1.5"])
def test_cli_bad_cpu_request_is_one_line_naming_it(tmp_path, monkeypatch, value):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("GNNSCHED_CPU_REQUEST", value)
    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n")
    result = runner.invoke(app, ["worker", str(job), "--no-progress"])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "GNNSCHED_CPU_REQUEST" in lines[0], result.stderr


def test_cli_sets_the_thread_pool_from_the_cpu_request(tmp_path, monkeypatch):
    from gnnsched import worker

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setenv("GNNSCHED_CPU_REQUEST", "2")
    expected = min(2, len(os.sched_getaffinity(0)))
    if expected == torch.get_num_threads():
        pytest.skip("one CPU only: the request cannot change the thread count here")
    seen: list[int] = []
    real = worker.run_attempt

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(worker, "run_attempt", spy)
    before = torch.get_num_threads()
    job = _job(tmp_path, "  mode: train\n  model: {arch: gcn}\n  graph: {dataset: cora}\n  epochs: 1\n")
    try:
        result = runner.invoke(app, ["worker", str(job), "--no-progress"])
    finally:
        torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    assert seen == [expected]


def test_full_batch_jobs_profile_three_steps_minibatch_jobs_twenty():
    from gnnsched.worker import PROFILED_FULL_BATCH_STEPS, PROFILED_STEPS, profiled_steps

    assert profiled_steps(_spec("gcn", epochs=50)) == PROFILED_FULL_BATCH_STEPS == 3
    minibatch = parse_spec({"mode": "train", "model": {"arch": "sage"}, "graph": {"dataset": "cora"},
                            "batching": {"mode": "minibatch", "batchSize": 64, "fanouts": [5, 5]}})
    assert profiled_steps(minibatch) == PROFILED_STEPS


def test_parallel_minibatch_inference_threads_share_one_sampler_safely():
    """Three threads sampling from one sampler at once (its id map is shared scratch) must not corrupt each other's
    batches: before the sampler was serialised this failed with an IndexError in message passing."""
    spec = parse_spec({"mode": "infer", "model": {"arch": "sage", "layers": 2, "hidden": 16},
                       "graph": {"nodes": 320, "edges": 2240, "features": 8, "classes": 6}, "requests": 60,
                       "parallelism": 3, "batching": {"mode": "minibatch", "batchSize": 64, "fanouts": [6, 2]}})
    result = run_attempt(spec)
    assert result.outcome == "succeeded" and result.steps == 60
