"""What a pod says about its job: phase, placement, times, failure reason and the worker's measured peak.

Pure functions over raw pod dicts (no API calls), so every mapping is unit-testable and no partial or malformed pod
can raise: a missing field means "not known yet", never an exception.

Phase mapping (the job's ``status.phase`` while a pod exists):

=================  ===================================================================================
Estimated          the pod exists; the scheduler has not bound it
Unschedulable      the scheduler reported ``PodScheduled=False, reason=Unschedulable`` (message kept)
Scheduled          bound to a node (``spec.nodeName``); the container has not started
Queued             the container runs, but the node agent has not admitted it (it waits at the gate)
Running            the agent admitted it (``gnnsched.io/admitted-at`` or ``gnnsched.io/gpu``)
Succeeded/Failed   the pod's phase; a failed pod is retried while attempts <= ``backoffLimit``
=================  ===================================================================================
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from pydantic import BaseModel

from gnnsched.contract import (
    ANN_ADMITTED_AT,
    ANN_FINISHED_AT,
    ANN_GPU,
    ANN_GROUP,
    ANN_OBSERVED_PEAK_BYTES,
    ANN_STARTED_AT,
    ANN_STOPPED,
    JOB_CONTAINER_NAME,
)

TERMINAL = ("Succeeded", "Failed")


class PodView(BaseModel):
    """The facts the job's status is made of, read from one pod."""

    name: str = ""
    phase: str  # job phase derived from the pod
    node: str | None = None
    gpu: str | None = None
    group: str | None = None
    admitted_at: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    observed_peak_bytes: int | None = None
    observed_runtime_seconds: float | None = None
    failure_reason: str | None = None  # container reason: OOMKilled, Error, ContainerCannotRun, ...
    failure_message: str | None = None
    exit_code: int | None = None
    unschedulable_message: str | None = None
    prestart_fallback: str | None = None
    """Why the worker re-executed itself after its admission (``prestart_fallback`` of its result line): its
    prestarted process could not use the admitted GPU, so the start-up ran twice. Shown in the job's Complete
    condition and event; the job itself is unaffected."""


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _rfc3339(text: Any) -> str | None:
    parsed = parse_time(text)
    return None if parsed is None else parsed.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def last_json_object(text: Any) -> dict[str, Any] | None:
    """The last line of ``text`` that is a JSON object (the worker's result line), if any."""
    if not isinstance(text, str):
        return None
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return None


def _int(value: Any) -> int | None:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if number >= 0 else None


def observed_peak(result: dict[str, Any] | None) -> int | None:
    """The worker's measured peak from its result line (accepts camelCase or snake_case keys)."""
    if not result:
        return None
    for key in ("observedPeakBytes", "observed_peak_bytes", "peakBytes", "peak_bytes"):
        if key in result:
            return _int(result[key])
    return None


def measured_peak(pod: Any) -> int | None:
    """The pod's peak GPU memory as the node agent measured it (NVML, ``gnnsched.io/observed-peak-bytes``), the only
    peak the calibration records. Why not the worker's result line: it is the container's own termination message,
    which the tenant's code writes; after the chart's admission policy only gnnsched's service accounts may write a
    ``gnnsched.io/*`` annotation (issue 39). ``None`` when the agent measured none."""
    annotations = _dict(_dict(_dict(pod).get("metadata")).get("annotations"))
    return _int(annotations.get(ANN_OBSERVED_PEAK_BYTES)) if ANN_OBSERVED_PEAK_BYTES in annotations else None


def measured_runtime(pod: Any) -> float | None:
    """The attempt's runtime as the node agent and the kubelet saw it, the only runtime the calibration records:
    from the agent's started-at (else its admission, else the container's start in the kubelet's status) to the
    agent's finished-at (else the container's end); never the result line's own ``runtimeSeconds``."""
    pod = _dict(pod)
    annotations = _dict(_dict(pod.get("metadata")).get("annotations"))
    container = next((_dict(c) for c in _list(_dict(pod.get("status")).get("containerStatuses"))
                      if _dict(c).get("name") == JOB_CONTAINER_NAME), {})
    terminated = _dict(_dict(container.get("state")).get("terminated"))
    start = parse_time(_rfc3339(annotations.get(ANN_STARTED_AT))) or parse_time(
        _rfc3339(annotations.get(ANN_ADMITTED_AT))) or parse_time(_rfc3339(terminated.get("startedAt")))
    end = parse_time(_rfc3339(annotations.get(ANN_FINISHED_AT))) or parse_time(_rfc3339(terminated.get("finishedAt")))
    if start is None or end is None or end < start:
        return None
    return round((end - start).total_seconds(), 3)


def view_pod(pod: Any) -> PodView:
    """Derive the job-level facts from a pod, tolerating any missing or malformed field."""
    pod = _dict(pod)
    meta = _dict(pod.get("metadata"))
    spec = _dict(pod.get("spec"))
    status = _dict(pod.get("status"))
    annotations = {str(k): str(v) for k, v in _dict(meta.get("annotations")).items()}
    pod_phase = status.get("phase") if isinstance(status.get("phase"), str) else "Pending"
    # The job's container by name: an injected sidecar (service mesh, log shipper) may come first in the list.
    container = next((_dict(c) for c in _list(status.get("containerStatuses"))
                      if _dict(c).get("name") == JOB_CONTAINER_NAME), {})
    state = _dict(container.get("state"))
    running = _dict(state.get("running"))
    terminated = _dict(state.get("terminated"))
    node = spec.get("nodeName") if isinstance(spec.get("nodeName"), str) and spec.get("nodeName") else None
    admitted_at = _rfc3339(annotations.get(ANN_ADMITTED_AT))
    gpu = annotations.get(ANN_GPU) or None
    view = PodView(
        name=str(meta.get("name") or ""),
        phase="Estimated",
        node=node,
        gpu=gpu,
        group=annotations.get(ANN_GROUP) or None,
        admitted_at=admitted_at,
        started_at=_rfc3339(annotations.get(ANN_STARTED_AT)) or _rfc3339(running.get("startedAt"))
        or _rfc3339(terminated.get("startedAt")),
        finished_at=_rfc3339(annotations.get(ANN_FINISHED_AT)) or _rfc3339(terminated.get("finishedAt")),
    )
    result = last_json_object(terminated.get("message"))
    fallback = result.get("prestart_fallback") if result else None
    if isinstance(fallback, str) and fallback.strip():
        view.prestart_fallback = fallback.strip()[:300]
    view.observed_peak_bytes = (
        _int(annotations.get(ANN_OBSERVED_PEAK_BYTES))
        if ANN_OBSERVED_PEAK_BYTES in annotations
        else observed_peak(result)
    )
    # Runtime counts from when the workload ran: the agent's started-at, else its admission (the container's own
    # start includes the wait at the gate, which is queueing, not runtime).
    start = parse_time(_rfc3339(annotations.get(ANN_STARTED_AT))) or parse_time(view.admitted_at) \
        or parse_time(view.started_at)
    end = parse_time(view.finished_at)
    if start is not None and end is not None and end >= start:
        view.observed_runtime_seconds = round((end - start).total_seconds(), 3)
    if result and view.observed_runtime_seconds is None:
        for key in ("runtimeSeconds", "runtime_seconds", "seconds"):
            if isinstance(result.get(key), (int, float)) and result[key] >= 0:
                view.observed_runtime_seconds = float(result[key])
                break

    if pod_phase == "Succeeded":
        view.phase = "Succeeded"
    elif pod_phase == "Failed":
        view.phase = "Failed"
        view.failure_reason = str(terminated.get("reason") or status.get("reason") or "Error")
        code = terminated.get("exitCode")
        view.exit_code = code if isinstance(code, int) else None
        message = terminated.get("message") or status.get("message") or ""
        view.failure_message = str(message).strip()[-500:] if message else None
        stopped = _json_object(annotations.get(ANN_STOPPED))
        if isinstance(stopped.get("reason"), str) and stopped["reason"]:
            # the node agent stopped it (over its admitted GPU memory, or on another GPU): that is why it failed
            view.failure_reason = stopped["reason"][:64]
            view.failure_message = str(stopped.get("message") or "")[:500] or view.failure_message
        if not terminated:  # the job's container never ran: say which init container failed (gnnsched's install)
            _failed_init(status, view)
    elif node is None:
        for cond in _list(status.get("conditions")):
            cond = _dict(cond)
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" \
                    and cond.get("reason") == "Unschedulable":
                view.phase = "Unschedulable"
                view.unschedulable_message = str(cond.get("message") or "no node can run it")
    elif admitted_at or gpu:
        view.phase = "Running"
    elif running or pod_phase == "Running":
        view.phase = "Queued"
    else:
        view.phase = "Scheduled"
    return view


def _failed_init(status: dict[str, Any], view: PodView) -> None:
    """A pod whose init container failed (the copy of gnnsched's gate and runner, ``operator/gpu_pod_tools.py``): the
    failure is ``InstallFailed``, naming the container and its own reason, not the job's code."""
    for init in _list(status.get("initContainerStatuses")):
        done = _dict(_dict(_dict(init).get("state")).get("terminated"))
        if done.get("exitCode") not in (None, 0):
            view.failure_reason = "InstallFailed"
            detail = str(done.get("message") or "").strip()[-400:]
            view.failure_message = (f"init container {_dict(init).get('name')}: {done.get('reason') or 'Error'}"
                                    f"{': ' + detail if detail else ''}")
            return


def set_condition(
    conditions: Any, type_: str, status: str, reason: str, message: str, now: str, generation: int | None = None
) -> list[dict[str, Any]]:
    """Conditions with ``type_`` replaced; ``lastTransitionTime`` moves only when ``status`` changes."""
    result = [dict(c) for c in _list(conditions) if isinstance(c, dict) and c.get("type") != type_]
    previous = next((c for c in _list(conditions) if isinstance(c, dict) and c.get("type") == type_), None)
    transition = previous.get("lastTransitionTime") if previous and previous.get("status") == status else now
    condition: dict[str, Any] = {
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": transition or now,
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    result.append(condition)
    return result


def now_rfc3339() -> str:
    return datetime.now(tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _json_object(raw: str | None) -> dict[str, Any]:
    """A JSON object annotation, or {} when absent or malformed."""
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
