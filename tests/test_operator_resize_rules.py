"""The operator's closed-loop decisions as pure functions (``operator/resize.py``, ``operator/calibration.py``):
every rule's branch, from raw pod dicts as the API server returns them."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from typing import Any

from gnnsched.attempts.fault_classes import MAX_REQUEUES
from gnnsched.closed_loop import (
    AttemptResult,
    CalibrationClass,
    CalibrationPolicy,
    CalibrationTable,
)
from gnnsched.contract import ANN_ATTEMPT_RESULT, ANN_FAULT, ANN_GPU, ANN_OBSERVED_PEAK_BYTES
from gnnsched.operator.calibration import derived_fields
from gnnsched.operator.resize import (
    AGENT_VERDICT_SECONDS,
    attempt_facts,
    decide,
    settle_without_verdict,
    verdict_wait_seconds,
)

MiB = 2**20
GiB = 2**30


def failed_pod(message: str, reason: str = "Error", annotations: dict[str, str] | None = None,
               sidecar_first: bool = False, finished_at: str | None = None) -> dict[str, Any]:
    terminated: dict[str, Any] = {"exitCode": 1, "reason": reason, "message": message}
    if finished_at is not None:
        terminated["finishedAt"] = finished_at
    gnn = {"name": "gnn", "state": {"terminated": terminated}}
    sidecar = {"name": "mesh", "state": {"terminated": {"exitCode": 0, "reason": "Completed", "message": ""}}}
    return {"metadata": {"name": "j-0", "annotations": annotations or {}},
            "status": {"phase": "Failed", "containerStatuses": [sidecar, gnn] if sidecar_first else [gnn]}}


def fault(role: str) -> dict[str, str]:
    return {ANN_FAULT: json.dumps({"gpu": "GPU-0", "role": role, "reason": "Xid 43", "at": "2026-01-01T00:00:00Z"})}


def test_worker_result_line_gives_outcome_and_need_even_behind_a_sidecar() -> None:
    line = AttemptResult(outcome="memory-exceeded", held_bytes=9 * GiB, requested_bytes=2 * GiB,
                         limit_bytes=10 * GiB).line()
    facts = attempt_facts(failed_pod(f"Traceback\n{line}\n", sidecar_first=True))
    assert facts.outcome == "memory-exceeded" and facts.needed_bytes == 11 * GiB


def test_custom_container_oom_text_with_nvml_peak_gives_need() -> None:
    text = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 10.00 GiB total)"
    facts = attempt_facts(failed_pod(text, annotations={ANN_OBSERVED_PEAK_BYTES: str(9 * GiB)}))
    assert facts.outcome == "memory-exceeded" and facts.needed_bytes == 9 * GiB + 512 * MiB
    assert attempt_facts(failed_pod(text)).needed_bytes is None  # no NVML peak: growth only


def test_host_oom_kill_is_never_a_gpu_resize_and_junk_never_raises() -> None:
    assert attempt_facts(failed_pod("CUDA out of memory", reason="OOMKilled")).outcome is None
    for junk in (None, {}, {"status": {"containerStatuses": "x"}}, failed_pod("{not json"),
                 failed_pod("boom", annotations={ANN_FAULT: "{broken"})):
        facts = attempt_facts(junk)
        assert facts.outcome is None and facts.fault is None


def test_decide_rules_in_order() -> None:
    args: dict[str, Any] = {"admit_bytes": 10 * GiB, "resizes": 0, "max_resizes": 3, "requeues": 0,
                            "largest_gpu_bytes": 39 * GiB}
    oom = attempt_facts(failed_pod(AttemptResult(outcome="memory-exceeded", held_bytes=10 * GiB,
                                                 requested_bytes=GiB).line()))
    victim = attempt_facts(failed_pod("cudaErrorMpsClientTerminated", annotations=fault("victim")))
    suspect_oom = attempt_facts(failed_pod("CUDA out of memory", annotations=fault("suspect")))
    assert decide(victim, **args).kind == "requeue"
    assert decide(victim, **{**args, "requeues": MAX_REQUEUES}).kind == "charge"  # bounded
    resize = decide(oom, **args)
    assert resize.kind == "resize" and resize.new_admit_bytes == max(15 * GiB, math.ceil(11 * GiB * 1.2))
    assert decide(oom, **{**args, "resizes": 3}).kind == "resizes-exhausted"
    assert decide(oom, **{**args, "largest_gpu_bytes": 10 * GiB}).kind == "exceeds-largest"  # already all of it
    assert decide(oom, **{**args, "largest_gpu_bytes": 12 * GiB}).new_admit_bytes == 12 * GiB  # capped
    assert decide(oom, **{**args, "largest_gpu_bytes": 10 * GiB + 1}).kind == "exceeds-largest"  # needs 11 GiB
    unknown = decide(oom, **{**args, "largest_gpu_bytes": None})
    assert unknown.kind == "resize" and unknown.new_admit_bytes == resize.new_admit_bytes
    charged = decide(suspect_oom, **args)
    assert charged.kind == "charge" and charged.suspect  # the suspect is charged, not resized
    assert decide(attempt_facts(failed_pod("segfault")), **args).kind == "charge"


def test_calibration_summary_shows_each_class_factor() -> None:
    policy = CalibrationPolicy(min_samples=2)
    builtin = CalibrationClass(gpu_model="V100-32GB", arch="gcn", mode="train")
    custom = CalibrationClass(gpu_model="V100-32GB", arch="sage", mode="train", container="custom")
    table = CalibrationTable().record(builtin, 1.2, policy).record(builtin, 1.3, policy).record(custom, 1.5, policy)
    fields = derived_fields(table, policy)
    assert fields["classes"] == 2 and fields["calibratedClasses"] == 1
    # two ratios cannot place the 0.95 quantile below their largest: 1.3 x the static 1.09, and the summary says so
    assert fields["factors"][builtin.key()] == {"factor": 1.417, "samples": 2, "calibrated": True, "source": "class",
                                                "lowerBounds": 0, "censored": False, "padded": True}
    assert "V100-32GB.gcn.train.builtin=1.417 (above the largest sample)" in fields["summary"]
    three = derived_fields(table.record(builtin, 1.25, policy), policy.model_copy(update={"quantile": 0.6}))
    assert three["factors"][builtin.key()]["factor"] == 1.25 and three["factors"][builtin.key()]["padded"] is False
    assert "V100-32GB.gcn.train.builtin=1.25;" in three["summary"]  # the 2nd of 3, below the largest: as it is
    assert "V100-32GB.sage.train.custom=1.09 (static, 1 samples)" in fields["summary"]
    # A class with one sample of its own borrows its pool's factor (same GPU model, mode, container).
    gat = CalibrationClass(gpu_model="V100-32GB", arch="gat", mode="train")
    fields = derived_fields(table.record(gat, 1.25, policy), policy)
    assert fields["factors"][gat.key()] == {"factor": 1.417, "samples": 1, "calibrated": True, "source": "pool",
                                            "lowerBounds": 0, "censored": False, "padded": True}
    assert "V100-32GB.gat.train.builtin=1.417 (pool, 1 own samples) (above the largest sample)" in fields["summary"]
    assert fields["calibratedClasses"] == 2
    # A class whose only sample is a memory-exceeded lower bound: above it, and the summary says so.
    gin = CalibrationClass(gpu_model="V100-32GB", arch="gin", mode="infer")
    fields = derived_fields(table.record(gin, 1.1, policy, exceeded=True), policy)
    assert fields["factors"][gin.key()] == {"factor": 1.199, "samples": 1, "calibrated": True, "source": "pool",
                                            "lowerBounds": 1, "censored": True, "padded": True}
    assert "V100-32GB.gin.infer.builtin=1.199 (pool, 1 own samples) (above a lower bound)" in fields["summary"]


FINISHED = datetime(2026, 1, 1, 10, 0, 9, tzinfo=timezone.utc)


def gated_pod(message: str, reason: str = "Error", **annotations: str) -> dict[str, Any]:
    return failed_pod(message, reason=reason, annotations={ANN_GPU: "GPU-0", **annotations},
                      finished_at="2026-01-01T10:00:09Z")


def test_agent_attempt_result_is_the_outcome_when_the_message_has_no_result_line() -> None:
    """A custom container that died silently at its MPS limit: only the agent's annotation says memory-exceeded."""
    verdict = AttemptResult(outcome="memory-exceeded", observed_peak_bytes=10 * GiB, limit_bytes=10 * GiB,
                            held_bytes=10 * GiB, source="gate").line()
    facts = attempt_facts(gated_pod("Killed", **{ANN_ATTEMPT_RESULT: verdict}))
    assert facts.outcome == "memory-exceeded" and facts.needed_bytes == 10 * GiB and facts.awaits is None
    assert decide(facts, admit_bytes=10 * GiB, resizes=0, max_resizes=3, requeues=0,
                  largest_gpu_bytes=39 * GiB).kind == "resize"
    # the worker's own line wins over the annotation; a malformed annotation is ignored
    own = AttemptResult(outcome="succeeded", observed_peak_bytes=GiB).line()
    assert attempt_facts(gated_pod(own, **{ANN_ATTEMPT_RESULT: verdict})).outcome == "succeeded"
    junk = attempt_facts(gated_pod("Killed", **{ANN_ATTEMPT_RESULT: "{broken"}))
    assert junk.outcome is None and junk.awaits == "attempt-result"


def test_verdict_wait_is_bounded_from_the_finish_time() -> None:
    fault_text = "RuntimeError: CUDA error: cudaErrorMpsClientTerminated"
    facts = attempt_facts(gated_pod(fault_text))
    assert facts.outcome == "fault" and facts.awaits == "fault" and facts.victim_of_810
    assert verdict_wait_seconds(facts, FINISHED + timedelta(seconds=10)) == AGENT_VERDICT_SECONDS - 10
    assert verdict_wait_seconds(facts, FINISHED + timedelta(seconds=AGENT_VERDICT_SECONDS)) == 0
    # the record arrived: nothing to wait for
    with_record = attempt_facts(gated_pod(fault_text, **fault("victim")))
    assert with_record.awaits is None and verdict_wait_seconds(with_record, FINISHED) == 0
    # an ordinary failure of a pod that never reached a GPU has no agent verdict coming
    assert attempt_facts(failed_pod("boom", finished_at="2026-01-01T10:00:09Z")).awaits is None
    assert attempt_facts(gated_pod("boom")).awaits == "attempt-result"
    assert attempt_facts(gated_pod("boom", reason="OOMKilled")).awaits is None


def test_after_the_bound_810_is_a_victim_and_another_fault_is_charged() -> None:
    args: dict[str, Any] = {"admit_bytes": 10 * GiB, "resizes": 0, "max_resizes": 3, "requeues": 0,
                            "largest_gpu_bytes": 39 * GiB}
    victim = settle_without_verdict(attempt_facts(gated_pod("CUDA error: cudaErrorMpsClientTerminated")))
    assert victim.fault is not None and victim.fault.role == "victim" and victim.fault.gpu == "GPU-0"
    assert victim.fault.at == FINISHED and decide(victim, **args).kind == "requeue"
    own = settle_without_verdict(attempt_facts(gated_pod("CUDA error: an illegal memory access was encountered")))
    assert own.fault is None and decide(own, **args).kind == "charge"
