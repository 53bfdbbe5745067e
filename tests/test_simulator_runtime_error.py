"""The simulator's runtime error (``--runtime-error``; gnnsched.simulator.runtime_error): the policies see the prior's
runtime, the engine runs the true one, and the same run reports the oracle's figures.

Small seeded runs on hand-made workloads (a few GCN/SAGE jobs on a 1 x 4 V100-32GB node), as in the closed memory
loop's tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.errors import FieldError
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.policyspec import parse_policies
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.runtime_error import (
    NO_RUNTIME_ERROR,
    as_oracle,
    parse_runtime_error,
    runtime_multipliers,
    with_true_runtimes,
)
from gnnsched.simulator.workloads import JobTemplate, Workload
from gnnsched.spec import parse_spec

CLUSTER = "1x4xV100-32GB"
TABLE = {"heldout_residuals": {"gcn": [2.0, 3.0], "sage": [0.5]}}


@pytest.fixture(scope="module")
def ix() -> Integrations:
    return Integrations()


def _workload(n: int, *, gap: float = 0.0, epochs: int = 150) -> Workload:
    templates = []
    for i in range(n):
        arch = ("gcn", "sage")[i % 2]
        spec = parse_spec({"mode": "train", "model": {"arch": arch, "layers": 2 + i % 3, "hidden": 64},
                           "graph": {"dataset": "cora"}, "epochs": epochs * (1 + i % 4)})
        templates.append(JobTemplate(name=f"{arch}-{i}", arrival=i * gap, spec=spec, cpu_milli=2000,
                                     memory_bytes=4 * 2**30))
    return Workload(name="rt", description="runtime-error test", templates=templates, cluster=CLUSTER)


def test_parsing_names_the_flag() -> None:
    assert parse_runtime_error("none") is NO_RUNTIME_ERROR
    e = parse_runtime_error("lognormal:0.5")
    assert (e.kind, e.sigma, e.bias, e.text()) == ("lognormal", 0.5, 1.0, "lognormal:0.5:1")
    assert parse_runtime_error("LogNormal:0.2:1.5").bias == 1.5
    m = parse_runtime_error("measured", TABLE)
    assert m.kind == "measured" and dict(m.residuals)["*"] == (2.0, 3.0, 0.5)
    for bad in ("gamma:1", "lognormal:x", "lognormal:4", "lognormal:0.1:0", "lognormal:0.1:nan"):
        with pytest.raises(FieldError, match="--runtime-error"):
            parse_runtime_error(bad)
    tables: list[dict] = [{}, {"heldout_residuals": {"gcn": []}}, {"heldout_residuals": {"gcn": [-1.0]}}]
    for table in tables:
        with pytest.raises(FieldError, match="--runtime-error"):
            parse_runtime_error("measured", table)


def test_multipliers_are_seeded_and_per_arch(ix: Integrations) -> None:
    cl = parse_cluster(CLUSTER)
    jobs = materialise(_workload(12), cl, ix, scaling=False)
    e = parse_runtime_error("lognormal:0.5")
    a, b = runtime_multipliers(jobs, e, 3), runtime_multipliers(jobs, e, 3)
    assert a == b and a != runtime_multipliers(jobs, e, 4)
    assert len(set(a.values())) == len(jobs) and all(v > 0 for v in a.values())
    measured = runtime_multipliers(jobs, parse_runtime_error("measured", TABLE), 0)
    for j in jobs:
        pool = {"gcn": {2.0, 3.0}, "sage": {0.5}}[j.spec.model.model_class]
        assert measured[j.id] in pool


def test_truth_moves_and_prediction_stays(ix: Integrations) -> None:
    cl = parse_cluster(CLUSTER)
    jobs = materialise(_workload(6), cl, ix, scaling=False)
    mult = runtime_multipliers(jobs, parse_runtime_error("lognormal:0.5"), 0)
    truth = with_true_runtimes(jobs, mult)
    for j, t in zip(jobs, truth, strict=True):
        for g, p in t.profiles.items():
            assert p.predicted_s == j.profiles[g].predicted_s
            assert math.isclose(p.solo_s, j.profiles[g].predicted_s * mult[j.id])
    for t in as_oracle(truth):
        assert all(p.predicted_s == p.solo_s for p in t.profiles.values())


def test_qos_targets_follow_the_true_solo_time(ix: Integrations) -> None:
    """Issue 37: under a runtime error an inference job's QT is 2 x its *true* solo time plus start-up (the GNNSched
    paper's measured QT), not 2 x the prediction, so a job slower than predicted is not late by construction."""
    from dataclasses import replace

    cl = parse_cluster(CLUSTER)
    ref = sorted({n.gpu_model for n in cl.nodes if n.gpus})[0]
    jobs = materialise(_workload(4), cl, ix, scaling=False)
    startup = 4.4
    jobs = [replace(j, qos_target_s=2.0 * (j.profiles[ref].predicted_s + startup)) for j in jobs]
    mult = {j.id: 2.5 for j in jobs}
    truth = with_true_runtimes(jobs, mult, qos_ref=ref, startup_s=startup)
    for t in truth:
        assert t.qos_target_s == pytest.approx(2.0 * (t.profiles[ref].solo_s + startup))
    # without the reference model the target stays as the workload set it
    assert [t.qos_target_s for t in with_true_runtimes(jobs, mult)] == [j.qos_target_s for j in jobs]


def test_engine_runs_the_truth_and_reports_the_oracle(ix: Integrations) -> None:
    """Exclusive runs every job alone, so each job's run time is its true runtime plus the start-up, under the error
    as with exact predictions; sqtf orders by prediction, so its figures under the error are its own."""
    cl = parse_cluster(CLUSTER)
    wl = _workload(16)
    rep = run(wl, cl, parse_policies("exclusive,sqtf"), 0, ix, runtime_error=parse_runtime_error("lognormal:0.8"))
    assert rep.runtime_error["dist"] == "lognormal:0.8:1"
    plain = run(wl, cl, parse_policies("exclusive,sqtf"), 0, ix)
    jobs = {o.job.id: o for o in rep.results["exclusive"].outcomes}
    for o in plain.results["exclusive"].outcomes:
        true = jobs[o.job.id]
        ref = next(iter(true.job.profiles))
        assert true.finish is not None and true.start is not None
        ratio = true.job.profiles[ref].solo_s / o.job.profiles[ref].solo_s
        assert not math.isclose(ratio, 1.0)  # the truth moved
    oracle = rep.runtime_error["oracle"]
    assert oracle["exclusive"]["jct_mean_s"] == pytest.approx(rep.policies["exclusive"]["jct_mean_s"])
    assert rep.policies["exclusive"]["jct_mean_s"] != pytest.approx(plain.policies["exclusive"]["jct_mean_s"])
    gap = rep.runtime_error["gap"]["sqtf"]
    assert gap["jct_mean_s"] == rep.policies["sqtf"]["jct_mean_s"]
    assert gap["oracle_jct_mean_s"] == oracle["sqtf"]["jct_mean_s"]
    assert gap["jct_mean_s_ratio"] == pytest.approx(gap["jct_mean_s"] / gap["oracle_jct_mean_s"])
    again = run(wl, cl, parse_policies("exclusive,sqtf"), 0, ix, runtime_error=parse_runtime_error("lognormal:0.8"))
    assert again.policies == rep.policies and again.runtime_error == rep.runtime_error


def test_cli_writes_the_oracle_beside(tmp_path) -> None:
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["simulate", "-w", "gen:load=0.7,mix=train,size=small,jobs=8", "-c", CLUSTER,
                                   "-p", "exclusive,sqtf", "--runtime-error", "lognormal:0.5", "--json", str(out),
                                   "--no-progress"])
    assert res.exit_code == 0, res.output
    assert "runtime error lognormal:0.5:1" in res.output
    doc = json.loads(out.read_text())
    assert set(doc["runtime_error"]["oracle"]) == {"exclusive", "sqtf"}
    bad = CliRunner().invoke(app, ["simulate", "-w", "gen:jobs=4", "--runtime-error", "weibull", "--no-progress"])
    assert bad.exit_code != 0 and "--runtime-error" in bad.output


def test_measured_draws_from_the_shipped_table_and_a_missing_one_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``measured`` runs on the table ``bench/runtime_truth.py`` measured; without it the flag and the file are named
    instead of falling back to the oracle."""
    out = tmp_path / "m.json"
    res = CliRunner().invoke(app, ["simulate", "-w", "gen:load=0.7,mix=train,size=small,jobs=8", "-c", CLUSTER,
                                   "-p", "sqtf", "--runtime-error", "measured", "--json", str(out), "--no-progress"])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["runtime_error"]["dist"] == "measured" and set(doc["runtime_error"]["oracle"]) == {"sqtf"}
    import gnnsched.simulator.runtime_error as runtime_error

    monkeypatch.setattr(runtime_error, "TRUTH_TABLE", "no-such-table.json")
    with pytest.raises(FieldError, match="--runtime-error.*no-such-table.json.*bench/runtime_truth.py"):
        parse_runtime_error("measured")
