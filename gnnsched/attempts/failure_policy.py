"""``spec.failurePolicy``: what a failed attempt does to its job, in the shape Kubernetes users know from the Job's
``podFailurePolicy`` (https://kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).

Rules are tried in order and the first that matches decides; a rule matches on the job container's exit code
(``onExitCodes: {operator: In|NotIn, values: [...]}``, as the Job's), on the pod's conditions (``onPodConditions:
[{type, status}]``, as the Job's: ``DisruptionTarget`` is what Kubernetes sets on a pod it evicts, preempts or
terminates for the node's sake) or on gnnsched's fault classes (``onFaultClasses: [...]``). Its ``action``:

* ``FailJob``: the job fails now, whatever ``backoffLimit`` has left;
* ``Ignore``: the attempt is not counted against ``backoffLimit``; a new attempt is created (bounded by
  ``gnnsched.attempts.fault_classes.MAX_REQUEUES`` uncharged requeues per job, past which the failure counts, so a job
  cannot loop forever where the Job controller would);
* ``Count``: the attempt counts against ``backoffLimit`` (what an unmatched failure does, as in the Job).

The job's own rules come first; gnnsched's defaults (:data:`DEFAULT_RULES`) follow them, so a user can override
each default by naming the class first. The defaults keep what the fault rules did before (docs/faults.md): a GPU
hardware fault and a neighbour's fault are ``Ignore``; so is a disruption (the pod carries ``DisruptionTarget``: a
``kubectl drain``, a preemption, a node shutdown), which is no more the job's doing, and whose attempt saved a
checkpoint at its SIGTERM; and they add the rule issue 27 measured the need for: a job
whose own fault (the suspect of a fault, i.e. the one client whose own error names it) happens at the same step as
an earlier fault with its own fatal error is ``FailJob`` at once. A deterministic bug fails at the same step on every
retry, so its remaining ``backoffLimit`` would only hold a whole GPU (it runs alone by then) until the same fault again.

The fault classes an attempt is matched on (:func:`attempt_classes`):

* ``HardwareFault``: its GPU had a hardware fault (a critical Xid that is not an application Xid);
* ``Victim``: a neighbour's application fault ended it; its own error did not say it faulted (810, or none);
* ``Undecided``: an application fault ended it with its own fatal error among several such clients, so nobody can be
  told apart (on the H100 every client gets 700);
* ``Suspect``: the application fault is its own (the one client whose own error was fatal);
* ``RepeatedFault``: a ``Suspect`` attempt that faulted at the step where an earlier attempt of the job faulted with
  its own fatal error (``Suspect`` or ``Undecided``).

One function decides for the operator (``operator/handlers.py``) and the simulator
(``gnnsched.simulator.faults.LoopBooks``): :func:`judge`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from gnnsched.attempts.fault_classes import Charge, may_requeue

FailureAction = Literal["FailJob", "Ignore", "Count"]
FaultCondition = Literal["HardwareFault", "Victim", "Undecided", "Suspect", "RepeatedFault"]
FAULT_CONDITIONS: tuple[FaultCondition, ...] = ("HardwareFault", "Victim", "Undecided", "Suspect", "RepeatedFault")
MAX_RULES = 20
"""As the Job's ``podFailurePolicy.rules`` (the API server's limit)."""
MAX_EXIT_CODES = 255
"""As the Job's ``onExitCodes.values``."""
REASON_RULE = "FailurePolicy"
"""The ``Failed`` condition's reason when one of the job's own rules failed it (the Job's is ``PodFailurePolicy``)."""
REASON_REPEATED = "RepeatedFault"
"""The ``Failed`` condition's reason when gnnsched's default rule failed a job that faulted at the same step twice."""
REASON_DISRUPTED = "Disrupted"
"""The ``Requeued`` condition's reason when gnnsched's default rule ignored a disruption (``DisruptionTarget``)."""
REASON_IGNORED = "FaultIgnored"
"""The ``Requeued`` condition's reason when gnnsched's default rule ignored a fault class without a fault record's
own requeue (every condition has a reason, as Kubernetes' conditions must)."""


class _Model(BaseModel):
    """As the spec's models: camelCase in YAML, unknown keys refused, strict types."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              strict=True)


class PodConditionPattern(_Model):
    """The Job's ``onPodConditions`` item: the pod has a condition of ``type`` with ``status`` (default True)."""

    type: str = Field(min_length=1, max_length=316)
    status: Literal["True", "False", "Unknown"] = "True"


class ExitCodeRequirement(_Model):
    """The Job's ``onExitCodes``: the job container's exit code is (``In``) or is not (``NotIn``) one of ``values``."""

    operator: Literal["In", "NotIn"]
    values: list[int] = Field(min_length=1, max_length=MAX_EXIT_CODES)

    @field_validator("values")
    @classmethod
    def _codes(cls, values: list[int]) -> list[int]:
        if any(not 0 <= v <= 255 for v in values):
            raise ValueError("exit codes are 0..255")
        if len(set(values)) != len(values):
            raise ValueError("must not repeat a value")
        return values

    @model_validator(mode="after")
    def _no_zero_in(self) -> ExitCodeRequirement:
        if self.operator == "In" and 0 in self.values:
            raise ValueError("values: 0 (success) cannot be matched with operator In, as in the Job's podFailurePolicy")
        return self

    def matches(self, code: int | None) -> bool:
        """Whether exit code ``code`` matches; an attempt without one (its container never ran) never does."""
        if code is None:
            return False
        return (code in self.values) == (self.operator == "In")


class FailureRule(_Model):
    """One rule: an ``action`` and exactly one requirement, ``onExitCodes``, ``onPodConditions`` or
    ``onFaultClasses``."""

    action: FailureAction
    on_exit_codes: ExitCodeRequirement | None = None
    on_pod_conditions: list[PodConditionPattern] | None = Field(default=None, min_length=1, max_length=MAX_RULES)
    on_fault_classes: list[FaultCondition] | None = Field(default=None, min_length=1, max_length=len(FAULT_CONDITIONS))

    @model_validator(mode="after")
    def _one_requirement(self) -> FailureRule:
        given = [r for r in (self.on_exit_codes, self.on_pod_conditions, self.on_fault_classes) if r is not None]
        if len(given) != 1:
            raise ValueError("onExitCodes: a rule has exactly one of onExitCodes, onPodConditions and "
                             "onFaultClasses")
        if self.on_fault_classes is not None and len(set(self.on_fault_classes)) != len(self.on_fault_classes):
            raise ValueError("onFaultClasses: must not repeat a class")
        return self

    def matches(self, attempt: FailedAttempt) -> bool:
        if self.on_exit_codes is not None:
            return self.on_exit_codes.matches(attempt.exit_code)
        if self.on_pod_conditions is not None:
            return any((p.type, p.status) in attempt.conditions for p in self.on_pod_conditions)
        return bool(attempt.classes & set(self.on_fault_classes or ()))


class FailurePolicy(_Model):
    """``spec.failurePolicy``."""

    rules: list[FailureRule] = Field(default_factory=list, max_length=MAX_RULES)


DEFAULT_RULES: tuple[FailureRule, ...] = (
    FailureRule(action="Ignore", on_fault_classes=["HardwareFault", "Victim", "Undecided"]),
    FailureRule(action="Ignore", on_pod_conditions=[PodConditionPattern(type="DisruptionTarget")]),
    FailureRule(action="FailJob", on_fault_classes=["RepeatedFault"]),
)
"""gnnsched's rules after the job's own (see the module docstring); an unmatched failure is ``Count``."""


@dataclass(frozen=True, slots=True)
class FailedAttempt:
    """What the rules see of one failed attempt: the job container's exit code (None when it has none, e.g. the pod
    was deleted) and its fault classes (:func:`attempt_classes`; empty for a failure that was not a GPU fault)."""

    exit_code: int | None = None
    classes: frozenset[FaultCondition] = frozenset()
    step: int | None = None
    """The step the attempt had reached when it failed (the job's global step, counting resumed steps), if known."""
    conditions: frozenset[tuple[str, str]] = frozenset()
    """The pod's conditions as (type, status) (:func:`pod_conditions`)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """The rules' answer for one failed attempt: the action, which rule gave it (``spec.failurePolicy.rules[i]``,
    ``default``, or ``none`` for the Job's unmatched ``Count``), and the reason a ``FailJob`` or a bounded ``Ignore``
    puts in the job's condition."""

    action: FailureAction
    rule: str
    reason: str = ""

    @property
    def charged(self) -> bool:
        return self.action == "Count"


def attempt_classes(charge: Charge | None, own_fault: bool, step: int | None,
                    earlier_own_steps: Collection[int]) -> frozenset[FaultCondition]:
    """The fault classes of an attempt that ``charge`` (the core rule's verdict on its fault; None: no GPU fault
    ended it) ended, its own error a fatal fault (not 810) when ``own_fault``. ``step``: the step it faulted at;
    ``earlier_own_steps``: the steps of the job's earlier faults with its own fatal error (``Suspect`` or
    ``Undecided``: :func:`records_step`)."""
    if charge is None:
        return frozenset()
    if charge.fault_class == "hardware":
        return frozenset({"HardwareFault"})
    if charge.role == "suspect":
        if step is not None and step in earlier_own_steps:
            return frozenset({"Suspect", "RepeatedFault"})
        return frozenset({"Suspect"})
    return frozenset({"Undecided"}) if own_fault else frozenset({"Victim"})


def pod_conditions(pod: object) -> frozenset[tuple[str, str]]:
    """A pod object's ``status.conditions`` as (type, status) pairs, what ``onPodConditions`` matches on; malformed
    entries are left out."""
    status = pod.get("status") if isinstance(pod, dict) else None
    conditions = status.get("conditions") if isinstance(status, dict) else None
    if not isinstance(conditions, list):
        return frozenset()
    return frozenset((c["type"], c["status"]) for c in conditions
                     if isinstance(c, dict) and isinstance(c.get("type"), str) and isinstance(c.get("status"), str))


def records_step(attempt: FailedAttempt) -> bool:
    """Whether the attempt's step joins the job's fault steps (``status.faultSteps``): a fault with its own fatal
    error, alone (``Suspect``) or among several (``Undecided``). A deterministic bug faults at that step every time;
    an innocent job is never a ``Suspect``, so its steps never make a ``RepeatedFault``."""
    return attempt.step is not None and bool(attempt.classes & {"Suspect", "Undecided"})


def judge(rules: Sequence[FailureRule], attempt: FailedAttempt, requeues: int = 0) -> Verdict:
    """The action for ``attempt``: the first of the job's ``rules``, then :data:`DEFAULT_RULES`, that matches;
    ``Count`` when none does. An ``Ignore`` past ``MAX_REQUEUES`` uncharged requeues (``requeues`` so far) counts
    instead (reason ``RequeueLimit``), as every uncharged requeue did before this policy existed."""
    verdict = Verdict("Count", "none")
    for i, rule in enumerate(rules):
        if rule.matches(attempt):
            verdict = Verdict(rule.action, f"spec.failurePolicy.rules[{i}]", REASON_RULE)
            break
    else:
        for rule in DEFAULT_RULES:
            if rule.matches(attempt):
                reason = REASON_REPEATED if rule.action == "FailJob" else \
                    REASON_DISRUPTED if rule.on_pod_conditions is not None else REASON_IGNORED
                verdict = Verdict(rule.action, "default", reason)
                break
    if verdict.action == "Ignore" and not may_requeue(requeues):
        return Verdict("Count", verdict.rule, "RequeueLimit")
    return verdict


def describe(verdict: Verdict, attempt: FailedAttempt) -> str:
    """One sentence for the job's condition: which rule decided what, on what."""
    what = []
    if attempt.exit_code is not None:
        what.append(f"exit code {attempt.exit_code}")
    if ("DisruptionTarget", "True") in attempt.conditions:
        what.append("pod condition DisruptionTarget")
    if attempt.classes:
        what.append("fault classes " + ", ".join(c for c in FAULT_CONDITIONS if c in attempt.classes))
    if attempt.step is not None:
        what.append(f"step {attempt.step}")
    on = "; ".join(what) or "no exit code or fault class"
    if verdict.rule == "default" and "RepeatedFault" in attempt.classes and verdict.action == "FailJob":
        return (f"its own fault came at step {attempt.step} again (a deterministic fault: a retry would fault there "
                f"again), so the job fails without spending the rest of its backoffLimit (gnnsched's default rule; "
                f"{on})")
    return f"{verdict.rule} decided {verdict.action} ({on})"
