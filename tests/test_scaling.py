"""Adaptive scaling: property tests (floor, never above the request, deterministic, θ honoured) and worked cases."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gnnsched.datasets import dataset_names
from gnnsched.host_footprint import host_footprint
from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.scaling import CPU_FLOOR_CORES, Resources, requested_from_spec, scale
from gnnsched.spec import SpecError, load_job, parse_spec

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
DEFAULT = GNNRuntimePredictor.load_default()
GiB = 2**30


def _trained() -> GNNRuntimePredictor:
    """A predictor with a real XGBoost residual, fit on a history whose runtimes also depend on memory headroom,
    so the property test exercises scaling against trees and not only the analytic prior."""
    from datetime import datetime, timezone

    from gnnsched.predictor.history import HistoryRecord
    from gnnsched.runtime_prior import solo_runtime_seconds

    records = []
    for i in range(60):
        arch = ("gcn", "sage", "gin")[i % 3]
        spec_dict = {"mode": "train", "model": {"arch": arch, "hidden": 32 * (1 + i % 4)},
                     "graph": {"dataset": ("cora", "pubmed", "ogbn-arxiv", "proteins")[i % 4]}, "epochs": 10 + i}
        cpu, memory = 1.0 + 2 * ((i // 16) % 4), (2 + i % 16) * GiB  # independent of each other
        observed = solo_runtime_seconds(parse_spec(spec_dict), "A100-80GB", cpu) * (1.0 + 4.0 / (memory / GiB))
        records.append(HistoryRecord(spec=spec_dict, requested={"cpu": 8, "memory": "32Gi"},
                                     scaled={"cpu": cpu, "memory": memory}, gpu_model="A100-80GB",
                                     observed_runtime_seconds=observed, finished_at=datetime.now(timezone.utc)))
    return GNNRuntimePredictor.fit_history(records)


TRAINED = _trained()


@st.composite
def specs(draw):
    arch = draw(st.sampled_from(["gcn", "sage", "gin", "gat"]))
    mode = draw(st.sampled_from(["train", "infer"]))
    model = {"arch": arch, "layers": draw(st.integers(1, 4)), "hidden": draw(st.sampled_from([16, 64, 256]))}
    if arch == "gat":
        model["heads"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        graph = {"dataset": draw(st.sampled_from(dataset_names()))}
    else:
        nodes = draw(st.integers(10, 5_000_000))
        graph = {"nodes": nodes, "edges": draw(st.integers(0, min(nodes * 50, nodes * nodes))),
                 "features": draw(st.integers(1, 2000)), "classes": draw(st.integers(2, 100))}
    spec = {"mode": mode, "model": model, "graph": graph,
            "scaling": {"enabled": True, "theta": draw(st.floats(0.001, 0.5))}}
    if mode == "train":
        spec["epochs"] = draw(st.integers(1, 500))
    else:
        spec["requests"] = draw(st.integers(1, 10_000))
        spec["parallelism"] = draw(st.integers(1, 8))
    if arch in ("sage", "gat") and draw(st.booleans()):
        spec["batching"] = {"mode": "minibatch", "batchSize": draw(st.integers(1, 8192))}
    return parse_spec(spec)


requests = st.builds(
    Resources,
    cpu=st.floats(0.1, 128.0),
    memory=st.integers(64 * 2**20, 2 * 2**40),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spec=specs(),
    requested=requests,
    alpha0=st.floats(0.05, 0.95),
    gpu=st.sampled_from(["A100-80GB", "T4", "V100M16"]),
    predictor=st.sampled_from([DEFAULT, TRAINED]),
)
def test_never_below_floor_never_above_request_deterministic(spec, requested, alpha0, gpu, predictor) -> None:
    result = scale(spec, requested, predictor=predictor, gpu_model=gpu, alpha0=alpha0)
    scaled = result.scaled
    # Never more than requested.
    assert scaled.cpu <= requested.cpu and scaled.memory <= requested.memory
    # Never below the floor, unless the request itself was below it (then the request stands).
    memory_floor = host_footprint(spec, scaled.cpu).total_bytes
    assert scaled.cpu >= min(CPU_FLOOR_CORES, requested.cpu)
    assert scaled.memory >= min(memory_floor, requested.memory)
    # Step cap: one scaling never removes more than 1 - alpha0 of a request (up to millicore/MiB rounding).
    assert scaled.cpu >= min(requested.cpu, alpha0 * requested.cpu - 1e-9)
    assert scaled.memory >= min(requested.memory, alpha0 * requested.memory - 1)
    # θ honoured: the accepted shrink changes the predicted runtime by less than theta.
    before, after = result.predicted_runtime_before, result.predicted_runtime_after
    assert abs(after - before) < spec.scaling.theta * before or after == before
    # Deterministic: same inputs, same decision.
    assert scale(spec, requested, predictor=predictor, gpu_model=gpu, alpha0=alpha0) == result


def test_full_batch_job_shrinks_to_half_at_most() -> None:
    spec = load_job(EXAMPLES / "gcn-train-cora.yaml").spec
    result = scale(spec, predictor=DEFAULT)
    assert result.requested == Resources(cpu=4, memory=8 * GiB)
    assert result.scaled == Resources(cpu=2, memory=4 * GiB)  # alpha0 = 0.5: the step cap
    assert result.alpha == 0.5 and result.predicted_runtime_after == result.predicted_runtime_before


def test_host_bound_sampler_keeps_its_cores() -> None:
    spec = load_job(EXAMPLES / "sage-minibatch.yaml").spec
    result = scale(spec, predictor=DEFAULT)
    assert "cpu" not in result.scaled_resources  # permutation importance marks cores as important here
    assert result.scaled.cpu == 8 and result.scaled.memory < result.requested.memory
    assert result.scaled.memory >= host_footprint(spec, 8).total_bytes


def test_theta_stops_a_shrink_that_costs_runtime() -> None:
    """With importance ignored (threshold above any value), shrinking the sampler's cores would slow it; θ says no."""
    spec = load_job(EXAMPLES / "sage-minibatch.yaml").spec
    result = scale(spec, predictor=DEFAULT, importance_threshold=10.0, theta=0.05)
    assert result.scaled.cpu == 8  # every α < 1 takes away >= 1 core of a host-bound job: > 5 % slower
    loose = scale(spec, predictor=DEFAULT, importance_threshold=10.0, theta=0.5)
    assert loose.scaled.cpu < 8 and loose.predicted_runtime_after < 1.5 * loose.predicted_runtime_before


def test_trained_residual_that_needs_memory_keeps_it() -> None:
    """History says runtime grows as memory shrinks (1 + 4/GiB): the residual's importance for memory is high and
    above that of cores (which the history's runtimes do not depend on), so scaling must not take memory away."""
    importance = TRAINED.class_importance(load_job(EXAMPLES / "gcn-train-cora.yaml").spec)
    assert importance["memory"] > 0.05 and importance["memory"] > 2 * importance["cpu"]
    result = scale(load_job(EXAMPLES / "gcn-train-cora.yaml").spec, predictor=TRAINED)
    assert result.scaled.memory == result.requested.memory


def test_request_below_floor_is_returned_unchanged() -> None:
    spec = parse_spec({"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "ogbn-products"},
                       "resources": {"cpu": "500m", "memory": "1Gi"}})
    result = scale(spec, predictor=DEFAULT)
    assert result.scaled == result.requested == Resources(cpu=0.5, memory=GiB)
    assert result.floor.memory > GiB


def test_measured_peak_raises_the_floor() -> None:
    spec = load_job(EXAMPLES / "gcn-train-cora.yaml").spec
    result = scale(spec, predictor=DEFAULT, measured_host_bytes=7 * GiB)
    assert result.scaled.memory == 7 * GiB and result.floor.memory == 7 * GiB


def test_disabled_scaling_and_missing_request() -> None:
    spec = load_job(EXAMPLES / "gin-train-custom.yaml").spec
    result = scale(spec, predictor=DEFAULT)
    assert result.scaled == result.requested and result.alpha is None and "disabled" in result.reason
    no_request = load_job(EXAMPLES / "gat-infer-parallel.yaml").spec
    with pytest.raises(SpecError, match="spec.resources.cpu"):
        requested_from_spec(no_request)
    with pytest.raises(ValueError, match="alpha0"):
        scale(spec, Resources(cpu=1, memory=GiB), predictor=DEFAULT, alpha0=1.0)


def test_scheduling_round_fits_more_jobs_with_scaling() -> None:
    """Algorithm 2: four Cora GCN jobs asking 4 cores / 8 GiB each on two 8-core / 16 GiB servers. As requested,
    two wait; scaled by Algorithm 1 (full-batch GCN needs one core), all four run."""
    from gnnsched.scaling import ServerState, schedule_round

    spec = load_job(EXAMPLES / "gcn-train-cora.yaml").spec
    jobs = [(f"j{i}", spec, Resources(cpu=4, memory=8 * GiB)) for i in range(4)] + [
        ("big", spec, Resources(cpu=64, memory=8 * GiB))]
    servers = [
        ServerState(name="a", cpu_free=8, memory_free=16 * GiB),
        ServerState(name="b", cpu_free=8, memory_free=16 * GiB),
    ]
    plain = schedule_round(jobs, servers, adaptive=False)
    assert plain.placements == {"j0": "a", "j1": "a", "j2": "b", "j3": "b"} and plain.pending == ("big",)
    adaptive = schedule_round(jobs, servers, predictor=DEFAULT)
    assert set(adaptive.placements) == {"j0", "j1", "j2", "j3"}
    assert all(adaptive.given[j] == Resources(cpu=2, memory=4 * GiB) for j in adaptive.placements)
    assert adaptive.pending == ("big",)  # 32 cores after one halving still fit nowhere: it waits
    # Best fit: the first job fills server a before b is touched.
    assert adaptive.placements["j0"] == adaptive.placements["j1"] == "a"
    assert servers[0].cpu_free == 8  # inputs untouched


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=specs(), reqs=st.lists(requests, min_size=1, max_size=8),
       caps=st.lists(st.tuples(st.floats(0, 64), st.integers(0, 512 * GiB)), min_size=1, max_size=4),
       adaptive=st.booleans())
def test_scheduling_round_never_overcommits(spec, reqs, caps, adaptive) -> None:
    from gnnsched.scaling import ServerState, schedule_round

    servers = [ServerState(name=f"s{i}", cpu_free=c, memory_free=m) for i, (c, m) in enumerate(caps)]
    jobs = [(f"j{i}", spec, r) for i, r in enumerate(reqs)]
    result = schedule_round(jobs, servers, predictor=DEFAULT, adaptive=adaptive)
    assert set(result.placements) | set(result.pending) == {j for j, _, _ in jobs}
    for server in servers:
        placed = [result.given[j] for j, s in result.placements.items() if s == server.name]
        assert sum(r.cpu for r in placed) <= server.cpu_free + 1e-6
        assert sum(r.memory for r in placed) <= server.memory_free
    for name, _, requested in jobs:
        if name in result.given:
            assert result.given[name].cpu <= requested.cpu and result.given[name].memory <= requested.memory
    assert schedule_round(jobs, servers, predictor=DEFAULT, adaptive=adaptive) == result
