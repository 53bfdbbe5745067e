"""What the operator does when the API server refuses to create a job's pod (HTTP 403 or 422).

On a shared cluster a pod create is refused for reasons that come and go: a ResourceQuota that is full until other
pods finish (403 ``exceeded quota``), a LimitRange an administrator will edit (403 ``maximum cpu usage per
Container``, or 422 when its defaults make a request exceed a limit), a validating admission webhook or the Pod
Security admission plugin with the namespace's current labels (403), a webhook that is down. None of these is the
job's fault, and each can clear without the job changing, so the operator does what Kubernetes' own ReplicaSet and
Job controllers do with a refused create (``FailedCreate`` event, try again later): it retries with exponential
back-off (``create_backoff_seconds``, 5 s doubling to 5 min) and shows the refusal in the condition
``PodCreated=False`` (reason ``Forbidden`` or ``Invalid``, the API server's message) until a create succeeds.

Only a spec that can never be admitted fails the job: a 422 (the API server's validation) whose every rejected field
is one the pod takes verbatim from the GNNJob's spec (its ``image``, ``command`` or ``args``). Pods are immutable and
a running job's spec edits are not applied, so no retry can ever succeed: the job fails with reason
``PodSpecInvalid`` naming the field.
"""

from __future__ import annotations

import re

from .kube import KubeError

REFUSED = (403, 422)
BACKOFF_FIRST = 5.0
BACKOFF_MAX = 300.0
# Pod fields copied verbatim from the GNNJob's spec (podspec.build_pod: the gnn container, index 0).
_FROM_JOB_SPEC = re.compile(r"^spec\.containers\[0\]\.(image|command|args)(\[\d+\])?$")


class PodCreateRefused(KubeError):
    """The API server refused a pod create in a way that may clear later; the job's condition says why."""

    @property
    def transient(self) -> bool:
        return True


def create_backoff_seconds(retry: int) -> float:
    """Delay before the ``retry``-th retry of a refused create: 5 s, 10 s, 20 s ... capped at 5 min."""
    return min(BACKOFF_MAX, BACKOFF_FIRST * 2 ** max(0, min(retry, 16)))


def rejected_fields(exc: KubeError) -> list[str]:
    causes = exc.details.get("causes") if isinstance(exc.details, dict) else None
    return [str(c["field"]) for c in causes or [] if isinstance(c, dict) and c.get("field")]


def never_admissible(exc: KubeError) -> bool:
    """A 422 whose every rejected field comes from the job's own spec: no retry of this job can succeed."""
    fields = rejected_fields(exc)
    return exc.status == 422 and bool(fields) and all(_FROM_JOB_SPEC.match(f) for f in fields)


def job_field(pod_field: str) -> str:
    """The GNNJob field a pod field came from (``spec.containers[0].image`` -> ``spec.image``)."""
    match = _FROM_JOB_SPEC.match(pod_field)
    return f"spec.{match.group(1)}{match.group(2) or ''}" if match else pod_field


def refusal_reason(exc: KubeError) -> str:
    return "Forbidden" if exc.status == 403 else "Invalid"


def refusal_message(exc: KubeError, pod: str) -> str:
    return (f"creating pod {pod} was refused (HTTP {exc.status}): {exc.message}; retrying with back-off "
            f"({BACKOFF_FIRST:.0f} s doubling to {BACKOFF_MAX:.0f} s) until it is admitted")

