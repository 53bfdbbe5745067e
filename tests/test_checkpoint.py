"""``spec.checkpoint``: the worker's save and resume (``gnnsched.portable.checkpoint``), the operator's claim and
mount (``operator/checkpoint.py``), and the simulator's interval, cost and refund."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from gnnsched.attempts.checkpointing import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_S,
    MIN_RUNTIME_SAMPLE_SHARE,
    MOUNT_PATH,
    kept_fraction,
    ran_share,
    runtime_sample_share,
)
from gnnsched.closed_loop import AttemptResult
from gnnsched.operator import checkpoint as op_checkpoint
from gnnsched.portable import checkpoint as portable
from gnnsched.portable.checkpoint import Checkpointer, Drained, load, save
from gnnsched.spec import SpecError, parse_spec
from gnnsched.worker import run_attempt

SPEC: dict[str, Any] = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16, "dropout": 0.3},
                        "graph": {"nodes": 300, "edges": 1200, "features": 8, "classes": 3}, "epochs": 12}


class _Clock:
    """Each finished step takes 0.6 s of this clock, so a 1 s interval saves every other step."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def _state(directory: Path) -> dict[str, Any]:
    return torch.load(directory / portable.FILE_NAME, weights_only=True)  # type: ignore[no-any-return]


def test_the_env_names_match_the_core_contract() -> None:
    assert (portable.ENV_DIR, portable.ENV_EVERY_S) == (ENV_CHECKPOINT_DIR, ENV_CHECKPOINT_EVERY_S)


def test_an_interrupted_run_resumed_from_its_checkpoint_ends_where_an_uninterrupted_one_does(tmp_path: Path) -> None:
    """Model, optimizer and RNG state (dropout draws) are all restored: an attempt that failed at step 7 and a resumed
    one end with the same weights, step by step, as one attempt that never failed."""
    spec = parse_spec(SPEC)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    clock = _Clock()

    def tick(n: int) -> None:
        clock.t += 0.6 * n

    # the reference: saves every step (interval below one step's time), the last save holds step 11
    run_attempt(spec, checkpointer=Checkpointer(str(whole), 0.5, clock=clock), progress=tick)
    assert _state(whole)["step"] == 11

    def fail_at_7(n: int) -> None:
        tick(n)
        if first.saved_step is not None and first.saved_step >= 6:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")  # a fault, after step 7

    first = Checkpointer(str(parts), 0.5, clock=clock)
    failed = run_attempt(spec, checkpointer=first, progress=fail_at_7)
    assert (failed.outcome, failed.steps, failed.resumed_from_step, failed.checkpoint_step) == ("fault", 7, 0, 6)
    assert failed.lost_seconds == pytest.approx(0.6)  # step 7 ran after the last save
    again = Checkpointer(str(parts), 0.5, clock=clock)
    done = run_attempt(spec, checkpointer=again, progress=tick)
    assert (done.outcome, done.resumed_from_step, done.steps) == ("succeeded", 6, 12)
    a, b = _state(whole), _state(parts)
    assert a["step"] == b["step"] == 11
    for key, value in a["model"].items():
        assert torch.equal(value, b["model"][key]), key
    assert torch.equal(a["rng"]["torch"], b["rng"]["torch"])


def test_a_save_that_fails_leaves_the_last_checkpoint_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = torch.nn.Linear(4, 2)
    save(str(tmp_path), model, None, 3)

    def broken(obj: Any, f: Any) -> None:
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(portable.torch, "save", broken)
    with pytest.raises(OSError):
        save(str(tmp_path), model, None, 4)
    monkeypatch.undo()
    assert os.listdir(tmp_path) == [portable.FILE_NAME]  # no temporary file left
    found = load(str(tmp_path), torch.nn.Linear(4, 2), None)
    assert found is not None and found.step == 3


def test_a_file_that_is_not_a_checkpoint_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / portable.FILE_NAME).write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match=portable.FILE_NAME):
        load(str(tmp_path), torch.nn.Linear(4, 2), None)
    torch.save({"step": 3}, tmp_path / portable.FILE_NAME)
    with pytest.raises(ValueError, match="format"):
        load(str(tmp_path), torch.nn.Linear(4, 2), None)


def test_the_environment_names_a_bad_interval(tmp_path: Path) -> None:
    assert Checkpointer.from_env({}) is None
    with pytest.raises(ValueError, match=ENV_CHECKPOINT_EVERY_S):
        Checkpointer.from_env({ENV_CHECKPOINT_DIR: str(tmp_path), ENV_CHECKPOINT_EVERY_S: "soon"})
    with pytest.raises(ValueError, match=ENV_CHECKPOINT_EVERY_S):
        Checkpointer.from_env({ENV_CHECKPOINT_DIR: str(tmp_path), ENV_CHECKPOINT_EVERY_S: "0"})
    c = Checkpointer.from_env({ENV_CHECKPOINT_DIR: str(tmp_path / "new"), ENV_CHECKPOINT_EVERY_S: "30"})
    assert c is not None and c.every_s == 30.0 and (tmp_path / "new").is_dir()


def test_sigterm_saves_at_the_end_of_the_step_and_stops(tmp_path: Path) -> None:
    spec = parse_spec(SPEC)
    c = Checkpointer(str(tmp_path), 3600.0)

    def drain_after_4(n: int) -> None:
        if c.saved_step is None and n and len(steps) == 3:
            c.stop_requested = True  # what the SIGTERM handler sets
        steps.append(n)

    steps: list[int] = []
    with pytest.raises(Drained) as stopped:
        run_attempt(spec, checkpointer=c, progress=drain_after_4)
    assert stopped.value.step == 4 and _state(tmp_path)["step"] == 4


def test_a_checkpoint_field_names_its_error() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**SPEC, "checkpoint": {"everySeconds": 0}})
    assert err.value.field == "spec.checkpoint.everySeconds"
    with pytest.raises(SpecError) as err:
        parse_spec({**SPEC, "checkpoint": {"claimName": "Not_A_Name"}})
    assert err.value.field == "spec.checkpoint.claimName"
    with pytest.raises(SpecError) as err:
        parse_spec({**SPEC, "checkpoint": {"every": 3}})
    assert err.value.field == "spec.checkpoint.every"


JOB = {"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob",
       "metadata": {"name": "j", "namespace": "team-b", "uid": "u-1"}}


def test_the_operator_claims_a_volume_owned_by_the_job_and_mounts_it() -> None:
    settings = op_checkpoint.CheckpointSettings(storage_class="nfs", size="2Gi")
    spec = parse_spec({**SPEC, "checkpoint": {}})
    assert spec.checkpoint is not None
    pvc = op_checkpoint.claim(JOB, spec.checkpoint, settings)
    assert pvc is not None and pvc["metadata"]["name"] == "j-checkpoint" and pvc["metadata"]["namespace"] == "team-b"
    assert pvc["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "2Gi"}},
                           "storageClassName": "nfs"}
    pod: dict[str, Any] = {"spec": {"containers": [{"name": "gnn", "env": []}], "volumes": []}}
    op_checkpoint.mount(pod, "j", spec, settings)
    c = pod["spec"]["containers"][0]
    assert {"name": "gnnsched-checkpoint", "mountPath": MOUNT_PATH} in c["volumeMounts"]
    assert {e["name"]: e["value"] for e in c["env"]} == {ENV_CHECKPOINT_DIR: MOUNT_PATH, ENV_CHECKPOINT_EVERY_S: "10"}
    assert pod["spec"]["volumes"] == [{"name": "gnnsched-checkpoint",
                                       "persistentVolumeClaim": {"claimName": "j-checkpoint"}}]
    own = parse_spec({**SPEC, "checkpoint": {"claimName": "mine", "everySeconds": 5}})
    assert own.checkpoint is not None and op_checkpoint.claim(JOB, own.checkpoint, settings) is None
    pod = {"spec": {"containers": [{"name": "gnn"}]}}
    op_checkpoint.mount(pod, "j", own, settings)
    assert pod["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "mine"
    assert pod["spec"]["containers"][0]["env"][1]["value"] == "5"
    plain = {"spec": {"containers": [{"name": "gnn"}]}}
    assert op_checkpoint.mount(plain, "j", parse_spec(SPEC), settings) == {"spec": {"containers": [{"name": "gnn"}]}}


def test_the_status_keeps_each_attempts_figures() -> None:
    first = op_checkpoint.attempt_record({}, 0, AttemptResult(outcome="fault", resumed_from_step=0, checkpoint_step=6,
                                                              lost_seconds=1.25))
    assert first == {"resumedFromStep": 0, "checkpointAttempts": [
        {"attempt": 1, "resumedFromStep": 0, "checkpointStep": 6, "lostSeconds": 1.25}]}
    second = op_checkpoint.attempt_record(first, 1, AttemptResult(resumed_from_step=6, checkpoint_step=11,
                                                                  lost_seconds=0.0))
    assert second["resumedFromStep"] == 6 and [h["attempt"] for h in second["checkpointAttempts"]] == [1, 2]
    assert op_checkpoint.attempt_record({}, 0, AttemptResult()) == {}  # a job that does not checkpoint


def test_checkpoint_settings_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--checkpoint-size"):
        op_checkpoint.checkpoint_settings(10, "", "lots", "ReadWriteMany")
    with pytest.raises(ValueError, match="--checkpoint-access-mode"):
        op_checkpoint.checkpoint_settings(10, "", "1Gi", "ReadMostly")


def test_kept_fraction() -> None:
    assert kept_fraction(100.0, 0.0, 0.0) == 0.0  # no checkpoints: nothing kept
    assert kept_fraction(25.0, 10.0, 0.0) == pytest.approx(20 / 25)
    assert kept_fraction(9.0, 10.0, 0.1) == 0.0  # ended before its first save
    assert kept_fraction(20.2, 10.0, 0.1) == pytest.approx(20 / 20.0)  # two saves, both done


def test_the_simulator_refunds_saved_work_and_charges_the_saves() -> None:
    """The same fault processes with and without checkpoints (gnnsched-mix-high seed 1, lmcf; the counts differ as
    the runs end at different times): the saves keep work that was lost without them, the mean JCT is lower, and a
    save's cost shows: with saves that cost a second each and no faults, every job finishes later than with none."""
    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cli import default_data_dir, fits_on
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.faults import parse_estimate_error, parse_faults
    from gnnsched.simulator.policyspec import parse_policies
    from gnnsched.simulator.runner import materialise, run
    from gnnsched.simulator.workloads import resolve_workload

    ix, data = Integrations(), default_data_dir()
    cl = parse_cluster("1x4xV100-32GB", data)
    wl = resolve_workload("gnnsched-mix-high", 1, data, fits=fits_on(cl, ix))
    jobs = materialise(wl, cl, ix, scaling=False)
    policies = parse_policies("lmcf")
    noisy = parse_estimate_error("lognormal:0.2")

    def go(every: float, write: float, hw: float = 1.0, buggy: float = 0.05) -> Any:
        return run(wl, cl, policies, 1, ix, jobs=jobs, record_timeline=False, estimate_error=noisy,
                   faults=parse_faults(hw, 600.0, buggy, every, write)).policies["lmcf"]

    none, saved = go(0.0, 0.0), go(10.0, 0.06)
    assert none["faults"] > 0 and saved["faults"] > 0 and saved["kept_work_s"] > 0
    assert saved["jct_mean_s"] < none["jct_mean_s"]
    assert saved["jobs_lost"] == none["jobs_lost"] == 0 and saved["failed_by_rule"] > 0
    costly, free = go(5.0, 1.0, hw=0.0, buggy=0.0), go(0.0, 0.0, hw=0.0, buggy=0.0)
    assert costly["kept_work_s"] == 0 and costly["jct_mean_s"] > free["jct_mean_s"]


def test_the_worker_names_a_bad_interval_and_an_unreadable_checkpoint_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    import yaml

    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"apiVersion": "gnnsched.io/v1alpha1", "kind": "GNNJob", "metadata": {"name": "j"},
                                   "spec": SPEC}))
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / portable.FILE_NAME).write_bytes(b"half a checkpoint")
    for every, needle in (("soon", f"error: {ENV_CHECKPOINT_EVERY_S}: must be a number of seconds > 0, got 'soon'"),
                          ("5", f"error: {directory / portable.FILE_NAME}: not a readable checkpoint")):
        run = subprocess.run([sys.executable, "-m", "gnnsched.cli", "worker", str(job), "--no-progress"],
                             capture_output=True, text=True, timeout=240, cwd=tmp_path,
                             env={**os.environ, ENV_CHECKPOINT_DIR: str(directory), ENV_CHECKPOINT_EVERY_S: every})
        errors = [ln for ln in run.stderr.splitlines() if ln.startswith("error:")]  # beside the profiler's notes
        assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
        assert len(errors) == 1 and errors[0].startswith(needle), run.stderr[-2000:]


def test_a_resumed_attempt_is_a_runtime_sample_only_for_the_steps_it_ran() -> None:
    """The runtime calibration compares an attempt with the whole job's prediction: an attempt that resumed at step
    k of N ran (N - k) / N of it, so its sample is scaled by that share, and a short tail (start-up and checkpoint
    load dominate) gives none. Without this every resumed attempt read as a job far faster than predicted."""
    assert ran_share(None, 100) == ran_share(0, None) == 1.0  # not resumed: the whole job
    assert ran_share(40, 100) == pytest.approx(0.6)
    assert ran_share(40, None) is None and ran_share(120, 100) is None  # resumed, the count unknown or absurd
    assert runtime_sample_share(0.6) == pytest.approx(0.6) and runtime_sample_share(1.0) == 1.0
    assert runtime_sample_share(MIN_RUNTIME_SAMPLE_SHARE / 2) is None and runtime_sample_share(None) is None
    assert runtime_sample_share(float("nan")) is None


def test_the_simulator_scales_a_resumed_attempts_runtime_sample() -> None:
    """In a simulated run with checkpoints and the runtime loop, no completed attempt's ratio is far below what its
    job's speed says: before the share, resumed attempts' tails gave ratios near 0 (one rounded to 0.0 and stopped
    ``bench/fault_what_if.py``'s "first fault" variant with a ValidationError)."""
    import bench_modules

    from gnnsched.simulator.adapters import Integrations
    from gnnsched.simulator.cli import default_data_dir, fits_on
    from gnnsched.simulator.cluster import parse_cluster
    from gnnsched.simulator.faults import DEFAULT_REPAIR_S, parse_faults
    from gnnsched.simulator.policyspec import parse_policies
    from gnnsched.simulator.runner import materialise, run
    from gnnsched.simulator.workloads import resolve_workload

    what_if = bench_modules.load("fault_what_if")
    ix, data = Integrations(), default_data_dir()
    cl = parse_cluster("1x4xV100-32GB", data)
    wl = resolve_workload("gnnsched-mix-high", 2, data, fits=fits_on(cl, ix))
    jobs = materialise(wl, cl, ix, scaling=False)
    chart = bench_modules.load("robustness").chart_default_policy()  # the runtime loop as a cluster runs it
    policies = parse_policies(chart)
    faults = parse_faults(1.0, DEFAULT_REPAIR_S, 0.05, 10.0, 0.06)
    for engine in (None, what_if.CulpritAtFirstFault):
        kw = {"engine": engine} if engine is not None else {}
        rep = run(wl, cl, policies, 2, ix, jobs=jobs, record_timeline=False, faults=faults, **kw)
        extra = rep.results[chart].extra
        assert extra["runtime_samples"] > 0
        ratios = [r for rs in extra["runtime_ratios"].values() for r in rs]
        # no runtime error in this run: every sample is near 1 (unscaled, the resumed tails gave 0.48 and 0.0)
        assert ratios and min(ratios) > 0.9, (engine, sorted(ratios)[:5])
