"""The simulator's closed memory loop (``--estimate-error``, ``--hw-fault-rate``, ``--buggy-jobs``;
gnnsched.simulator.faults).

Small seeded runs on hand-made workloads (a few jobs on a 1 x 4 V100-32GB node), so each property is checked where it
arises: a gnnsched attempt that overruns its limit fails alone and is retried larger, neighbours untouched; naive
MPS OOM-kills the job that allocates past the GPU; calibration cuts resizes; a hardware fault kills every client of a
GPU, gnnsched requeues them all uncharged and the GPU is out for its repair; a buggy job fails under every policy while
gnnsched loses no innocent job; and without errors or faults nothing moves.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from gnnsched.cli import app
from gnnsched.closed_loop import DEFAULT_RESIZE, next_reservation
from gnnsched.errors import FieldError
from gnnsched.simulator.adapters import Integrations
from gnnsched.simulator.cluster import parse_cluster
from gnnsched.simulator.faults import (
    BASELINE_BACKOFF_LIMIT,
    NO_ERROR,
    NO_FAULTS,
    QUARANTINE_S,
    EstimateError,
    FaultModel,
    HardwareFaultClock,
    LoopBooks,
    buggy_points,
    parse_estimate_error,
    parse_faults,
    true_multipliers,
)
from gnnsched.simulator.policyspec import PolicyError, parse_policies, parse_policy
from gnnsched.simulator.runner import materialise, run
from gnnsched.simulator.workloads import JobTemplate, Workload
from gnnsched.spec import parse_spec

CLUSTER = "1x4xV100-32GB"


@pytest.fixture(scope="module")
def ix() -> Integrations:
    return Integrations()


def _workload(n: int, *, gap: float = 0.0, epochs: int = 150, backoff: int = 3, name: str = "loop") -> Workload:
    """``n`` small GCN/SAGE training jobs (``gap`` seconds apart), 2 cores each: several run at once on the node."""
    templates = []
    for i in range(n):
        arch = ("gcn", "sage")[i % 2]
        spec = parse_spec({"mode": "train", "model": {"arch": arch, "layers": 3 + i % 3, "hidden": 64},
                           "graph": {"dataset": "cora"}, "epochs": epochs})
        templates.append(JobTemplate(name=f"{arch}-{i}", arrival=i * gap, spec=spec, cpu_milli=2000,
                                     memory_bytes=4 * 2**30, backoff_limit=backoff))
    return Workload(name=name, description="closed-loop test", templates=templates, cluster=CLUSTER)


def _run(ix: Integrations, wl: Workload, policies: str, error: EstimateError = NO_ERROR,
         faults: FaultModel = NO_FAULTS, seed: int = 0, jobs=None):
    cl = parse_cluster(CLUSTER, None)
    if jobs is None:
        jobs = materialise(wl, cl, ix, scaling=False)
    return run(wl, cl, parse_policies(policies), seed, ix, jobs=jobs, estimate_error=error, faults=faults)


# ------------------------------------------------------------------------------------------------ parsing


def test_estimate_error_parsing() -> None:
    assert parse_estimate_error("none") == NO_ERROR
    assert parse_estimate_error("lognormal:0.2") == EstimateError("lognormal", 0.2, 1.0)
    assert parse_estimate_error("LogNormal:0.05:1.3") == EstimateError("lognormal", 0.05, 1.3)
    for bad in ("gauss:0.2", "lognormal:", "lognormal:x", "lognormal:-0.1", "lognormal:0.2:0", "lognormal:0.2:1:3",
                "lognormal:nan"):
        with pytest.raises(FieldError) as exc:
            parse_estimate_error(bad)
        assert exc.value.field == "--estimate-error"
    assert parse_faults(1) == FaultModel(1.0, 600.0, 0.0)
    assert parse_faults(2, 60, 0.05) == FaultModel(2.0, 60.0, 0.05)
    for args, field in (((-1.0,), "--hw-fault-rate"), ((math.inf,), "--hw-fault-rate"),
                        ((math.nan,), "--hw-fault-rate"), ((1, 0), "--hw-repair-seconds"),
                        ((1, -5), "--hw-repair-seconds"),
                        ((1, 600, 1.5), "--buggy-jobs"), ((1, 600, -0.1), "--buggy-jobs")):
        with pytest.raises(FieldError) as exc:
            parse_faults(*args)
        assert exc.value.field == field


def test_calib_suffix() -> None:
    assert parse_policy("lmcf-calib").calibration is False
    assert parse_policy("lmcf").calibration is True
    assert parse_policy("bqt+bypass0-calib@4").calibration is False
    for bad in ("exclusive-calib", "sqtf-paper-calib"):
        with pytest.raises(PolicyError, match="-calib"):
            parse_policy(bad)


def test_multipliers_are_seeded_and_lognormal() -> None:
    wl_jobs = [type("J", (), {"id": i})() for i in range(4000)]
    a = true_multipliers(wl_jobs, EstimateError("lognormal", 0.2, 1.3), seed=7)
    assert a == true_multipliers(wl_jobs, EstimateError("lognormal", 0.2, 1.3), seed=7)
    assert a != true_multipliers(wl_jobs, EstimateError("lognormal", 0.2, 1.3), seed=8)
    logs = [math.log(v / 1.3) for v in a.values()]
    mean = sum(logs) / len(logs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
    assert abs(mean) < 0.02 and abs(sd - 0.2) < 0.02


def test_hardware_fault_clock_is_seeded_per_gpu_on_wall_time() -> None:
    a, b = HardwareFaultClock(3600.0, 1, 0), HardwareFaultClock(3600.0, 1, 0)
    gaps = [a.next_after(0.0) for _ in range(2000)]
    assert gaps == [b.next_after(0.0) for _ in range(2000)]  # the same faults for every policy
    assert HardwareFaultClock(3600.0, 1, 1).next_after(0.0) != gaps[0]
    assert sum(gaps) / len(gaps) == pytest.approx(1.0, rel=0.1)  # mean gap 1 s at 3600 per hour
    assert HardwareFaultClock(3600.0, 1, 0).next_after(500.0) == pytest.approx(500.0 + gaps[0])


def test_buggy_jobs_are_a_seeded_fraction_with_a_fixed_point() -> None:
    jobs = [type("J", (), {"id": i})() for i in range(200)]
    points = buggy_points(jobs, 0.05, seed=3)
    assert len(points) == 10 and points == buggy_points(jobs, 0.05, seed=3)
    assert points != buggy_points(jobs, 0.05, seed=4)
    assert all(0.1 <= p <= 0.9 for p in points.values())
    assert buggy_points(jobs, 0.0, seed=3) == {}


# ------------------------------------------------------------------------------------------------ behaviour


def test_no_errors_no_faults_changes_nothing(ix: Integrations) -> None:
    wl = _workload(8)
    cl = parse_cluster(CLUSTER, None)
    jobs = materialise(wl, cl, ix, scaling=False)
    policies = "exclusive,mps-naive,lmcf,bqt"
    plain = run(wl, cl, parse_policies(policies), 0, ix, jobs=jobs)
    explicit = _run(ix, wl, policies, NO_ERROR, NO_FAULTS, jobs=jobs)
    assert plain.policies == explicit.policies
    assert not explicit.closed_loop
    for m in plain.policies.values():
        assert m["memory_exceeded"] == m["resize_retries"] == m["fault_victims"] == m["jobs_lost"] == 0


def test_overrun_fails_alone_and_is_resized(ix: Integrations) -> None:
    """Bias 1.3 puts every true peak past the static 1.09 reservation: each gnnsched job fails once inside its own
    limit (no OOM kill of anyone), is retried at next_reservation's size, and completes."""
    wl = _workload(6)
    rep = _run(ix, wl, "lmcf-calib,bqt-calib", EstimateError("lognormal", 0.0, 1.3))
    for name, m in rep.policies.items():
        assert m["oom_kills"] == 0, name
        assert m["memory_exceeded"] == m["resize_retries"] == 6, name
        assert m["completed"] == 6 and m["jobs_lost"] == 0, name
        assert m["wasted_gpu_seconds"] > 0, name
        for o in rep.results[name].outcomes:
            assert o.attempts == 2 and o.status == "completed"
    # the retry's size is the shared rule's
    res = rep.results["lmcf-calib"]
    assert res.extra["memory_exceeded"] == 6
    old = 1000 * 2**20
    assert next_reservation(old, old, 32 * 2**30, DEFAULT_RESIZE) == math.ceil(old * DEFAULT_RESIZE.growth)


def test_resizes_are_bounded_and_a_job_past_every_gpu_is_not_lost(ix: Integrations) -> None:
    """maxResizes bounds the retries: a true peak 40x the estimate still fits a V100 alone, but 1.09 x 1.5^3 of the
    estimate does not reach it, so after 3 resizes the job is lost. At 400x no GPU could hold it: it fails the same
    way but is not counted as lost. Nobody is OOM-killed either way."""
    wl = _workload(3)
    for bias, lost in ((40.0, 3), (400.0, 0)):
        rep = _run(ix, wl, "lmcf-calib", EstimateError("lognormal", 0.0, bias))
        m = rep.policies["lmcf-calib"]
        assert m["resize_retries"] == 3 * DEFAULT_RESIZE.max_resizes and m["memory_exceeded"] == 3 * 4
        assert m["oom_kills"] == 0 and m["completed"] == 0 and m["failed"] == 3
        assert m["jobs_lost"] == lost, bias
        for o in rep.results["lmcf-calib"].outcomes:
            assert o.reason.startswith("MemoryExceeded") and o.attempts == 4


def test_naive_mps_overrun_kills_and_loses_jobs(ix: Integrations) -> None:
    """Under naive MPS an overrun is an OOM kill of the job that allocates past the GPU, charged to its backoffLimit
    (0 here, the GNNJob default): twelve jobs whose true peaks are ~30x their ~0.4 GB estimate (11-13 GB, each fits
    a V100 alone) spread three to a GPU, and the third on each GPU does not fit."""
    wl = _workload(12, epochs=20000, backoff=0)
    rep = _run(ix, wl, "mps-naive,exclusive", EstimateError("lognormal", 0.05, 30.0))
    naive, excl = rep.policies["mps-naive"], rep.policies["exclusive"]
    assert naive["oom_kills"] > 0 and naive["jobs_lost"] == naive["failed"] > 0
    assert naive["wasted_gpu_seconds"] > 0
    assert excl["oom_kills"] == 0 and excl["completed"] == 12  # alone, each fits


def test_calibration_halves_resizes(ix: Integrations) -> None:
    """Jobs that arrive over time: once a class has min_samples completed ratios, new estimates use its high
    quantile and stop overrunning; the static factor (-calib) overruns every time."""
    wl = _workload(30, gap=8.0, epochs=60)
    rep = _run(ix, wl, "lmcf,lmcf-calib", EstimateError("lognormal", 0.05, 1.3))
    calib, static = rep.policies["lmcf"], rep.policies["lmcf-calib"]
    assert static["resize_retries"] == 30
    assert calib["resize_retries"] * 2 <= static["resize_retries"]
    assert calib["jobs_lost"] == static["jobs_lost"] == 0
    factors = rep.results["lmcf"].extra["calibration"]
    assert factors and all(1.3 <= f <= 1.6 for f in factors.values())


def test_calibration_pools_architectures_with_too_few_jobs_each(ix: Integrations) -> None:
    """A mixed queue of four architectures, four jobs each, arriving over time: no class ever has min_samples (5)
    ratios of its own, so only the pool (same GPU model, mode, container) can calibrate; it does, and halves the
    resizes against -calib."""
    templates = []
    for i in range(16):
        arch = ("gcn", "sage", "gat", "gin")[i % 4]
        model = {"arch": arch, "layers": 3, "hidden": 64, **({"heads": 2} if arch == "gat" else {})}
        spec = parse_spec({"mode": "train", "model": model, "graph": {"dataset": "cora"}, "epochs": 60})
        templates.append(JobTemplate(name=f"{arch}-{i}", arrival=i * 8.0, spec=spec, cpu_milli=2000,
                                     memory_bytes=4 * 2**30, backoff_limit=0))
    wl = Workload(name="pool", description="four architectures", templates=templates, cluster=CLUSTER)
    rep = _run(ix, wl, "lmcf,lmcf-calib", EstimateError("lognormal", 0.05, 1.3))
    calib, static = rep.policies["lmcf"], rep.policies["lmcf-calib"]
    assert static["resize_retries"] == 16
    assert calib["resize_retries"] * 2 <= static["resize_retries"]
    assert calib["jobs_lost"] == static["jobs_lost"] == 0
    table = rep.results["lmcf"].extra["calibration"]
    assert len(table) == 4 and all(1.3 <= f <= 1.6 for f in table.values())


def test_waiting_attempts_are_replanned_after_the_first_overruns(ix: Integrations) -> None:
    """The CoGNN mix's shape: 16 jobs of four architectures all arrive at t = 0, every one 1.3x its estimate, so
    every admit is planned before any observation. The first attempts to start overrun; their lower bounds make the
    pool's factor their resize (1.65), and the attempts still waiting for a node are re-planned to it (the operator
    patches their admit-bytes), so only the attempts that had started overrun: at least half fewer resizes."""
    templates = []
    for i in range(16):
        arch = ("gcn", "sage", "gat", "gin")[i % 4]
        model = {"arch": arch, "layers": 3, "hidden": 64, **({"heads": 2} if arch == "gat" else {})}
        spec = parse_spec({"mode": "train", "model": model, "graph": {"dataset": "cora"}, "epochs": 60})
        templates.append(JobTemplate(name=f"{arch}-{i}", arrival=0.0, spec=spec, cpu_milli=6000,
                                     memory_bytes=4 * 2**30, backoff_limit=0))
    wl = Workload(name="burst", description="four architectures at once", templates=templates, cluster=CLUSTER)
    rep = _run(ix, wl, "lmcf,lmcf-calib", EstimateError("lognormal", 0.0, 1.3))
    calib, static = rep.policies["lmcf"], rep.policies["lmcf-calib"]
    assert static["resize_retries"] == 16
    assert 0 < calib["resize_retries"] * 2 <= static["resize_retries"]
    assert calib["jobs_lost"] == static["jobs_lost"] == 0 and calib["oom_kills"] == 0
    # No completed attempt was ever sized below the bounds: the factor stays above them, the quantile of the exact
    # ratios (1.3) once the retries and re-planned attempts complete.
    assert all(1.3 <= f <= 1.65 for f in rep.results["lmcf"].extra["calibration"].values())


def test_a_resized_attempt_goes_ahead_of_the_jobs_that_have_not_run(ix: Integrations) -> None:
    """The operator's retry class: 16 jobs at t = 0, each 1.3x its estimate and without calibration, so every first
    attempt overruns. The attempts of the first wave are retried ahead of the jobs still waiting (as a new pod in its
    job's class it would wait behind all of them), so every first-wave job restarts before any later job first
    starts."""
    templates = []
    for i in range(16):
        spec = parse_spec({"mode": "train", "model": {"arch": "gcn", "layers": 3, "hidden": 64},
                           "graph": {"dataset": "cora"}, "epochs": 60})
        templates.append(JobTemplate(name=f"gcn-{i}", arrival=0.0, spec=spec, cpu_milli=6000,
                                     memory_bytes=4 * 2**30, backoff_limit=0))
    wl = Workload(name="burst", description="one class at once", templates=templates, cluster=CLUSTER)
    rep = _run(ix, wl, "lmcf-calib", EstimateError("lognormal", 0.0, 1.3))
    outcomes = rep.results["lmcf-calib"].outcomes
    assert rep.policies["lmcf-calib"]["resize_retries"] == 16
    assert all(o.status == "completed" and o.attempts == 2 for o in outcomes)
    first = min(o.first_start for o in outcomes if o.first_start is not None)
    wave = [o for o in outcomes if o.first_start == first]
    later = [o for o in outcomes if o.first_start is not None and o.first_start > first]
    assert wave and later
    assert max(o.start for o in wave if o.start is not None) <= min(o.first_start for o in later if o.first_start)


def test_hardware_faults_requeue_every_client_uncharged_and_charge_baselines(ix: Integrations) -> None:
    """A high hardware fault rate (jobs share GPUs): gnnsched requeues every client without charging it and loses no
    job; naive MPS charges every failed pod to backoffLimit 0 and loses jobs."""
    wl = _workload(12, epochs=40000, backoff=0)
    rep = _run(ix, wl, "mps-naive,lmcf", NO_ERROR, parse_faults(40.0, 30.0), seed=3)
    ours, naive = rep.policies["lmcf"], rep.policies["mps-naive"]
    assert ours["hw_faults"] > 0 and ours["fault_victims"] > 0 and ours["innocent_jobs_requeued"] > 0
    assert ours["app_faults"] == 0 and ours["oom_kills"] == 0
    assert ours["jobs_lost"] == 0 and ours["completed"] == 12
    assert naive["hw_faults"] > 0 and naive["failed"] > 0 and naive["jobs_lost"] > 0


def test_hardware_faulted_gpu_is_out_for_its_repair(ix: Integrations) -> None:
    """A hardware fault takes its GPU out for --hw-repair-seconds, under every policy: nothing starts there."""
    wl = _workload(16, gap=1.0, epochs=40000, backoff=3)
    rep = _run(ix, wl, "lmcf,mps-naive", NO_ERROR, parse_faults(20.0, 120.0), seed=5)
    for name, res in rep.results.items():
        faults = res.extra["fault_log"]
        assert faults, name
        for t, gid in faults:
            during = [g for g in res.groups if g.gpu == gid and t <= g.t < t + 120.0]
            assert not during, (name, t, gid, during[:3])
    lmcf = rep.results["lmcf"]
    assert any(t < g.t for t, _ in lmcf.extra["fault_log"] for g in lmcf.groups)  # work goes on after faults
    assert rep.policies["lmcf"]["jobs_lost"] == 0
    # hw_out_share: each fault's 120 s (cut at the run's end) over 4 GPUs x the run's time
    out = sum(min(lmcf.end_time, t + 120.0) - t for t, _ in lmcf.extra["fault_log"])
    assert lmcf.extra["hw_out_share"] == pytest.approx(out / (4 * lmcf.end_time)) and out > 0


def test_buggy_jobs_fail_everywhere_and_gnnsched_loses_no_innocent_job(ix: Integrations) -> None:
    """A buggy job faults at the same point of every attempt: it fails under every policy, exclusive included.
    gnnsched requeues its co-located neighbours uncharged (every client's own error is fatal, so nobody can be told
    apart), runs it alone after two undecided faults, and then charges it; naive MPS loses its neighbours too."""
    wl = _workload(12, epochs=40000, backoff=1)
    cl = parse_cluster(CLUSTER, None)
    jobs = materialise(wl, cl, ix, scaling=False)
    rep = _run(ix, wl, "exclusive,mps-naive,lmcf", NO_ERROR, parse_faults(0.0, 600.0, 0.25), seed=2, jobs=jobs)
    buggy = set(buggy_points(jobs, 0.25, seed=2))
    assert len(buggy) == 3
    for name, res in rep.results.items():
        m = rep.policies[name]
        assert m["buggy_jobs_failed"] == 3, name
        assert {o.job.id for o in res.outcomes if o.status == "failed"} >= buggy, name
        assert m["hw_faults"] == 0 and m["app_faults"] >= 1, name
    ours = rep.policies["lmcf"]
    assert ours["jobs_lost"] == 0 and ours["innocent_jobs_requeued"] > 0
    assert ours["innocent_jobs_alone"] <= ours["innocent_jobs_requeued"]
    assert rep.policies["exclusive"]["jobs_lost"] == 0  # alone, a buggy job harms nobody
    assert rep.policies["mps-naive"]["jobs_lost"] > 0
    # gnnsched charged each buggy job only once it ran alone: its last attempts had the GPU to itself, and one whose
    # own fault came at a step where it had faulted before failed there (gnnsched.attempts.failure_policy)
    for o in rep.results["lmcf"].outcomes:
        assert o.status == "completed" or (o.job.id in buggy and o.reason.startswith(("ClientFault", "RepeatedFault")))


def test_cli_flags_and_bad_values(tmp_path) -> None:
    runner = CliRunner()
    bad = runner.invoke(app, ["simulate", "--estimate-error", "lognormal:abc", "--no-progress"])
    assert bad.exit_code == 2
    assert bad.output.strip().count("\n") == 0 and "--estimate-error" in bad.output
    bad = runner.invoke(app, ["simulate", "--hw-fault-rate", "-2", "--no-progress"])
    assert bad.exit_code == 2 and "--hw-fault-rate" in bad.output
    bad = runner.invoke(app, ["simulate", "--buggy-jobs", "2", "--no-progress"])
    assert bad.exit_code == 2 and "--buggy-jobs" in bad.output
    gone = runner.invoke(app, ["simulate", "--fault-rate", "1", "--no-progress"])
    assert gone.exit_code == 2 and "--fault-rate" in gone.output  # replaced by --hw-fault-rate / --buggy-jobs
    bad = runner.invoke(app, ["simulate", "--backoff-limit", "11", "--no-progress"])
    assert bad.exit_code == 2 and "--backoff-limit" in bad.output


def test_baselines_fail_the_job_by_default_and_backoff_limit_overrides(ix: Integrations) -> None:
    """In a closed-loop run a baseline's failed pod fails its job (BASELINE_BACKOFF_LIMIT 0) whatever the workload
    says (3 here), while gnnsched keeps the workload's backoffLimit; --backoff-limit replaces every job's: with 3 the
    same overrunning naive-MPS jobs survive their OOM kills. The open-loop engine keeps the workload's."""
    default = parse_spec({"mode": "train", "model": {"arch": "gcn"}, "graph": {"dataset": "cora"}}).backoff_limit
    assert BASELINE_BACKOFF_LIMIT == 0 == default
    wl = _workload(12, epochs=20000, backoff=3)
    cl = parse_cluster(CLUSTER, None)
    jobs = materialise(wl, cl, ix, scaling=False)
    err = EstimateError("lognormal", 0.05, 30.0)
    strict = run(wl, cl, parse_policies("mps-naive,lmcf"), 0, ix, jobs=jobs, estimate_error=err)
    kept = run(wl, cl, parse_policies("mps-naive"), 0, ix, jobs=jobs, estimate_error=err, backoff_limit=3)
    assert strict.policies["mps-naive"]["jobs_lost"] > kept.policies["mps-naive"]["jobs_lost"]
    assert all(o.job.backoff_limit == 0 for o in strict.results["mps-naive"].outcomes)
    assert all(o.job.backoff_limit == 3 for o in strict.results["lmcf"].outcomes)
    assert all(o.job.backoff_limit == 3 for o in kept.results["mps-naive"].outcomes)
    plain = run(wl, cl, parse_policies("mps-naive"), 0, ix, jobs=jobs)
    assert all(o.job.backoff_limit == 3 for o in plain.results["mps-naive"].outcomes)


def test_memory_exceeded_attempt_is_recorded_as_a_lower_bound(ix: Integrations) -> None:
    """As the operator does, a memory-exceeded attempt records (bytes it needed) / predicted in the calibration
    table, as a lower bound (``exceeded``), at the OOM: in the model it held its limit, so the bound is the factor it
    ran at, never above the job's true one. The next job of its class is then sized above it (bound x 1.09)."""
    wl = _workload(2)
    cl = parse_cluster(CLUSTER, None)
    job = materialise(wl, cl, ix, scaling=False)[0]
    model = "V100-32GB"
    cap = 32 * 2**30
    books = LoopBooks(error=EstimateError("lognormal", 0.0, 1.5), fault_model=NO_FAULTS, seed=0, mode="gnnsched",
                      largest_bytes=cap, capacity={model: cap}, multipliers={job.id: 1.5})
    first = books.attempt(job)
    assert books.exceeds(first, model) and books.resized(first, model)
    assert books.table.ratios == {}
    (bounds,) = books.table.exceeded.values()
    assert bounds == [pytest.approx(1.09, abs=1e-3)] and bounds[0] <= 1.5
    other = replace(job, id=job.id + 1)
    new = books.attempt(other).profile(model)
    assert new.admit_bytes == math.ceil(new.peak_bytes * round(bounds[0] * 1.09, 4))  # padded_quantile


def test_faulted_gpu_admits_nothing_while_it_drains(ix: Integrations) -> None:
    """After a buggy job's application fault the GPU takes no admission for QUARANTINE_S (its clients exit, the MPS
    probe answers), under gnnsched's gate and under the baselines alike; other GPUs keep admitting."""
    wl = _workload(16, gap=1.0, epochs=40000, backoff=3)
    rep = _run(ix, wl, "lmcf,mps-naive", NO_ERROR, parse_faults(0.0, 600.0, 0.25), seed=5)
    for name, res in rep.results.items():
        faults = res.extra["fault_log"]
        assert faults, name
        for t, gid in faults:
            during = [g for g in res.groups if g.gpu == gid and t <= g.t < t + QUARANTINE_S]
            assert not during, (name, t, gid, during[:3])
    lmcf = rep.results["lmcf"]
    assert any(t < g.t for t, _ in lmcf.extra["fault_log"] for g in lmcf.groups)  # work goes on after faults


def test_loop_books_calibrated_and_exclusive_reservations(ix: Integrations) -> None:
    """A class with min_samples recorded ratios uses their high quantile on the predicted need (with too few to place
    it below their largest, the largest times 1.09); -calib keeps the static 1.09; a job suspected twice books the
    GPU's whole capacity."""
    wl = _workload(2)
    cl = parse_cluster(CLUSTER, None)
    job = materialise(wl, cl, ix, scaling=False)[0]
    model = "V100-32GB"
    need = job.profile(model).peak_bytes
    cap = 32 * 2**30
    books = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="gnnsched", largest_bytes=cap,
                      capacity={model: cap})
    static = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="calib-off", largest_bytes=cap,
                       capacity={model: cap})
    first = books.attempt(job)
    assert first.profile(model).admit_bytes == math.ceil(need * 1.09)  # too few samples: the static factor
    for ratio in (1.2, 1.25, 1.3, 1.22, 1.28):
        books.table = books.table.record(books._class(job, model), ratio)
        static.table = static.table.record(static._class(job, model), ratio)
    assert books.attempt(job).profile(model).admit_bytes == math.ceil(need * 1.417)
    assert static.attempt(job).profile(model).admit_bytes == math.ceil(need * 1.09)
    (charge,) = books.fault_charges(13, [job], job.id).values()  # alone: its own fault, the suspect
    assert charge.role == "suspect" and charge.charged
    assert not books.step(job, charge).alone and books.attempt(job).profile(model).admit_bytes < cap
    assert books.step(job, charge).alone  # suspected twice: runs alone, booking the GPU's whole capacity
    assert books.attempt(job).profile(model).admit_bytes == cap


def test_cli_json_keys_and_columns(tmp_path) -> None:
    """--estimate-error / --hw-fault-rate / --buggy-jobs on the CLI: the new keys per policy, the closed_loop block,
    the new columns."""
    wl = tmp_path / "jobs.yaml"
    wl.write_text("\n".join(
        f"- {{apiVersion: gnnsched.io/v1alpha1, kind: GNNJob, metadata: {{name: j{i}}}, spec: {{mode: train, "
        f"model: {{arch: gcn, layers: 3, hidden: 64}}, graph: {{dataset: cora}}, epochs: 2000, backoffLimit: 1}}, "
        f"arrival: {i}}}" for i in range(4)) + "\n")
    out = tmp_path / "out.json"
    done = CliRunner().invoke(app, ["simulate", "-w", str(wl), "-c", CLUSTER, "-p", "lmcf,lmcf-calib,mps-naive",
                                    "--estimate-error", "lognormal:0.3:1.2", "--hw-fault-rate", "5",
                                    "--buggy-jobs", "0.25", "--json",
                                    str(out), "--no-progress"])
    assert done.exit_code == 0, done.output
    for column in ("mem-exc", "resized", "victims", "lost", "wasted GPU s"):
        assert column in done.output
    doc = json.loads(out.read_text())
    assert doc["closed_loop"] == {"estimate_error": "lognormal:0.3:1.2", "hw_fault_rate": 5.0,
                                  "hw_repair_seconds": 600.0, "buggy_jobs": 0.25}
    for m in doc["policies"].values():
        for key in ("memory_exceeded", "resize_retries", "fault_victims", "jobs_lost", "wasted_gpu_seconds",
                    "buggy_jobs_failed", "innocent_jobs_requeued", "innocent_jobs_alone", "hw_faults", "app_faults",
                    "hw_out_share"):
            assert key in m
    assert doc["policies"]["lmcf"]["oom_kills"] == 0
    plain = CliRunner().invoke(app, ["simulate", "-w", str(wl), "-c", CLUSTER, "-p", "lmcf", "--no-progress"])
    assert plain.exit_code == 0 and "mem-exc" not in plain.output


def _with_a_big_job(ix: Integrations, n: int, peak_bytes: int, admit_bytes: int) -> tuple[Workload, list, int]:
    """``n`` small jobs whose first is replaced by a 30 s job of ``peak_bytes`` and ``admit_bytes`` on the V100:
    the workload, its jobs and the big job's id."""
    wl = _workload(n)
    jobs = materialise(wl, parse_cluster(CLUSTER, None), ix, scaling=False)
    big = jobs[0]
    model = next(iter(big.profiles))
    prof = big.profiles[model]
    jobs[0] = replace(big, profiles={model: replace(prof, peak_bytes=peak_bytes, admit_bytes=admit_bytes,
                                                    solo_s=max(prof.solo_s, 30.0), predicted_s=30.0)})
    return wl, jobs, big.id


def _ran_beside(outcomes: dict, job_id: int) -> list[str]:
    """The jobs that ran on the GPU of ``job_id`` while it did."""
    alone = outcomes[job_id]
    assert alone.start is not None and alone.finish is not None
    return [o.job.name for o in outcomes.values() if o.job.id != job_id and o.gpu == alone.gpu
            and o.start is not None and o.finish is not None and o.start < alone.finish and o.finish > alone.start]


def test_open_loop_runs_a_job_too_big_to_share_alone(ix: Integrations) -> None:
    """Without errors or faults the open-loop run plans as the operator does: a job whose admit bytes exceed the
    GPU but whose peak fits it reserves the whole GPU and runs alone (``operator/planning.py``'s ``exclusive``), as
    the closed-loop run of the same policy does. It used to wait forever, so the two runs' mean JCTs were over
    different jobs and the closed loop's ratio to the open loop came out too high."""
    total = 32 * 2**30
    wl, jobs, big = _with_a_big_job(ix, 6, total - 2**30, total + 2**30)
    both = []
    for error in (NO_ERROR, parse_estimate_error("lognormal:0.000001")):
        report = _run(ix, wl, "base", error=error, jobs=jobs)
        outcomes = {o.job.id: o for o in report.results["base"].outcomes}
        alone = outcomes[big]
        assert alone.status == "completed", (error, alone.status, alone.reason)
        assert _ran_beside(outcomes, big) == []
        both.append(report.policies["base"]["jct_mean_s"])
    assert both[0] == pytest.approx(both[1], rel=0.05)  # the same jobs, the same plan: a tiny error changes nothing


@pytest.mark.parametrize(("multiplier", "completes"), [(0.8, True), (1.0, False)])
def test_a_job_predicted_just_above_the_gpu_is_tried_alone(ix: Integrations, multiplier: float,
                                                           completes: bool) -> None:
    """Predicted 10 % above the V100 (less than closed_loop.MEASURED_OVERPREDICTION): the closed loop tries it alone
    with the whole GPU as its limit, as the operator does (PredictedPeakAboveGPU). An over-estimate completes, and
    nothing ran beside it; a true estimate overruns once and ends ExceedsLargestGPU, not counted as lost (it fits no
    GPU)."""
    total = 32 * 2**30
    peak = int(total * 1.1)
    wl, jobs, big = _with_a_big_job(ix, 4, peak, int(peak * 1.1))
    model = next(iter(jobs[0].profiles))
    books = LoopBooks(error=EstimateError("lognormal", 0.0, 1.0), fault_model=NO_FAULTS, seed=0, mode="gnnsched",
                      largest_bytes=total, capacity={model: total}, multipliers={big: multiplier})
    assert books.attempt(jobs[0]).profile(model).admit_bytes == total
    report = _run(ix, wl, "base", error=EstimateError("lognormal", 1e-9, multiplier), jobs=jobs)
    outcomes = {o.job.id: o for o in report.results["base"].outcomes}
    alone = outcomes[big]
    assert report.policies["base"]["jobs_lost"] == 0 and report.policies["base"]["oom_kills"] == 0
    if completes:
        assert alone.status == "completed" and alone.attempts == 1
        assert _ran_beside(outcomes, big) == []
    else:
        assert alone.status == "failed" and alone.reason == "ExceedsLargestGPU" and alone.attempts == 1


def test_the_simulated_extender_keeps_fault_peers_apart_as_the_extender_does(ix: Integrations, monkeypatch) -> None:
    """On 4 nodes of one GPU, after undecided faults, the simulator's extender runs the apart rule through the same
    core functions as ``extender/cache.py``: at every placement the rule touches, the nodes that pass its filter are
    the ones the real ``ClusterCache`` passes for the same GPUs, clients, jobs and peers, and the job is bound to a
    node clear of its peers whenever one of the candidates is."""
    from datetime import datetime, timezone

    from gnnsched.contract import GPUJob, GPUNodeStatus, GPUStatus, MPSStatus
    from gnnsched.extender.cache import ClusterCache
    from gnnsched.extender.pods import PodDemand
    from gnnsched.simulator.adapters import PlacementView

    seen: list[dict] = []
    blocked_of = PlacementView._apart_blocked
    passed_of = PlacementView._apart_passed
    reserve = PlacementView._reserve

    def extender_passes(view, job, cands) -> set[int]:
        """The real extender's filter over the same candidates, fed what the node agents would report (the
        extender's reservations shown as running clients: the same clients, jobs and peers on each GPU)."""
        sim = view.sim
        apart = sim.loop.apart
        cache = ClusterCache(view.interference)
        stamp = datetime.fromtimestamp(sim.now, tz=timezone.utc)
        for row in cands.tolist():
            node = sim.nodes[row]
            gpus = []
            for g in node.gpus:
                clients = [r.job for r in g.running] + list(sim.reserved_on.get((node.idx, g.index), {}).values())
                gpus.append(GPUStatus(
                    index=g.index, uuid=f"GPU-{row}-{g.index}", model=g.model, total_bytes=g.total,
                    reserve_bytes=g.reserve, committed_bytes=g.committed, healthy=g.quarantine_until <= sim.now,
                    max_clients=sim.per_gpu_cap or g.max_clients,
                    # in the demand's namespace, as the simulated jobs all share one (the trust-domain rule agrees)
                    running=[GPUJob(pod_uid=f"u{j.id}", namespace="sim", job=str(j.id),
                                    bytes=j.profile(g.model).admit_bytes,
                                    predicted_remaining_seconds=60.0, fault_peers=sorted(apart.get(j.id, ())))
                             for j in clients]))
            cache.upsert_gpunode(GPUNodeStatus(node_name=f"n{row}", updated_at=stamp, mps=MPSStatus(), gpus=gpus),
                                 now=sim.now)
        prof = job.profile(sim.nodes[int(cands[0])].gpus[0].model)
        demand = PodDemand(uid="x", namespace="sim", name=str(job.id), gpu_bytes=prof.admit_bytes,
                           runtime_seconds=prof.predicted_s, runtime_known=True, intensity=prof.intensity,
                           cpu_millis=0, memory_bytes=0, job=str(job.id), apart=apart.get(job.id, frozenset()))
        out = cache.filter(demand, cache.index_of([f"n{r}" for r in cands.tolist()]))
        return {int(r) for r, ok in zip(cands.tolist(), out.passed.tolist(), strict=True) if ok}

    def record_blocked(self, job, cands):
        blocked = blocked_of(self, job, cands)
        if blocked:
            seen.append({"job": job, "cands": cands.copy(), "blocked": blocked,
                         "extender": extender_passes(self, job, cands)})
        return blocked

    def record_passed(self, passed, good, blocked, cols):
        keep = passed_of(self, passed, good, blocked, cols)
        seen[-1]["sim"] = {int(seen[-1]["cands"][i]) for i in np.flatnonzero(keep).tolist()}
        return keep

    def record_reserve(self, job, demand, node, s):
        if seen and seen[-1]["job"] is job:
            seen[-1]["bound"] = node.idx
        return reserve(self, job, demand, node, s)

    monkeypatch.setattr(PlacementView, "_apart_blocked", record_blocked)
    monkeypatch.setattr(PlacementView, "_apart_passed", record_passed)
    monkeypatch.setattr(PlacementView, "_reserve", record_reserve)
    wl = replace(_workload(12, epochs=40000, backoff=1), cluster="4x1xV100-32GB")
    cl = parse_cluster("4x1xV100-32GB", None)
    jobs = materialise(wl, cl, ix, scaling=False)
    rep = run(wl, cl, parse_policies("lmcf"), 2, ix, jobs=jobs, estimate_error=NO_ERROR,
              faults=parse_faults(0.0, 600.0, 0.25))
    assert rep.policies["lmcf"]["app_faults"] >= 1
    assert seen, "no placement met the apart rule: the test proves nothing"
    refused = 0
    for case in seen:
        assert case["sim"] == case["extender"], case
        blocked_rows = {int(case["cands"][c]) for _, c in case["blocked"]}
        if case["sim"] - blocked_rows:  # a candidate clear of the job's peers: the job goes to one
            refused += bool(blocked_rows & set(case["cands"].tolist()))
            assert case.get("bound") in case["sim"] - blocked_rows, case
    assert refused, "no placement chose between a blocked and a clear node"
