"""The operator's side of ``spec.checkpoint`` (``gnnsched.attempts.checkpointing``): the job's volume, its mount in
each attempt's pod, and what the job's status says of each attempt's checkpoint.

Why a volume the operator owns: an attempt may run on another node than the one before (a requeue goes wherever the
extender finds room), so the checkpoint must outlive the pod and be reachable from every GPU node. Without
``claimName`` the operator creates ``<job>-checkpoint`` from the chart's ``checkpoint.storageClass`` with
``checkpoint.accessMode`` (``ReadWriteMany`` by default: the attempts of one job never run at once, but they may run
on different nodes, which ``ReadWriteOnce`` volumes of most provisioners cannot follow), owned by the job, so the
garbage collector deletes it with the job. With ``claimName`` the user's claim is mounted as it is and never deleted.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gnnsched.attempts.checkpointing import (
    ENV_CHECKPOINT_DIR,
    ENV_CHECKPOINT_EVERY_S,
    MAX_EVERY_S,
    MIN_EVERY_S,
    MOUNT_PATH,
    VOLUME_NAME,
    CheckpointSpec,
    claim_for,
)
from gnnsched.closed_loop import AttemptResult
from gnnsched.spec import GNNJobSpec

from .podspec import CONTAINER_NAME, owner_reference

DEFAULT_EVERY_S = 10
"""The chart's ``checkpoint.everySeconds``, chosen from the simulator's sweep (docs/simulator.md, "Checkpoints")."""
MAX_ATTEMPT_RECORDS = 32


class CheckpointSettings(BaseModel):
    """The chart's ``checkpoint.*`` (operator flags ``--checkpoint-*``)."""

    model_config = ConfigDict(frozen=True)

    every_seconds: int = Field(default=DEFAULT_EVERY_S, ge=MIN_EVERY_S, le=MAX_EVERY_S)
    storage_class: str | None = Field(default=None, min_length=1, max_length=253)
    """None: the cluster's default StorageClass (the claim names none)."""
    size: str = "1Gi"
    access_mode: Literal["ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"] = "ReadWriteMany"


def checkpoint_settings(every_s: int, storage_class: str, size: str, access_mode: str) -> CheckpointSettings:
    """The operator's ``--checkpoint-*`` flags; a bad value is a ``FieldError`` naming its flag."""
    from gnnsched.errors import FieldError
    from gnnsched.quantity import parse_bytes

    try:
        positive = parse_bytes(size) > 0
    except ValueError as exc:
        raise FieldError("--checkpoint-size", str(exc)) from None
    if not positive:
        raise FieldError("--checkpoint-size", f"must be positive, got {size!r}")
    if access_mode not in ("ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"):
        raise FieldError("--checkpoint-access-mode",
                         f"{access_mode!r}: one of ReadWriteMany, ReadWriteOnce, ReadWriteOncePod")
    if not MIN_EVERY_S <= every_s <= MAX_EVERY_S:
        raise FieldError("--checkpoint-every-seconds", f"{every_s}: must be {MIN_EVERY_S}..{MAX_EVERY_S}")
    return CheckpointSettings(every_seconds=every_s, storage_class=storage_class or None, size=size,
                              access_mode=access_mode)


def every_seconds(spec: CheckpointSpec, settings: CheckpointSettings) -> int:
    return spec.every_seconds if spec.every_seconds is not None else settings.every_seconds


def claim(job: dict[str, Any], spec: CheckpointSpec, settings: CheckpointSettings) -> dict[str, Any] | None:
    """The PersistentVolumeClaim the operator creates for ``job``; None when the job names its own."""
    if spec.claim_name is not None:
        return None
    meta = job["metadata"]
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": claim_for(meta["name"], spec), "namespace": meta["namespace"],
                     "labels": {"app.kubernetes.io/managed-by": "gnnsched"},
                     "ownerReferences": [owner_reference(job)]},
        "spec": {"accessModes": [settings.access_mode], "resources": {"requests": {"storage": settings.size}}},
    }
    if settings.storage_class is not None:
        body["spec"]["storageClassName"] = settings.storage_class
    return body


def mount(pod: dict[str, Any], job_name: str, spec: GNNJobSpec, settings: CheckpointSettings) -> dict[str, Any]:
    """``pod`` with the job's checkpoint volume mounted at ``MOUNT_PATH`` in the job container and the contract's
    environment (``GNNSCHED_CHECKPOINT_DIR``, ``GNNSCHED_CHECKPOINT_EVERY_S``); unchanged for a job that does not
    checkpoint. The pod's grace period covers a save (a drain sends SIGTERM; the worker saves and exits)."""
    if spec.checkpoint is None:
        return pod
    pod_spec = pod["spec"]
    pod_spec.setdefault("volumes", []).append(
        {"name": VOLUME_NAME, "persistentVolumeClaim": {"claimName": claim_for(job_name, spec.checkpoint)}})
    for c in pod_spec["containers"]:
        if c.get("name") != CONTAINER_NAME:
            continue
        c.setdefault("volumeMounts", []).append({"name": VOLUME_NAME, "mountPath": MOUNT_PATH})
        c.setdefault("env", []).extend([
            {"name": ENV_CHECKPOINT_DIR, "value": MOUNT_PATH},
            {"name": ENV_CHECKPOINT_EVERY_S, "value": str(every_seconds(spec.checkpoint, settings))},
        ])
    return pod


def attempt_record(status: dict[str, Any], attempt: int, result: AttemptResult | None) -> dict[str, Any]:
    """The status fields for a finished attempt of a checkpointing job: ``resumedFromStep`` (this attempt's) and
    ``checkpointAttempts`` with its entry appended (the last :data:`MAX_ATTEMPT_RECORDS`). The figures are the
    worker's own (its result line): the step it resumed from, the last step it saved, and the seconds of steps since
    that save (0 for an attempt that succeeded: it lost nothing)."""
    if result is None or result.resumed_from_step is None:
        return {}
    entry: dict[str, Any] = {"attempt": attempt + 1, "resumedFromStep": result.resumed_from_step}
    if result.checkpoint_step is not None:
        entry["checkpointStep"] = result.checkpoint_step
    if result.lost_seconds is not None:
        entry["lostSeconds"] = round(result.lost_seconds, 3)
    history = [h for h in status.get("checkpointAttempts") or [] if isinstance(h, dict)
               and h.get("attempt") != attempt + 1]
    return {"resumedFromStep": result.resumed_from_step,
            "checkpointAttempts": (history + [entry])[-MAX_ATTEMPT_RECORDS:]}
