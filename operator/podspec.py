"""The objects the operator creates for a GNNJob: one pod per attempt and one ConfigMap holding the job's manifest.

Why deterministic names (``<job>-<attempt>``, ``<job>-spec``): the API server's 409 on create is then the proof that
a previous incarnation of the operator already created the object, so a killed-and-restarted operator adopts it
instead of making a second pod. Why a ConfigMap for the spec: the worker runs ``gnnsched worker /etc/gnnsched/job.yaml``
on exactly the manifest the user applied (the same file format as the CLI), and the ConfigMap is owned by the job, so
it is garbage-collected with it.

Why the gate wraps the command: the node agent admits the process onto a GPU only while the group's predicted peaks
fit; a user's own command is wrapped the same way. The gate client (and an entrypoint job's step runner) is copied
from gnnsched's image by an init container into a volume the job's container mounts read-only
(``operator/gpu_pod_tools.py``), so a user's image needs no gnnsched, and a ``gnnsched`` on its ``PATH`` is never
the gate (``gpu_pod_tools`` says what the copy cannot stop).

How the worker's measurement flows back: the operator sets ``GNNSCHED_RESULT_FILE=/dev/termination-log``
(``contract.ENV_RESULT_FILE``), the container's termination-message path; the worker writes its final JSON result
line there (``observed_peak_bytes``, ``seconds``, ``steps``) as well as to stdout. With ``terminationMessagePolicy:
FallbackToLogsOnError`` the kubelet puts that file (or, on an error exit with an empty file, the log's tail) into
the container status; the operator takes the last line that parses as a JSON object; the agent's
``gnnsched.io/observed-peak-bytes`` annotation, when
present, wins (it is measured on the GPU by NVML, the worker's number by the framework).

Why every pod looks the same to the node (``JobPodSettings``): an MPS control daemon serves one Linux user at a time
(clients of a second UID wait until the first user's server exits), so every job pod runs as the one configured UID
(``runAsUser``, default 65532), whatever its image says. The same security context satisfies the Pod Security
``restricted`` profile (https://kubernetes.io/docs/concepts/security/pod-security-standards/): ``runAsNonRoot``,
``seccompProfile: RuntimeDefault`` at pod and container level, no privilege escalation, every capability dropped, and
only configMap, emptyDir and downwardAPI volumes (the device plugin's ``Allocate`` adds the MPS pipe directory,
``/dev/shm`` and the gate socket at container creation, outside the pod spec). The GPU itself comes from the
RuntimeClass (``nvidia`` by default) or the device plugin's CDI devices; the tolerations and nodeSelector let the pod
land on tainted GPU node pools. A job's own tolerations and nodeSelector are added to the operator's; a job may narrow
where it runs, never contradict the administrator's selector.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Collection
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gnnsched.attempts.fault_classes import format_fault_peers
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_ATTEMPT,
    ANN_EXCLUSIVE,
    ANN_FAULT_PEERS,
    ANN_INTENSITY,
    ANN_JOB,
    ANN_PMC_BYTES,
    ANN_PREDICTED_RUNTIME,
    ANN_PRESTART,
    ANN_PROBATION_STEP,
    ANN_PROBATION_SUSPECT,
    ANN_QOS_TARGET,
    API_VERSION,
    DEFAULT_JOB_RUNTIME_CLASS,
    DEFAULT_JOBS_UID,
    ENV_CPU_REQUEST,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_RESULT_FILE,
    GNNJOB_KIND,
    GPU_SHARE_RESOURCE,
    GPU_TAINT_KEY,
    JOB_CONTAINER_NAME,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    SCHEDULER_NAME,
)
from gnnsched.errors import FieldError
from gnnsched.quantity import parse_bytes
from gnnsched.spec import DNS_SUBDOMAIN, GNNJobSpec, NodeSelector, SpecError, Toleration

from .gpu_pod_tools import add_gpu_pod_tools, gpu_pod_command, uses_prestart
from .planning import Plan

SPEC_DIR = "/etc/gnnsched"
SPEC_FILE = "job.yaml"
CONTAINER_NAME = JOB_CONTAINER_NAME
LABEL_ATTEMPT = "gnnsched.io/attempt"
TERMINATION_LOG = "/dev/termination-log"
MAX_NAME = 253
MAX_LABEL = 63
DEFAULT_MEMORY_LIMIT_FACTOR = 2.0
"""A job container's memory limit is this multiple of its right-sized memory request (``--memory-limit-factor``,
chart ``jobs.memoryLimitFactor``; 0: no limit). Why a limit: without one a pod may take the node's memory, and the
pages it writes to the MPS ``/dev/shm`` tmpfs are charged to its cgroup, so the limit also bounds what one tenant's
pod puts there (issue 39). Why twice: the request is an estimate, not a measurement: its floor
(``gnnsched.host_footprint``) has a measured loading-peak factor (2.3 on Cora against the 2.5 allowed) but an
unverified 1 GiB CUDA allowance, and knows nothing of a custom entrypoint's own host memory; a limit at the request
would turn every under-estimate into an OOMKilled attempt. The limit is there to bound a tenant, not to size a job."""


def default_tolerations() -> list[Toleration]:
    """Tolerate the ``nvidia.com/gpu`` taint that GPU node pools carry (any value, effect NoSchedule)."""
    return [Toleration(key=GPU_TAINT_KEY, operator="Exists", effect="NoSchedule")]


class JobPodSettings(BaseModel):
    """What the administrator sets for every job pod (operator flags, chart values ``jobs.*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_as_user: int = Field(default=DEFAULT_JOBS_UID, ge=1, le=2**31 - 1)  # restricted forbids 0
    runtime_class_name: str = Field(default=DEFAULT_JOB_RUNTIME_CLASS, max_length=253)  # "" = none
    tolerations: list[Toleration] = Field(default_factory=default_tolerations)
    node_selector: NodeSelector = Field(default_factory=dict)
    # The job container's memory limit as a multiple of its right-sized memory request (0: no limit). See
    # DEFAULT_MEMORY_LIMIT_FACTOR for the default's reason.
    memory_limit_factor: float = Field(default=DEFAULT_MEMORY_LIMIT_FACTOR, ge=0, le=100)

    @field_validator("memory_limit_factor")
    @classmethod
    def _limit_factor(cls, value: float) -> float:
        if 0 < value < 1:
            raise ValueError(f"{value} would put the limit below the request (0 = no limit, else >= 1)")
        return value

    def memory_limit(self, request: str | None) -> str | None:
        """The container's memory limit for the memory request ``request`` (a quantity), None for none."""
        if request is None or not self.memory_limit_factor:
            return None
        return str(math.ceil(parse_bytes(request) * self.memory_limit_factor))

    @field_validator("runtime_class_name")
    @classmethod
    def _runtime_class(cls, value: str) -> str:
        if value and not re.match(DNS_SUBDOMAIN, value):
            raise ValueError(f"{value!r} is not a RuntimeClass name (lower-case DNS subdomain)")
        return value

    def tolerations_for(self, spec: GNNJobSpec) -> list[dict[str, Any]]:
        """The operator's tolerations, then the job's (duplicates dropped, order kept)."""
        result: list[dict[str, Any]] = []
        for toleration in [*self.tolerations, *(spec.tolerations or [])]:
            wire = toleration.wire()
            if wire not in result:
                result.append(wire)
        return result

    def node_selector_for(self, spec: GNNJobSpec) -> dict[str, str]:
        """The operator's nodeSelector plus the job's; a job may add labels but not contradict the operator's.

        Raises ``SpecError`` on a contradiction: no node could carry both values, so the pod could never be scheduled.
        """
        merged = dict(self.node_selector)
        for key, value in (spec.node_selector or {}).items():
            if key in merged and merged[key] != value:
                raise SpecError(f"spec.nodeSelector.{key}", f"is {value!r}, but the operator requires "
                                f"{key}={merged[key]!r} on every job pod (--node-selector / jobs.nodeSelector)")
            merged[key] = value
        return merged

    def pod_security_context(self) -> dict[str, Any]:
        return {
            "runAsNonRoot": True,
            "runAsUser": self.run_as_user,
            "runAsGroup": self.run_as_user,
            "seccompProfile": {"type": "RuntimeDefault"},
        }

    def container_security_context(self) -> dict[str, Any]:
        """Repeated at container level: ``restricted`` accepts either level, and a container-level setting cannot be
        undone by a mutating webhook that edits only the pod's."""
        return {
            "runAsNonRoot": True,
            "runAsUser": self.run_as_user,
            "runAsGroup": self.run_as_user,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        }


def job_pod_settings(run_as_user: int = DEFAULT_JOBS_UID, runtime_class_name: str = DEFAULT_JOB_RUNTIME_CLASS,
                     tolerations_json: str | None = None, node_selector_json: str | None = None,
                     memory_limit_factor: float = DEFAULT_MEMORY_LIMIT_FACTOR) -> JobPodSettings:
    """``JobPodSettings`` from the operator's flags (JSON for the list and the map, as the chart passes them).

    Raises ``FieldError`` naming the flag and the problem, for a one-line CLI error."""
    import json

    from pydantic import ValidationError

    fields: dict[str, Any] = {"run_as_user": run_as_user, "runtime_class_name": runtime_class_name or "",
                              "memory_limit_factor": memory_limit_factor}
    for flag, key, text, kind in (("--tolerations", "tolerations", tolerations_json, list),
                                  ("--node-selector", "node_selector", node_selector_json, dict)):
        if text is None or not text.strip():
            continue
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise FieldError(flag, f"not JSON: {exc}") from None
        if value is None:
            value = kind()
        if not isinstance(value, kind):
            raise FieldError(flag, f"must be a JSON {'list' if kind is list else 'object'}")
        fields[key] = value
    try:
        return JobPodSettings(**fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(part) for part in err["loc"]]
        flag = {"run_as_user": "--run-as-user", "runtime_class_name": "--runtime-class-name",
                "tolerations": "--tolerations", "node_selector": "--node-selector",
                "memory_limit_factor": "--memory-limit-factor"}.get(loc[0], loc[0]) if loc else ""
        where = "".join(f"[{p}]" if p.isdigit() else f".{p}" for p in loc[1:])
        message = str(err["msg"]).removeprefix("Value error, ")
        raise FieldError(flag + where, message) from None


def _shorten(name: str, limit: int) -> str:
    """``name`` if it fits, else a prefix plus a stable hash (deterministic across operator restarts)."""
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:10]
    return f"{name[: limit - 11].rstrip('-.')}-{digest}"


def pod_name(job_name: str, attempt: int) -> str:
    suffix = f"-{attempt}"
    return _shorten(job_name, MAX_NAME - len(suffix)) + suffix


def config_map_name(job_name: str) -> str:
    return _shorten(job_name, MAX_NAME - 5) + "-spec"


def job_label(job_name: str) -> str:
    """Label values are at most 63 characters; the full name is in the ``gnnsched.io/job`` annotation."""
    return _shorten(job_name, MAX_LABEL)


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": API_VERSION,
        "kind": GNNJOB_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def owned_metadata(job: dict[str, Any], name: str, labels: dict[str, str] | None = None,
                   annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The metadata of an object the job owns: its namespace, the labels the operator's pod watch and cleanup select
    by, the job's key annotation and the owner reference (garbage-collected with the job)."""
    meta = job["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": {LABEL_MANAGED_BY: MANAGED_BY_VALUE, LABEL_JOB_NAME: job_label(meta["name"]), **(labels or {})},
        "annotations": {ANN_JOB: f"{meta['namespace']}/{meta['name']}", **(annotations or {})},
        "ownerReferences": [owner_reference(job)],
    }


def build_config_map(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    manifest = {
        "apiVersion": API_VERSION,
        "kind": GNNJOB_KIND,
        "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
        "spec": job["spec"],
    }
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": owned_metadata(job, config_map_name(meta["name"])),
        "data": {SPEC_FILE: yaml.safe_dump(manifest, sort_keys=False)},
    }


WORKER_DEVICES = ("cuda", "cpu")


def container_command(spec: GNNJobSpec, worker_device: str = "cuda", prestart: bool = False) -> list[str]:
    """The gate copied from gnnsched's image, then the workload: the user's command when given, the portable step
    runner for an entrypoint job, else the worker (``operator/gpu_pod_tools.py``).

    ``worker_device``: where the built-in worker runs its model, ``cuda`` on GPU nodes; ``cpu`` for clusters whose
    nodes have no CUDA device behind the (fake) GPUs the agents manage, such as the local cluster of ``tests/e2e``.
    The gate still admits the job's predicted GPU bytes either way.

    ``prestart``: the built-in worker runs behind ``gate --prestart``, so its imports, graph load and model build
    overlap its wait at the gate (it reads its admission before it touches the GPU). A user's command never does: it
    may not know the hand-off, and would then run with no GPU visible."""
    return gpu_pod_command(spec, f"{SPEC_DIR}/{SPEC_FILE}", worker_device, prestart)


def build_pod(job: dict[str, Any], spec: GNNJobSpec, plan: Plan, attempt: int, image: str,
              scheduler_name: str = SCHEDULER_NAME, priority_class_name: str | None = None,
              settings: JobPodSettings | None = None, worker_device: str = "cuda",
              worker_prestart: bool = False, fault_peers: Collection[str] = (),
              probation_step: int | None = None, probation_suspect: bool = False) -> dict[str, Any]:
    """The pod for one attempt. ``image`` is the operator's default worker image unless the spec names one.
    ``priority_class_name``: the class the handler chose (the user's, or the runtime bucket's); None sets none.
    ``settings``: UID, RuntimeClass, tolerations and nodeSelector (``JobPodSettings()`` defaults when None).
    ``worker_device``, ``worker_prestart``: see ``container_command``.
    ``fault_peers``: the jobs this attempt may not share a GPU with (``ANN_FAULT_PEERS``, the gate's apart rule).
    ``probation_step``: the step of its last undecided or suspect fault (``ANN_PROBATION_STEP``: alone until it
    passes it); ``probation_suspect``: that fault was its own as the suspect (``ANN_PROBATION_SUSPECT``: alone even
    when no GPU is idle).
    Raises ``SpecError`` when the job's nodeSelector contradicts the operator's."""
    settings = settings if settings is not None else JobPodSettings()
    node_selector = settings.node_selector_for(spec)
    meta = job["metadata"]
    requests: dict[str, str] = {GPU_SHARE_RESOURCE: "1"}
    limits: dict[str, str] = {GPU_SHARE_RESOURCE: "1"}  # extended resources: limit must equal request
    if plan.scaled_cpu is not None:
        requests["cpu"] = plan.scaled_cpu
    if plan.scaled_memory is not None:
        requests["memory"] = plan.scaled_memory
    memory_limit = settings.memory_limit(plan.scaled_memory)
    if memory_limit is not None:  # bounds what one tenant's pod takes of the node, /dev/shm pages included
        limits["memory"] = memory_limit
    annotations = {
        ANN_JOB: f"{meta['namespace']}/{meta['name']}",
        ANN_ADMIT_BYTES: str(plan.admit_bytes),
        ANN_PMC_BYTES: str(plan.pmc_bytes),
    }
    annotations[ANN_ATTEMPT] = str(attempt + 1)  # 1-based: resizes and requeues count as attempts too
    if plan.exclusive:
        annotations[ANN_EXCLUSIVE] = "true"
    if fault_peers:
        annotations[ANN_FAULT_PEERS] = format_fault_peers(fault_peers)
    if probation_step is not None:
        annotations[ANN_PROBATION_STEP] = str(probation_step)
        if probation_suspect:
            annotations[ANN_PROBATION_SUSPECT] = "true"
    if plan.predicted_runtime_seconds is not None:
        annotations[ANN_PREDICTED_RUNTIME] = f"{plan.predicted_runtime_seconds:.3f}"
    if plan.intensity is not None:
        annotations[ANN_INTENSITY] = plan.intensity
    if spec.mode == "infer" and spec.qos_target_seconds is not None:  # the gate's share rule keeps it
        annotations[ANN_QOS_TARGET] = repr(float(spec.qos_target_seconds))
    command = container_command(spec, worker_device, worker_prestart)
    if uses_prestart(spec, worker_prestart):  # container_command's rule: the built-in worker only
        annotations[ANN_PRESTART] = "true"  # the gate's spread rule: its start-up runs while it waits, not after
    env = [
        {"name": ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_RESULT_FILE, "value": TERMINATION_LOG},
        # The worker sizes torch's thread pool by this (torch alone would use every core of the node).
        {"name": ENV_CPU_REQUEST, "valueFrom": {"resourceFieldRef": {
            "containerName": CONTAINER_NAME, "resource": "requests.cpu", "divisor": "1"}}},
    ]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(meta["name"], attempt),
            "namespace": meta["namespace"],
            "labels": {
                LABEL_MANAGED_BY: MANAGED_BY_VALUE,
                LABEL_JOB_NAME: job_label(meta["name"]),
                LABEL_ATTEMPT: str(attempt),
            },
            "annotations": annotations,
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "schedulerName": scheduler_name,
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": CONTAINER_NAME,
                    "image": spec.image or image,
                    "command": command,
                    "env": env,
                    "resources": {"requests": requests, "limits": limits},
                    "terminationMessagePath": TERMINATION_LOG,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": settings.container_security_context(),
                    "volumeMounts": [{"name": "job-spec", "mountPath": SPEC_DIR, "readOnly": True}],
                }
            ],
            "volumes": [{"name": "job-spec", "configMap": {"name": config_map_name(meta["name"])}}],
            "securityContext": settings.pod_security_context(),
            # The workload never talks to the API server; no token in the container is one secret less to leak.
            "automountServiceAccountToken": False,
            "tolerations": settings.tolerations_for(spec),
        },
    }
    add_gpu_pod_tools(pod["spec"], pod["spec"]["containers"][0], image, settings.container_security_context())
    if node_selector:
        pod["spec"]["nodeSelector"] = node_selector
    if settings.runtime_class_name:
        pod["spec"]["runtimeClassName"] = settings.runtime_class_name
    if priority_class_name is not None:
        # Only the name: the Priority admission plugin resolves it to spec.priority (a pod may not set that itself).
        pod["spec"]["priorityClassName"] = priority_class_name
    return pod
