"""The objects the operator creates for a GNNJob: one pod per attempt and one ConfigMap holding the job's manifest.

Why deterministic names (``<job>-<attempt>``, ``<job>-spec``): the API server's 409 on create is then the proof that
a previous incarnation of the operator already created the object, so a killed-and-restarted operator adopts it
instead of making a second pod. Why a ConfigMap for the spec: the worker runs ``gnnsched worker /etc/gnnsched/job.yaml``
on exactly the manifest the user applied (the same file format as the CLI), and the ConfigMap is owned by the job, so
it is garbage-collected with it.

Why the gate wraps the command: the node agent admits the process onto a GPU only while the group's predicted peaks
fit (``gnnsched gate -- ...``); a user's own command is wrapped the same way, so no pod bypasses the gate.

How the worker's measurement flows back: the operator sets ``GNNSCHED_RESULT_FILE=/dev/termination-log``
(``contract.ENV_RESULT_FILE``), the container's termination-message path; the worker writes its final JSON result
line there (``observed_peak_bytes``, ``seconds``, ``steps``) as well as to stdout. With ``terminationMessagePolicy:
FallbackToLogsOnError`` the kubelet puts that file (or, on an error exit with an empty file, the log's tail) into
the container status; the operator takes the last line that parses as a JSON object; the agent's ``gnnsched.io/observed-peak-bytes`` annotation, when
present, wins (it is measured on the GPU by NVML, the worker's number by the framework).
"""

from __future__ import annotations

import hashlib
from typing import Any

import yaml

from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_ATTEMPT,
    ANN_EXCLUSIVE,
    ANN_INTENSITY,
    ANN_JOB,
    ANN_PMC_BYTES,
    ANN_PREDICTED_RUNTIME,
    API_VERSION,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_RESULT_FILE,
    GNNJOB_KIND,
    GPU_SHARE_RESOURCE,
    LABEL_JOB_NAME,
    LABEL_MANAGED_BY,
    MANAGED_BY_VALUE,
    SCHEDULER_NAME,
)
from gnnsched.spec import GNNJobSpec

from .planning import Plan

SPEC_DIR = "/etc/gnnsched"
SPEC_FILE = "job.yaml"
CONTAINER_NAME = "gnn"
LABEL_ATTEMPT = "gnnsched.io/attempt"
TERMINATION_LOG = "/dev/termination-log"
MAX_NAME = 253
MAX_LABEL = 63


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
        "metadata": {
            "name": config_map_name(meta["name"]),
            "namespace": meta["namespace"],
            "labels": {LABEL_MANAGED_BY: MANAGED_BY_VALUE, LABEL_JOB_NAME: job_label(meta["name"])},
            "annotations": {ANN_JOB: f"{meta['namespace']}/{meta['name']}"},
            "ownerReferences": [owner_reference(job)],
        },
        "data": {SPEC_FILE: yaml.safe_dump(manifest, sort_keys=False)},
    }


def container_command(spec: GNNJobSpec) -> list[str]:
    """``gnnsched gate -- <workload>``: the workload is the user's command when given, else the worker."""
    if spec.command:
        workload = [*spec.command, *(spec.args or [])]
    else:
        workload = ["gnnsched", "worker", f"{SPEC_DIR}/{SPEC_FILE}", "--device", "cuda", "--no-progress",
                    *(spec.args or [])]
    return ["gnnsched", "gate", "--", *workload]


def build_pod(job: dict[str, Any], spec: GNNJobSpec, plan: Plan, attempt: int, image: str,
              scheduler_name: str = SCHEDULER_NAME, priority_class_name: str | None = None) -> dict[str, Any]:
    """The pod for one attempt. ``image`` is the operator's default worker image unless the spec names one.
    ``priority_class_name``: the class the handler chose (the user's, or the runtime bucket's); None sets none."""
    meta = job["metadata"]
    requests: dict[str, str] = {GPU_SHARE_RESOURCE: "1"}
    limits: dict[str, str] = {GPU_SHARE_RESOURCE: "1"}  # extended resources: limit must equal request
    if plan.scaled_cpu is not None:
        requests["cpu"] = plan.scaled_cpu
    if plan.scaled_memory is not None:
        requests["memory"] = plan.scaled_memory
    annotations = {
        ANN_JOB: f"{meta['namespace']}/{meta['name']}",
        ANN_ADMIT_BYTES: str(plan.admit_bytes),
        ANN_PMC_BYTES: str(plan.pmc_bytes),
    }
    annotations[ANN_ATTEMPT] = str(attempt + 1)  # 1-based: resizes and requeues count as attempts too
    if plan.exclusive:
        annotations[ANN_EXCLUSIVE] = "true"
    if plan.predicted_runtime_seconds is not None:
        annotations[ANN_PREDICTED_RUNTIME] = f"{plan.predicted_runtime_seconds:.3f}"
    if plan.intensity is not None:
        annotations[ANN_INTENSITY] = plan.intensity
    env = [
        {"name": ENV_POD_UID, "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": ENV_POD_NAME, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": ENV_POD_NAMESPACE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": ENV_RESULT_FILE, "value": TERMINATION_LOG},
    ]
    pod = {
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
                    "command": container_command(spec),
                    "env": env,
                    "resources": {"requests": requests, "limits": limits},
                    "terminationMessagePath": TERMINATION_LOG,
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [{"name": "job-spec", "mountPath": SPEC_DIR, "readOnly": True}],
                }
            ],
            "volumes": [{"name": "job-spec", "configMap": {"name": config_map_name(meta["name"])}}],
        },
    }
    if priority_class_name is not None:
        # Only the name: the Priority admission plugin resolves it to spec.priority (a pod may not set that itself).
        pod["spec"]["priorityClassName"] = priority_class_name
    return pod
