"""``spec.failurePolicy`` (``gnnsched.attempts.failure_policy``): the rule's order and defaults, its spec checks, and
the operator and the simulator deciding by the same function on the same faults."""

from __future__ import annotations

from typing import Any

import pytest

from gnnsched.attempts.failure_policy import (
    DEFAULT_RULES,
    FailedAttempt,
    FailurePolicy,
    FailureRule,
    attempt_classes,
    judge,
)
from gnnsched.attempts.fault_classes import MAX_REQUEUES, Charge
from gnnsched.closed_loop import AttemptResult, FaultRecord
from gnnsched.operator.attempt_rules import failed_attempt, fault_step_update, verdict
from gnnsched.operator.resize import AttemptFacts
from gnnsched.simulator.faults import NO_ERROR, NO_FAULTS, LoopBooks
from gnnsched.simulator.model import JobProfile, SimJob
from gnnsched.spec import SpecError, parse_spec

HW = Charge("victim", "GPUFault", False, "hardware")
VICTIM = Charge("victim", "Xid 13", False, "application")
SUSPECT = Charge("suspect", "ClientFault", True, "application")
BASE: dict[str, Any] = {"mode": "train", "model": {"arch": "gcn", "layers": 2, "hidden": 16},
                        "graph": {"nodes": 100, "edges": 300, "features": 8, "classes": 3}}


def test_classes_of_a_failed_attempt() -> None:
    assert attempt_classes(None, False, 3, []) == frozenset()
    assert attempt_classes(HW, True, 3, [3]) == {"HardwareFault"}
    assert attempt_classes(VICTIM, False, 3, [3]) == {"Victim"}
    assert attempt_classes(VICTIM, True, 3, [3]) == {"Undecided"}
    assert attempt_classes(SUSPECT, True, 3, [4]) == {"Suspect"}
    assert attempt_classes(SUSPECT, True, 4, [4]) == {"Suspect", "RepeatedFault"}
    assert attempt_classes(SUSPECT, True, None, [4]) == {"Suspect"}  # no step reported: never a repeat


def test_defaults_keep_todays_rules_and_fail_a_repeated_fault() -> None:
    for classes in ({"HardwareFault"}, {"Victim"}, {"Undecided"}):
        assert judge((), FailedAttempt(classes=frozenset(classes))).action == "Ignore"  # type: ignore[arg-type]
    assert judge((), FailedAttempt(classes=frozenset({"Suspect"}))).action == "Count"
    repeated = judge((), FailedAttempt(classes=frozenset({"Suspect", "RepeatedFault"}), step=7))
    assert (repeated.action, repeated.rule, repeated.reason) == ("FailJob", "default", "RepeatedFault")
    assert judge((), FailedAttempt(exit_code=1)).action == "Count"  # unmatched: the Job's default
    # Ignore is bounded, as every uncharged requeue was
    bounded = judge((), FailedAttempt(classes=frozenset({"HardwareFault"})), requeues=MAX_REQUEUES)
    assert (bounded.action, bounded.reason) == ("Count", "RequeueLimit")


def test_the_jobs_rules_come_first_and_the_first_match_wins() -> None:
    rules = [FailureRule(action="FailJob", on_exit_codes={"operator": "In", "values": [42]}),  # type: ignore[arg-type]
             FailureRule(action="Count", on_fault_classes=["HardwareFault"]),
             FailureRule(action="Ignore", on_exit_codes={"operator": "NotIn", "values": [0, 42]})]  # type: ignore
    assert judge(rules, FailedAttempt(exit_code=42)).action == "FailJob"
    v = judge(rules, FailedAttempt(exit_code=1, classes=frozenset({"HardwareFault"})))
    assert (v.action, v.rule) == ("Count", "spec.failurePolicy.rules[1]")  # overrides the default Ignore
    assert judge(rules, FailedAttempt(exit_code=3)).rule == "spec.failurePolicy.rules[2]"
    assert judge(rules, FailedAttempt(exit_code=None)).action == "Count"  # no exit code never matches onExitCodes
    assert len(DEFAULT_RULES) == 3


DRAINED = frozenset({("DisruptionTarget", "True"), ("Ready", "False")})


def test_a_disruption_is_not_the_jobs_doing_unless_its_rules_say_so() -> None:
    """A pod Kubernetes evicted, preempted or terminated for its node carries ``DisruptionTarget`` (the pod
    disruption conditions): gnnsched's default ignores it, as the Job's docs advise writing; the job's own
    ``onPodConditions`` rule, as a Job's, overrides it; a plain deletion (no condition) counts."""
    drained = FailedAttempt(exit_code=143, conditions=DRAINED)
    v = judge((), drained)
    assert (v.action, v.rule, v.reason) == ("Ignore", "default", "Disrupted")
    assert judge((), FailedAttempt(exit_code=143, conditions=frozenset({("Ready", "False")}))).action == "Count"
    assert judge((), FailedAttempt(conditions=frozenset({("DisruptionTarget", "False")}))).action == "Count"
    count = FailureRule.model_validate({"action": "Count", "onPodConditions": [{"type": "DisruptionTarget"}]})
    assert judge([count], drained).rule == "spec.failurePolicy.rules[0]" and judge([count], drained).charged
    fail = FailureRule.model_validate({"action": "FailJob", "onPodConditions": [{"type": "Ready", "status": "False"}]})
    assert judge([fail], drained).action == "FailJob"
    assert judge((), drained, requeues=MAX_REQUEUES).reason == "RequeueLimit"  # bounded like every Ignore


def test_an_attempt_takes_its_pods_conditions() -> None:
    pod = {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"},
                                     {"type": "Ready"}, "junk", {"type": 3, "status": "True"}]}}
    attempt = failed_attempt(AttemptFacts(), 143, {}, pod)
    assert attempt.conditions == {("DisruptionTarget", "True")}
    assert failed_attempt(AttemptFacts(), 143, {}, None).conditions == frozenset()


@pytest.mark.parametrize(("policy", "field"), [
    ({"rules": [{"action": "Stop", "onFaultClasses": ["Victim"]}]}, "spec.failurePolicy.rules[0].action"),
    ({"rules": [{"action": "Ignore"}]}, "spec.failurePolicy.rules[0].onExitCodes"),
    ({"rules": [{"action": "Ignore", "onFaultClasses": ["Victim"], "onExitCodes": {"operator": "In", "values": [1]}}]},
     "spec.failurePolicy.rules[0].onExitCodes"),
    ({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [0]}}]},
     "spec.failurePolicy.rules[0].onExitCodes.values"),
    ({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [256]}}]},
     "spec.failurePolicy.rules[0].onExitCodes.values"),
    ({"rules": [{"action": "FailJob", "onExitCodes": {"operator": "Is", "values": [2]}}]},
     "spec.failurePolicy.rules[0].onExitCodes.operator"),
    ({"rules": [{"action": "Ignore", "onFaultClasses": ["Bogus"]}]}, "spec.failurePolicy.rules[0].onFaultClasses[0]"),
    ({"rules": [{"action": "Ignore", "onFaultClasses": ["Victim", "Victim"]}]},
     "spec.failurePolicy.rules[0].onFaultClasses"),
    ({"rules": [{"action": "Count", "onFaultClasses": ["Victim"]}] * 21}, "spec.failurePolicy.rules"),
    ({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "Yes"}]}]},
     "spec.failurePolicy.rules[0].onPodConditions[0].status"),
    ({"rules": [{"action": "Ignore", "onPodConditions": []}]}, "spec.failurePolicy.rules[0].onPodConditions"),
    ({"rules": [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}], "onFaultClasses": ["Victim"]}]},
     "spec.failurePolicy.rules[0].onExitCodes"),
    ({"rule": []}, "spec.failurePolicy.rule"),
])
def test_a_bad_policy_names_its_field(policy: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({**BASE, "failurePolicy": policy})
    assert err.value.field == field, err.value


def test_a_spec_without_a_policy_has_no_rules_of_its_own() -> None:
    assert parse_spec(BASE).failure_policy == FailurePolicy()


def _facts(role: str, xid: int, step: int | None) -> AttemptFacts:
    record = FaultRecord.model_validate({"gpu": "GPU-0", "role": role, "reason": "ClientFault", "xid": xid,
                                         "at": "2026-01-01T00:00:00Z"})
    return AttemptFacts(outcome="fault", fault=record,
                        result=AttemptResult(outcome="fault", steps=step) if step is not None else None)


def test_the_operator_and_the_simulator_decide_a_buggy_jobs_faults_alike() -> None:
    """The same sequence of faults of one job (its own at step 40 twice, a hardware fault between) through the
    operator's reading of pods (``operator/attempt_rules.py``) and the simulator's books: the same verdicts."""
    spec = parse_spec(BASE)
    status: dict[str, Any] = {}
    books = LoopBooks(error=NO_ERROR, fault_model=NO_FAULTS, seed=0, mode="gnnsched", largest_bytes=2**35,
                      capacity={"V100-32GB": 2**35})
    job = SimJob(id=1, name="j", arrival=0.0, mode="train", cpu_milli=1000, memory_bytes=2**30,
                 profiles={"V100-32GB": JobProfile(admit_bytes=2**30, peak_bytes=2**30, solo_s=10.0,
                                                   predicted_s=10.0, sm_util=0.5, intensity="memory")})
    for facts, charge, step in ((_facts("suspect", 13, 40), SUSPECT, 40), (_facts("victim", 79, 12), HW, None),
                                (_facts("suspect", 13, 40), SUSPECT, 40)):
        attempt = failed_attempt(facts, 1, status)
        ours = verdict(spec, attempt, status)
        status.update(fault_step_update(status, attempt))
        if ours.action == "Ignore":
            status["requeues"] = status.get("requeues", 0) + 1
        _, sim = books.judged_step(job, charge, frozenset(), step)
        assert (ours.action, ours.reason) == (sim.action, sim.reason), (facts, ours, sim)
    assert ours.action == "FailJob" and status["faultSteps"] == [40, 40]


def test_the_operators_probation_follows_the_fault_that_set_its_step() -> None:
    """``status.probationStep`` and ``status.probationSuspect`` (operator/attempt_rules.probation_update): a suspect's
    fault starts a suspect's probation; an undecided fault that moves the step makes it an undecided one (it shares
    when no GPU is idle); a fault that is not the job's own (a hardware Xid) keeps both; passing the step ends both.
    The simulator's books keep the same flag (``LoopBooks.probation_suspects``)."""
    from gnnsched.operator.attempt_rules import probation_suspect_of, probation_update

    status: dict[str, Any] = {}

    def apply(step: int, own: bool, suspect: bool = False) -> dict[str, Any]:
        update = probation_update(status, FailedAttempt(classes=frozenset(), step=step), own, suspect=suspect)
        for key, value in update.items():
            if value is None:
                status.pop(key, None)
            else:
                status[key] = value
        return update

    assert apply(12, True, suspect=True) == {"probationStep": 12, "probationSuspect": True}
    assert probation_suspect_of(status)
    assert apply(5, False) == {}  # a hardware fault before the step: still a suspect's probation at 12
    assert apply(20, True) == {"probationStep": 20, "probationSuspect": None}  # passed 12, undecided at 20
    assert status == {"probationStep": 20} and not probation_suspect_of(status)
    assert apply(20, True, suspect=True) == {"probationSuspect": True}  # its own fault at 20 again, alone
    assert apply(30, False) == {"probationStep": None, "probationSuspect": None}  # passed 20: over
    assert status == {} and apply(3, False) == {}
    assert not probation_suspect_of({"probationSuspect": True})  # no step: nothing to run alone for
