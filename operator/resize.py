"""What the operator does with a failed attempt under the closed memory loop (``gnnsched.closed_loop``).

Pure functions over the pod and the job's counters (no API calls), so every decision is unit-testable and is taken
again identically after an operator restart: the counters live in the job's status and are written in the same patch
as the next attempt's pod name, so a restart between the two neither loses nor repeats an attempt.

Order of the rules, first match wins:

1. The node agent marked the pod a **victim** of a co-located fatal MPS fault (``gnnsched.io/fault``, role
   ``victim``): requeue with the same reservation, not charged to ``backoffLimit`` (condition ``Requeued``, reason
   ``CoLocatedFault``). Bounded by ``MAX_REQUEUES`` (``gnnsched.attempts.fault_classes.may_requeue``, the rule the
   simulator runs too) so a GPU that keeps faulting cannot loop a job forever.
2. The attempt ran out of its GPU memory reservation (``memory-exceeded``: the worker's result line, else the node
   agent's ``gnnsched.io/attempt-result`` annotation, else PyTorch's or CUDA's out-of-memory text in the termination
   message): retry with ``next_reservation``, capped at the largest
   GPU; not charged to ``backoffLimit``; bounded by ``spec.memory.maxResizes``. No GPU can hold more: the job fails
   with ``ExceedsLargestGPU``; resizes used up: it fails with ``MemoryExceeded``.
3. Anything else is charged to ``backoffLimit`` as before. A pod the agent marked the **suspect** of a fault is
   charged normally, and a job suspected twice runs its later attempts alone on a GPU (``exclusive``).

Before any rule, the operator may have to wait for the node agent (``verdict_wait_seconds``). The agent writes its
verdict on a pod (``gnnsched.io/fault``, ``gnnsched.io/attempt-result``) only after the pod's container status
appears, so the verdict can land seconds after the pod is ``Failed``. A gated attempt that failed with a GPU fault
but no fault record yet, or that failed with no outcome of its own (a custom container that died silently at its MPS
limit), is decided only once the verdict arrives (the pod event re-triggers) or ``AGENT_VERDICT_SECONDS`` after the
pod finished (the resync timer re-triggers). The wait is measured from the pod's finish time, not from when the
operator saw it, so a restarted operator waits no longer and decides the same way. At the bound, a fault without a
record counts as a victim when the attempt's own error is ``cudaErrorMpsClientTerminated`` (810), else it is charged.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from gnnsched.attempts.fault_classes import ALONE_AFTER, may_requeue
from gnnsched.closed_loop import (
    MPS_CLIENT_TERMINATED,
    AttemptResult,
    FaultRecord,
    Outcome,
    ResizePolicy,
    classify_log,
    failed_request_bytes,
    is_mps_victim_text,
    next_reservation,
)
from gnnsched.contract import (
    ANN_ADMITTED_AT,
    ANN_ATTEMPT_RESULT,
    ANN_FAULT,
    ANN_FINISHED_AT,
    ANN_GPU,
    ANN_OBSERVED_PEAK_BYTES,
    ANN_STOPPED,
    JOB_CONTAINER_NAME,
)

from .status import last_json_object, parse_time

UNKNOWN_CAP = 2**62
"""The cap a resize uses while no GPUNode reports a healthy GPU."""
SUSPECT_EXCLUSIVE_AFTER = ALONE_AFTER
"""A job suspected this many times of a fatal MPS fault runs its later attempts alone on a GPU
(``gnnsched.attempts.fault_classes.fault_step``)."""
UNDECIDED_FAULTS_EXCLUSIVE_AFTER = ALONE_AFTER
"""A job requeued this many times as a victim of an MPS fault while its own error was a fatal fault too (not 810: the
suspect could not be told apart) runs its later attempts alone on a GPU, where a fault of its own is charged."""
AGENT_VERDICT_SECONDS = 30.0
"""How long after a gated pod finished the operator waits for the node agent's verdict on it (fault record, attempt
result). The agent waits up to 30 s for the container status and annotates right after it, so its verdict lands
within seconds of the finish time; the bound only matters when the agent is down."""


class AttemptFacts(BaseModel):
    """How one failed attempt ended, as far as its pod says."""

    outcome: Outcome | None = None
    result: AttemptResult | None = None
    fault: FaultRecord | None = None
    needed_bytes: int | None = None
    """What the attempt showed it needs at least (held + the failed request), when it said."""
    observed_peak_bytes: int | None = None
    detail: str = ""
    awaits: Literal["fault", "attempt-result"] | None = None
    """The node agent's verdict this attempt still lacks: a fault record for a GPU fault, or any outcome for a gated
    container that failed without saying how (``verdict_wait_seconds`` bounds the wait)."""
    finished_at: datetime | None = None
    gpu: str | None = None
    victim_of_810: bool = False
    """The attempt's own error is ``cudaErrorMpsClientTerminated``: the MPS server ended it for another's fault."""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _terminated(pod: dict[str, Any]) -> dict[str, Any]:
    """The job container's ``state.terminated``, found by name (an injected sidecar may come first)."""
    statuses = _dict(pod.get("status")).get("containerStatuses")
    if not isinstance(statuses, list):
        return {}
    container = next((_dict(c) for c in statuses if _dict(c).get("name") == JOB_CONTAINER_NAME), {})
    return _dict(_dict(container.get("state")).get("terminated"))


def attempt_facts(pod: Any) -> AttemptFacts:
    """The outcome of a finished attempt from its pod: the worker's result line in the termination message, else the
    node agent's ``gnnsched.io/attempt-result`` annotation (a custom container's gate keeper dies with its PID 1, so
    the agent writes the outcome it classified from the log tail or from NVML usage at the MPS limit), else
    ``classify_log`` on the message (kubelet's log tail with ``FallbackToLogsOnError``), plus the agent's fault
    record and NVML peak. Never raises."""
    pod = _dict(pod)
    annotations = _dict(_dict(pod.get("metadata")).get("annotations"))
    facts = AttemptFacts()
    raw_fault = annotations.get(ANN_FAULT)
    if isinstance(raw_fault, str) and raw_fault:
        try:
            facts.fault = FaultRecord.model_validate(json.loads(raw_fault))
        except (ValueError, ValidationError):
            facts.fault = None  # a malformed record is ignored: the attempt is judged by its own failure
    try:
        peak = int(str(annotations.get(ANN_OBSERVED_PEAK_BYTES, "")).strip())
        facts.observed_peak_bytes = peak if peak >= 0 else None
    except ValueError:
        pass
    terminated = _terminated(pod)
    message = terminated.get("message") or _dict(pod.get("status")).get("message") or ""
    message = message if isinstance(message, str) else ""
    line = last_json_object(message)
    if line is not None and "outcome" in line:
        try:
            facts.result = AttemptResult.model_validate(line)
        except ValidationError:
            facts.result = None
    raw_result = annotations.get(ANN_ATTEMPT_RESULT)
    stopped = bool(annotations.get(ANN_STOPPED))  # the agent stopped it (node_agent.overrun): its verdict, no resize
    if stopped:
        facts.result = None
    elif facts.result is None and isinstance(raw_result, str) and raw_result:
        try:
            facts.result = AttemptResult.model_validate(json.loads(raw_result))
        except (ValueError, ValidationError):
            facts.result = None  # a malformed annotation is ignored, like a malformed fault record
    if facts.result is not None:
        facts.outcome = facts.result.outcome
        facts.needed_bytes = facts.result.needed_bytes()
        if facts.observed_peak_bytes is None:
            facts.observed_peak_bytes = facts.result.observed_peak_bytes
    elif terminated.get("reason") != "OOMKilled" and not stopped:
        # The kubelet's OOMKilled is the container's host-memory cgroup, not the GPU: never a GPU resize.
        facts.outcome = classify_log(message)
        if facts.outcome == "memory-exceeded":
            request = failed_request_bytes(message)
            # What NVML saw the process hold at the limit, plus the request that failed (custom containers).
            if request is not None and facts.observed_peak_bytes is not None:
                facts.needed_bytes = facts.observed_peak_bytes + request
    code = terminated.get("exitCode")
    own_text = message + "\n" + ((facts.result.message or "") if facts.result is not None else "")
    facts.victim_of_810 = code == MPS_CLIENT_TERMINATED or is_mps_victim_text(own_text)
    facts.finished_at = parse_time(annotations.get(ANN_FINISHED_AT)) or parse_time(terminated.get("finishedAt"))
    gpu = annotations.get(ANN_GPU)
    facts.gpu = gpu if isinstance(gpu, str) and gpu else None
    gated = facts.gpu is not None or bool(annotations.get(ANN_ADMITTED_AT))
    failed = isinstance(code, int) and code != 0 and terminated.get("reason") != "OOMKilled"
    if facts.outcome == "fault" and facts.fault is None:
        facts.awaits = "fault"
    elif gated and failed and not stopped and facts.outcome is None and facts.result is None and facts.fault is None:
        facts.awaits = "attempt-result"
    if facts.outcome == "memory-exceeded":
        facts.detail = "out of GPU memory within its reservation" + (
            f" (needed at least {facts.needed_bytes} bytes)" if facts.needed_bytes is not None else "")
    return facts


def verdict_wait_seconds(facts: AttemptFacts, now: datetime) -> float:
    """Seconds left to wait for the node agent's verdict on a failed attempt; 0 means decide now.

    Measured from the pod's finish time (a pod without one is decided at once), so the answer depends only on the
    pod and the clock: a restarted operator neither waits again from zero nor forgets that it was waiting."""
    if facts.awaits is None or facts.finished_at is None:
        return 0.0
    return max(0.0, AGENT_VERDICT_SECONDS - (now - facts.finished_at).total_seconds())


def settle_without_verdict(facts: AttemptFacts) -> AttemptFacts:
    """The facts to decide on once the wait is over and the agent said nothing: a GPU fault whose own error is 810
    is a victim of another client (the MPS server ended it), so it gets a victim record; anything else is judged by
    its own failure (a fault that is not 810 is charged, as a suspect would be)."""
    if facts.awaits != "fault" or not facts.victim_of_810 or facts.finished_at is None:
        return facts
    record = FaultRecord(gpu=facts.gpu or "unknown", role="victim", reason="MpsClientTerminated",
                         at=facts.finished_at)
    return facts.model_copy(update={"fault": record, "awaits": None})


DecisionKind = Literal["requeue", "resize", "exceeds-largest", "resizes-exhausted", "charge"]


class Decision(BaseModel):
    kind: DecisionKind
    new_admit_bytes: int | None = None
    suspect: bool = False
    message: str = ""


def decide(facts: AttemptFacts, *, admit_bytes: int, resizes: int, max_resizes: int, requeues: int,
           largest_gpu_bytes: int | None, policy: ResizePolicy | None = None) -> Decision:
    """The next step for a failed attempt (rules in the module docstring)."""
    policy = policy or ResizePolicy()
    if facts.fault is not None and facts.fault.role == "victim" and may_requeue(requeues):
        if facts.fault.klass() == "hardware":
            return Decision(kind="requeue", message=f"GPU {facts.fault.gpu} failed (hardware fault, Xid "
                                                    f"{facts.fault.xid}): no job is charged for it")
        return Decision(kind="requeue", message=f"a co-located client's fatal fault on GPU {facts.fault.gpu} "
                                                f"({facts.fault.reason}) ended this attempt")
    suspect = facts.fault is not None and facts.fault.role == "suspect"
    if facts.outcome == "memory-exceeded" and not suspect:
        # No GPU reported: nothing can be concluded about the cap (as in planning); the extender keeps the pod
        # pending until a GPU that can hold it appears.
        cap = largest_gpu_bytes if largest_gpu_bytes is not None and largest_gpu_bytes > 0 else UNKNOWN_CAP
        new = next_reservation(admit_bytes, facts.needed_bytes, cap, policy)
        if new is None:
            need = f"needed at least {facts.needed_bytes} bytes" if facts.needed_bytes is not None else \
                f"already reserved {admit_bytes} bytes"
            return Decision(kind="exceeds-largest",
                            message=f"the attempt ran out of GPU memory and {need}; the largest GPU in the "
                                    f"cluster has {largest_gpu_bytes} bytes usable")
        if resizes >= max_resizes:
            return Decision(kind="resizes-exhausted",
                            message=f"the attempt ran out of its {admit_bytes}-byte GPU memory reservation and "
                                    f"spec.memory.maxResizes ({max_resizes}) resizes are used up")
        return Decision(kind="resize", new_admit_bytes=new,
                        message=f"out of GPU memory at {admit_bytes} bytes; next attempt reserves {new} bytes")
    return Decision(kind="charge", suspect=suspect)
