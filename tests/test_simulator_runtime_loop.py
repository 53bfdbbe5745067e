"""The simulator's runtime loop (``+rtcal``, ``+progress``; gnnsched.simulator.runtime_loop): under a runtime error
the operator's runtime factor and the workers' step reports correct what the schedulers see, with the core's own
functions."""

from __future__ import annotations

import pytest
from test_simulator_runtime_error import CLUSTER, _workload

from gnnsched.closed_loop import DEFAULT_RUNTIME_CALIBRATION, runtime_class
from gnnsched.errors import FieldError
from gnnsched.progress import seconds_left
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.engine import Run, Simulation
from gnnsched.simulator.policyspec import parse_policies, parse_policy
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.runtime_error import parse_runtime_error, runtime_multipliers, with_true_runtimes
from gnnsched.simulator.runtime_loop import RuntimeLoop


@pytest.fixture(scope="module")
def ix() -> Integrations:
    return Integrations()


def test_the_suffixes_parse_and_apply_to_gnnsched_only() -> None:
    p = parse_policy("sqtf+sjf2+spread+rtcal+progress")
    assert p.runtime_calibration and p.progress and p.runtime_loop and p.spread and p.sjf == 2
    assert not parse_policy("sqtf").runtime_loop
    for bad in ("exclusive+rtcal", "mps-base+progress", "sqtf-paper+rtcal"):
        with pytest.raises(FieldError, match="gnnsched policies only"):
            parse_policy(bad)


def test_the_loop_learns_a_class_factor_with_the_operators_functions(ix: Integrations) -> None:
    wl = _workload(6)
    cl = parse_cluster(CLUSTER)
    jobs = materialise(wl, cl, ix, scaling=False)
    gcn = [j for j in jobs if j.spec.model.model_class == "gcn"]
    model = next(iter(gcn[0].profiles))
    loop = RuntimeLoop(calibrate=True, progress=False)
    first = loop.attempt(gcn[0])
    assert first.profile(model).predicted_s == gcn[0].profile(model).predicted_s  # uncalibrated: as predicted
    for _ in range(DEFAULT_RUNTIME_CALIBRATION.min_samples):
        loop.completed(gcn[0], model, 3.0 * gcn[0].profile(model).predicted_s)
    assert loop.changed and loop.samples == DEFAULT_RUNTIME_CALIBRATION.min_samples
    cls = runtime_class(gcn[0].spec, model, "builtin")
    assert loop.table.factor(cls, DEFAULT_RUNTIME_CALIBRATION).factor == pytest.approx(3.0)
    again = loop.attempt(first)  # an attempt already planned keeps its bare prediction as the base
    assert again.profile(model).predicted_s == pytest.approx(3.0 * gcn[0].profile(model).predicted_s)
    assert again.profile(model).solo_s == gcn[0].profile(model).solo_s  # the truth is not the loop's to move
    # the pool stands in for a class without samples of its own (SAGE on the same GPU model and mode)
    sage = next(j for j in jobs if j.spec.model.model_class == "sage")
    assert loop.attempt(sage).profile(model).predicted_s == pytest.approx(3.0 * sage.profile(model).predicted_s)
    # without +rtcal nothing moves
    off = RuntimeLoop(calibrate=False, progress=True)
    off.completed(gcn[0], model, 10.0)
    assert off.attempt(gcn[0]) is gcn[0] and off.samples == 0


def test_a_biased_error_is_learned_and_waiting_jobs_are_replanned(ix: Integrations) -> None:
    """Every job really runs 2x its prediction: with +rtcal each class's factor comes out at 2 or more (the observed
    runtime includes the neighbours' slowdown and, without progress reports, the start-up), the waiting jobs are
    re-planned, and without it nothing is learned."""
    wl = _workload(16, gap=5.0)
    cl = parse_cluster(CLUSTER)
    rep = run(wl, cl, parse_policies("sqtf+spread,sqtf+spread+rtcal"), 0, ix,
              runtime_error=parse_runtime_error("lognormal:0:2"), record_timeline=False)
    closed = rep.policies["sqtf+spread+rtcal"]
    assert closed["runtime_samples"] == 16 and closed["runtime_replans"] >= 1
    factors = rep.results["sqtf+spread+rtcal"].extra["runtime_factors"]  # class -> factor, where calibrated
    assert factors and all(2.0 <= f <= 10.0 for f in factors.values())
    assert "runtime_samples" not in rep.policies["sqtf+spread"]


def test_progress_gives_the_true_seconds_left_of_a_job_running_alone(ix: Integrations, monkeypatch) -> None:
    """A job alone on its GPU runs at a constant pace, so its measured pace x steps left must be its true seconds left
    (to within the rounding of whole steps), whatever its prediction said (here a third of the truth)."""
    wl = _workload(8, gap=2.0, epochs=20000)
    cl = parse_cluster(CLUSTER)
    jobs = materialise(wl, cl, ix, scaling=False)
    truth = with_true_runtimes(jobs, runtime_multipliers(jobs, parse_runtime_error("lognormal:0:3"), 0))
    sim = Simulation(truth, cl, parse_policy("sqtf+spread+progress@1"), ix, record_timeline=False)
    seen: list[tuple[float, float, float]] = []
    original = Simulation.progress_of

    def spy(self: Simulation, r: Run):  # type: ignore[no-untyped-def]
        report = original(self, r)
        if report is not None and report.usable():
            true_left = (r.remaining - r.rate * (self.now - r.last)) / r.rate
            step = r.work / r.job.spec.steps
            seen.append((seconds_left(None, self.now, report), true_left, step))
        return report

    monkeypatch.setattr(Simulation, "progress_of", spy)
    sim.run()
    assert len(seen) > 10
    for measured, true_left, step in seen:  # steps are whole: the pace is off by at most a step's share
        assert measured == pytest.approx(true_left, rel=0.01, abs=2 * step)
