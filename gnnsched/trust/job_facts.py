"""The facts the extender and the node agent place and admit a pod by, read from where a tenant cannot write them.

Why not the pod's annotations: anyone who can create a pod can write ``gnnsched.io/*`` annotations and a GNNJob
``ownerReference`` on it (the ownerReference is checked against nothing but a name and a uid that the tenant can read
from its own job). The security review (issue 39) reproduced a plain pod in another namespace with
``predicted-runtime-seconds: "0.001"`` admitted ahead of an earlier GNNJob pod under ``sqtf``. The GNNJob's
``status`` is a subresource: only principals with ``gnnjobs/status`` RBAC (the operator) can write it. So the
operator writes the current attempt's facts there (``status.podFacts``, :func:`facts_status`) in the same breath as
it creates the attempt's pod, and every consumer resolves a pod's facts with :func:`resolve` from the pod **and** its
GNNJob as read from the API server:

1. the pod's GNNJob ``ownerReference`` names the job it was given, by name **and** uid, in the same namespace;
2. the job's ``status.podFacts.pod`` names this pod (and, once recorded, ``podUid`` is this pod's uid).

Anything else is *untrusted* and :func:`resolve` returns ``None``. The consumer then treats the pod as a plain pod
with the most conservative defaults (see ``docs/security.md``): no predicted runtime (the gate's ``sqtf`` orders it
after every pod with one, the extender weighs it at the default runtime), no intensity, no QoS target, no fault peers
(it keeps nothing apart and nothing keeps it apart by name), and no ``admit-bytes`` credit: the node agent books a
plain pod at its declared ``gpu-memory`` (enforced by the MPS limit and the agent's NVML check) or a whole GPU. An
``exclusive`` annotation is still honoured on any pod: running alone only ever books more, never less.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gnnsched.attempts.fault_classes import parse_fault_peers
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_ATTEMPT,
    ANN_EXCLUSIVE,
    ANN_FAULT_PEERS,
    ANN_INTENSITY,
    ANN_JOB,
    ANN_PREDICTED_RUNTIME,
    ANN_PROBATION_STEP,
    ANN_PROBATION_SUSPECT,
    ANN_QOS_TARGET,
    MAX_FAULT_PEERS,
    gnnjob_owner,
)

STATUS_FIELD = "podFacts"
"""The GNNJob status field the operator writes the current attempt's facts into (``crds/gnnjob.yaml``)."""


class PodFacts(BaseModel):
    """The wire shape of ``GNNJob.status.podFacts``: what the operator planned the current attempt's pod with.

    Exactly the values it writes as that pod's annotations (which stay, for people and tools reading the pod); the
    annotations are no longer read by any decision."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    pod: str = Field(min_length=1, max_length=253)
    pod_uid: str | None = Field(default=None, alias="podUid", max_length=64)
    attempt: int = Field(default=1, ge=1)
    admit_bytes: int = Field(alias="admitBytes", gt=0, le=2**50)
    predicted_runtime_seconds: float | None = Field(default=None, alias="predictedRuntimeSeconds", gt=0,
                                                    le=365 * 86400.0)
    intensity: Literal["memory", "compute"] | None = None
    qos_target_seconds: float | None = Field(default=None, alias="qosTargetSeconds", gt=0, le=2_592_000)
    exclusive: bool = False
    fault_peers: list[str] = Field(default_factory=list, alias="faultPeers", max_length=MAX_FAULT_PEERS)
    probation_step: int | None = Field(default=None, alias="probationStep", ge=0)
    probation_suspect: bool = Field(default=False, alias="probationSuspect")

    @field_validator("predicted_runtime_seconds", "qos_target_seconds")
    @classmethod
    def _finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise ValueError("must be a finite number of seconds")
        return value


class JobFacts(BaseModel):
    """A pod's trusted facts: its job (``<namespace>/<name>``) and what the operator planned its attempt with."""

    model_config = ConfigDict(frozen=True)

    job: str
    attempt: int
    admit_bytes: int
    predicted_runtime_seconds: float | None
    intensity: Literal["memory", "compute"] | None
    qos_target_seconds: float | None
    exclusive: bool
    fault_peers: frozenset[str]
    probation_step: int | None = None
    probation_suspect: bool = False


class FactsError(ValueError):
    """The operator's own pod annotations cannot be turned into status facts (a bug, never a tenant's input)."""


def facts_status(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``status.podFacts`` for a pod the operator built (``operator.podspec.build_pod``) from that pod's annotations,
    so the status and the pod can never say different things. Keys without a value are left out."""
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    ann = meta.get("annotations") if isinstance(meta.get("annotations"), dict) else {}
    assert isinstance(ann, dict)
    out: dict[str, Any] = {"pod": meta.get("name")}
    if meta.get("uid"):
        out["podUid"] = meta["uid"]
    try:
        out["attempt"] = int(ann.get(ANN_ATTEMPT, "1"))
        out["admitBytes"] = int(ann[ANN_ADMIT_BYTES])
        if ANN_PREDICTED_RUNTIME in ann:
            out["predictedRuntimeSeconds"] = float(ann[ANN_PREDICTED_RUNTIME])
        if ANN_QOS_TARGET in ann:
            out["qosTargetSeconds"] = float(ann[ANN_QOS_TARGET])
        if ANN_PROBATION_STEP in ann:
            out["probationStep"] = int(ann[ANN_PROBATION_STEP])
            if ann.get(ANN_PROBATION_SUSPECT) == "true":
                out["probationSuspect"] = True
    except (KeyError, ValueError) as exc:
        raise FactsError(f"pod {meta.get('name')}: its annotations do not hold the planned facts: {exc}") from None
    if ann.get(ANN_INTENSITY) in ("memory", "compute"):
        out["intensity"] = ann[ANN_INTENSITY]
    out["exclusive"] = ann.get(ANN_EXCLUSIVE) == "true"
    peers = sorted(parse_fault_peers(ann.get(ANN_FAULT_PEERS)))
    if peers:
        out["faultPeers"] = peers
    try:
        PodFacts.model_validate(out)
    except ValidationError as exc:
        raise FactsError(f"pod {meta.get('name')}: status.{STATUS_FIELD}: {exc.errors()[0].get('msg')}") from None
    return out


def facts_patch(stored: Any, wanted: dict[str, Any]) -> dict[str, Any]:
    """``wanted`` as a JSON merge patch of the stored ``status.podFacts``: keys it drops are set to null, so a
    previous attempt's fault peers or QoS target do not survive into this attempt's facts."""
    gone = {key: None for key in stored if key not in wanted} if isinstance(stored, dict) else {}
    return {**gone, **wanted}


def with_annotations(stored: Any, annotations: Mapping[str, str | None]) -> dict[str, Any] | None:
    """The stored facts after the operator re-planned a waiting pod and patched these annotations on it (admit
    bytes, predicted runtime, exclusive); ``None`` when nothing was stored (nothing to follow)."""
    if not isinstance(stored, dict):
        return None
    out = dict(stored)
    if annotations.get(ANN_ADMIT_BYTES) is not None:
        out["admitBytes"] = int(str(annotations[ANN_ADMIT_BYTES]))
    if annotations.get(ANN_PREDICTED_RUNTIME) is not None:
        out["predictedRuntimeSeconds"] = float(str(annotations[ANN_PREDICTED_RUNTIME]))
    if ANN_EXCLUSIVE in annotations:
        out["exclusive"] = annotations[ANN_EXCLUSIVE] == "true"
    return out


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


Verdict = Literal["trusted", "no-job", "not-owner", "not-named", "malformed"]


def resolve_verbose(pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> tuple[JobFacts | None, Verdict]:
    """:func:`resolve`, with why a pod is untrusted (for logs and events)."""
    meta = _dict(pod.get("metadata"))
    owner = gnnjob_owner(meta)
    if owner is None or job is None:
        return None, "no-job"
    jmeta = _dict(job.get("metadata"))
    namespace = str(meta.get("namespace") or "default")
    if (str(jmeta.get("namespace") or "default") != namespace or jmeta.get("name") != owner[0]
            or not jmeta.get("uid") or jmeta.get("uid") != owner[1]):
        return None, "not-owner"
    raw = _dict(job.get("status")).get(STATUS_FIELD)
    if not isinstance(raw, dict):
        return None, "not-named"
    try:
        facts = PodFacts.model_validate(raw)
    except ValidationError:
        return None, "malformed"
    if facts.pod != meta.get("name") or (facts.pod_uid is not None and facts.pod_uid != meta.get("uid")):
        return None, "not-named"
    return JobFacts(
        job=f"{namespace}/{owner[0]}", attempt=facts.attempt, admit_bytes=facts.admit_bytes,
        predicted_runtime_seconds=facts.predicted_runtime_seconds, intensity=facts.intensity,
        qos_target_seconds=facts.qos_target_seconds, exclusive=facts.exclusive,
        fault_peers=parse_fault_peers(",".join(facts.fault_peers)), probation_step=facts.probation_step,
        probation_suspect=facts.probation_step is not None and facts.probation_suspect,
    ), "trusted"


def resolve(pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> JobFacts | None:
    """The trusted facts of ``pod`` given ``job``, the GNNJob its ownerReference names as read from the API server
    (``None`` when there is none or it could not be read); ``None``: untrusted (see the module docstring)."""
    return resolve_verbose(pod, job)[0]


def owner_name(pod: Mapping[str, Any]) -> str | None:
    """The name of the GNNJob the pod's ownerReference names (what a consumer fetches before :func:`resolve`)."""
    owner = gnnjob_owner(_dict(pod.get("metadata")))
    return owner[0] if owner is not None else None


FACT_ANNOTATIONS = (ANN_ADMIT_BYTES, ANN_PREDICTED_RUNTIME, ANN_INTENSITY, ANN_QOS_TARGET, ANN_FAULT_PEERS, ANN_JOB,
                    ANN_PROBATION_STEP, ANN_PROBATION_SUSPECT)
"""The pod annotations that state a trusted fact: :func:`trusted_view` sets them from the status, or drops them."""


def trusted_view(pod: Mapping[str, Any], job: Mapping[str, Any] | None) -> tuple[dict[str, Any], JobFacts | None]:
    """``pod`` as a consumer that parses annotations may read it, and its trusted facts: the fact annotations
    (:data:`FACT_ANNOTATIONS`, and ``exclusive`` of a trusted pod) say what the GNNJob's status says, whatever the
    pod itself carried; an untrusted pod loses them and its GNNJob ownerReferences (so no job identity), keeping only
    what it may declare about itself (``gpu-memory``, ``exclusive``). For a component whose parser reads annotations
    (the extender's :func:`extender.pods.parse_pod`): one boundary, and the parser stays the one that checks them."""
    facts = resolve(pod, job)
    meta = dict(_dict(pod.get("metadata")))
    ann = {str(k): v for k, v in _dict(meta.get("annotations")).items() if k not in FACT_ANNOTATIONS}
    if facts is None:
        refs = meta.get("ownerReferences")
        if isinstance(refs, list):
            meta["ownerReferences"] = [r for r in refs if gnnjob_owner({"ownerReferences": [r]}) is None]
    else:
        ann[ANN_JOB] = facts.job
        ann[ANN_ADMIT_BYTES] = str(facts.admit_bytes)
        if facts.predicted_runtime_seconds is not None:
            ann[ANN_PREDICTED_RUNTIME] = repr(facts.predicted_runtime_seconds)
        if facts.intensity is not None:
            ann[ANN_INTENSITY] = facts.intensity
        if facts.qos_target_seconds is not None:
            ann[ANN_QOS_TARGET] = repr(facts.qos_target_seconds)
        if facts.fault_peers:
            ann[ANN_FAULT_PEERS] = ",".join(sorted(facts.fault_peers))
        if facts.probation_step is not None:
            ann[ANN_PROBATION_STEP] = str(facts.probation_step)
        if facts.probation_suspect:
            ann[ANN_PROBATION_SUSPECT] = "true"
        if facts.exclusive:
            ann[ANN_EXCLUSIVE] = "true"
        else:
            ann.pop(ANN_EXCLUSIVE, None)
    meta["annotations"] = ann
    return {**pod, "metadata": meta}, facts
