"""Which device constants a plan uses (operator/planning.py with gnnsched.gpu.measured): a node's measurement over
the catalogue, grouped by model *and* constants, estimates cached by the constants, and a GPU without constants
never planned with another model's (its jobs run alone)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from gnnsched.contract import GPUMeasurement
from gnnsched.gpu.catalogue import GiB, MiB, get_gpu_model
from gnnsched.gpu.measured import constants_key, device_model, measurement_fingerprint
from gnnsched.operator.handlers import _exclusive_message, _need
from gnnsched.operator.planning import ClusterGPU, Planner, gpus_from_gpunode
from gnnsched.spec import load_job

pytest.importorskip("gnnsched.estimator")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def spec():
    return load_job(ROOT / "examples" / "gcn-train-cora.yaml").spec


def measured(context_mib: int = 900, *, matches: bool = True) -> GPUMeasurement:
    return GPUMeasurement(source="fake", measured_at=datetime(2026, 12, 1, tzinfo=timezone.utc),
                          context_bytes=context_mib * MiB, cublas_workspace_bytes=32 * MiB,
                          cublaslt_workspace_bytes=MiB, allocator_matches_model=matches, compute_capability="9.0")


def h200(node: str, m: GPUMeasurement | None = None) -> ClusterGPU:
    return ClusterGPU(node=node, model="H200", capacity_bytes=140 * GiB, total_bytes=141 * GiB, measured=m)


def unknown(node: str, m: GPUMeasurement | None = None, capacity: int = 90 * GiB) -> ClusterGPU:
    return ClusterGPU(node=node, model="NVIDIA X9000", capacity_bytes=capacity, total_bytes=capacity + GiB,
                      catalogued=False, measured=m)


def test_a_nodes_measurement_changes_its_plan_and_each_measurement_gets_its_own_need(spec) -> None:
    planner = Planner()
    catalogue = planner.plan(spec, [h200("n1")])
    big = planner.plan(spec, [h200("n1", measured(900))])
    assert big.admit_bytes > catalogue.admit_bytes and big.admit_constants == measurement_fingerprint(measured(900))
    assert catalogue.admit_constants is None
    # two nodes of one model, one measured and one not: a need each, and the admit bytes fit either (the larger)
    both = planner.plan(spec, [h200("n1"), h200("n2", measured(900))])
    assert {(n.model, n.constants) for n in both.needs} == {("H200", None),
                                                           ("H200", measurement_fingerprint(measured(900)))}
    assert both.admit_bytes == big.admit_bytes and not both.exclusive
    assert _need(both, "H200", measurement_fingerprint(measured(900))) == max(n.bytes for n in both.needs)
    assert _need(both, "H200") == min(n.bytes for n in both.needs)
    # a measurement smaller than the catalogue's constants lowers the plan of that node
    small = planner.plan(spec, [h200("n1", measured(300))])
    assert small.admit_bytes < catalogue.admit_bytes


def test_the_estimate_cache_keys_on_the_constants_not_the_name(spec) -> None:
    planner = Planner()
    plain = get_gpu_model("H200")
    node_model, _ = device_model("H200", 141 * GiB, measured(900), "n1")
    other_node, _ = device_model("H200", 141 * GiB, measured(900), "n2")
    assert node_model is not None and other_node is not None and node_model.name == plain.name
    assert constants_key(node_model) != constants_key(plain)
    assert constants_key(node_model) == constants_key(other_node)  # provenance differs, the estimate does not
    a = planner._estimate(spec, plain)
    misses = planner.cache.misses
    b = planner._estimate(spec, node_model)
    assert planner.cache.misses == misses + 1 and b.admit_bytes != a.admit_bytes
    assert planner._estimate(spec, other_node).admit_bytes == b.admit_bytes
    assert planner.cache.misses == misses + 1  # the second node with the same values shares the entry


def test_an_uncatalogued_unmeasured_gpu_runs_the_job_alone_naming_model_and_node(spec) -> None:
    plan = Planner().plan(spec, [unknown("n9")])
    assert plan.exclusive and plan.exclusive_reason == "UnknownGPUModel"
    assert plan.admit_bytes == 90 * GiB and plan.exclusive_node == "n9" and plan.admit_gpu_model == "NVIDIA X9000"
    assert plan.needs == []  # nobody's constants: no need is claimed for it
    message = _exclusive_message(plan)
    assert "'NVIDIA X9000' on node n9" in message and "measured constants" in message


def test_an_allocator_mismatch_runs_alone_and_a_measurement_makes_an_unknown_gpu_share(spec) -> None:
    planner = Planner()
    mismatch = planner.plan(spec, [h200("n1", measured(matches=False))])
    assert mismatch.exclusive and mismatch.exclusive_reason == "AllocatorModelMismatch"
    assert "allocator" in _exclusive_message(mismatch)
    shared = planner.plan(spec, [unknown("n9", measured(700))])
    assert not shared.exclusive and shared.admit_bytes < 90 * GiB
    assert [(n.model, n.constants) for n in shared.needs] == [("NVIDIA X9000", measurement_fingerprint(measured(700)))]
    assert shared.runtime_gpu_model == planner.default_gpu_model  # no throughput figures for an uncatalogued GPU


def test_with_described_gpus_in_the_cluster_the_job_shares_on_them(spec) -> None:
    plan = Planner().plan(spec, [unknown("n9"), h200("n1")])
    assert not plan.exclusive and plan.admit_gpu_model == "H200"
    assert [n.model for n in plan.needs] == ["H200"]


def test_a_job_above_every_unknown_gpu_by_its_pmc_alone_is_unschedulable(spec) -> None:
    from gnnsched.operator.planning import PlanError

    with pytest.raises(PlanError) as err:
        Planner().plan(spec, [unknown("n9", capacity=1024)])
    assert err.value.reason == "PredictedPeakExceedsGPU" and "NVIDIA X9000 on node n9" in err.value.message


def test_gpus_from_gpunode_reads_catalogued_and_measured() -> None:
    obj = {"metadata": {"name": "n9"}, "status": {"nodeName": "n9", "gpus": [
        {"index": 0, "uuid": "GPU-0", "model": "NVIDIA X9000", "totalBytes": 96 * GiB, "reserveBytes": GiB,
         "catalogued": False, "measured": measured(700).wire()},
        {"index": 1, "uuid": "GPU-1", "model": "H200", "totalBytes": 141 * GiB}]}}
    gpus = gpus_from_gpunode(obj)
    assert [(g.model, g.catalogued, g.measured is not None, g.total_bytes) for g in gpus] == [
        ("NVIDIA X9000", False, True, 96 * GiB), ("H200", True, False, 141 * GiB)]
    assert gpus[0].measured == measured(700)
