"""The operator's reading of a failed attempt for ``spec.failurePolicy`` (``gnnsched.attempts.failure_policy``): its
exit code, its fault classes, the step it failed at, and the steps of the job's earlier faults with its own fatal
error (kept in ``status.faultSteps``). The rule itself is the core's
:func:`~gnnsched.attempts.failure_policy.judge`, which the simulator calls too; this module only turns a pod's facts
into its input."""

from __future__ import annotations

from typing import Any

from gnnsched.attempts import probation
from gnnsched.attempts.failure_policy import (
    FailedAttempt,
    Verdict,
    attempt_classes,
    judge,
    pod_conditions,
    records_step,
)
from gnnsched.spec import GNNJobSpec

from .resize import AttemptFacts

MAX_FAULT_STEPS = 16


def fault_steps(status: dict[str, Any]) -> list[int]:
    raw = status.get("faultSteps")
    return [s for s in raw if isinstance(s, int)] if isinstance(raw, list) else []


def failed_attempt(facts: AttemptFacts, exit_code: int | None, status: dict[str, Any],
                   pod: dict[str, Any] | None = None) -> FailedAttempt:
    """The rules' view of a failed attempt: the step it failed at is the worker's (its result line's ``steps`` for a
    fault: the step reached, resumed ones included); a custom container that reports none has no step, and then no
    fault of its own can be a ``RepeatedFault``. ``pod``: the attempt's pod as last seen (a deleted one's final
    state), for its conditions."""
    charge = facts.fault.charge() if facts.fault is not None else None
    step = facts.result.steps if facts.result is not None and facts.result.outcome == "fault" else None
    own = facts.outcome == "fault" and not facts.victim_of_810
    return FailedAttempt(exit_code=exit_code, classes=attempt_classes(charge, own, step, fault_steps(status)),
                         step=step, conditions=pod_conditions(pod))


def verdict(spec: GNNJobSpec, attempt: FailedAttempt, status: dict[str, Any]) -> Verdict:
    requeues = status.get("requeues")
    return judge(spec.failure_policy.rules, attempt, requeues if isinstance(requeues, int) else 0)


def fault_step_update(status: dict[str, Any], attempt: FailedAttempt) -> dict[str, Any]:
    """``{"faultSteps": [...]}`` with this attempt's step added when it faulted with its own fatal error
    (``records_step``), else nothing."""
    if not records_step(attempt) or attempt.step is None:
        return {}
    return {"faultSteps": (fault_steps(status) + [attempt.step])[-MAX_FAULT_STEPS:]}


def probation_of(status: dict[str, Any]) -> int | None:
    """The job's probation step (``status.probationStep``; its next attempt's ``gnnsched.io/probation-step``)."""
    value = status.get("probationStep")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def probation_suspect_of(status: dict[str, Any]) -> bool:
    """Whether the job's probation is a suspect's (``status.probationSuspect``; its next attempt's
    ``gnnsched.io/probation-suspect``): it then runs alone whether or not a GPU is idle."""
    return probation_of(status) is not None and status.get("probationSuspect") is True


def probation_update(status: dict[str, Any], attempt: FailedAttempt, own_fault: bool,
                     sent_alone: bool = False, suspect: bool = False) -> dict[str, Any]:
    """``{"probationStep": N, "probationSuspect": ...}`` when this attempt's own fatal fault (``own_fault``: an
    undecided fault, requeued apart from its peers, or, with ``suspect``, its own as the fault's suspect) puts the
    job on probation at the step it reached (``gnnsched.attempts.probation``); ``{"probationStep": None, ...}``
    (merge patch: removed) when the attempt passed the job's probation step; else nothing."""
    current, current_suspect = probation_of(status), probation_suspect_of(status)
    wanted, is_suspect = probation.after_fault(own_fault, attempt.step, sent_alone, current, current_suspect, suspect)
    out: dict[str, Any] = {}
    if wanted != current:
        out["probationStep"] = wanted
    if is_suspect != current_suspect or (wanted is None and "probationSuspect" in status):
        out["probationSuspect"] = True if is_suspect else None
    return out
