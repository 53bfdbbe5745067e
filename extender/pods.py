"""What the extender needs to know about a pod, read from its annotations and container requests.

A pod made by the operator carries ``gnnsched.io/admit-bytes`` (what the gate will reserve on one GPU),
``gnnsched.io/predicted-runtime-seconds`` and usually ``gnnsched.io/intensity``. A pod made by someone else may
declare ``gnnsched.io/gpu-memory`` (a quantity) and is placed as a generic GPU-sharing pod. A pod with neither
is refused with an error that names both annotations: guessing its memory would defeat the memory-safety gate.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from gnnsched.attempts.fault_classes import apart_identity
from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_EXCLUSIVE,
    ANN_FAULT_PEERS,
    ANN_GPU_MEMORY,
    ANN_INTENSITY,
    ANN_PREDICTED_RUNTIME,
    MAX_FAULT_PEERS,
    gnnjob_owner,
)
from gnnsched.errors import FieldError
from gnnsched.quantity import QuantityError, parse_bytes, parse_quantity

log = logging.getLogger("gnnsched.extender")

#: Largest per-GPU demand accepted at all (1 PiB): anything above is a unit mistake, not a job.
MAX_GPU_BYTES = 2**50
#: Longest predicted runtime accepted (one year), for the same reason.
MAX_RUNTIME_SECONDS = 365 * 86400.0
#: Runtime assumed for a pod with no ``predicted-runtime-seconds`` (generic pods): the reference against which
#: its wait is weighed in the score. Documented in the README; it only scales the wait term.
DEFAULT_RUNTIME_SECONDS = 600.0


class PodError(FieldError):
    """A pod the extender cannot place; ``field`` names the offending part of the request."""


@dataclass(frozen=True, slots=True)
class PodDemand:
    """One pod's demand: GPU bytes on one GPU, predicted solo runtime, intensity class, CPU and memory."""

    uid: str
    namespace: str
    name: str
    gpu_bytes: int
    runtime_seconds: float
    runtime_known: bool
    intensity: str | None
    cpu_millis: int
    memory_bytes: int
    exclusive: bool = False  # runs alone on a whole GPU (ANN_EXCLUSIVE); see ``whole_gpu``
    job: str | None = None  # its GNNJob (the apart rule's identity); None unless a GNNJob owns the pod
    apart: frozenset[str] = frozenset()  # ANN_FAULT_PEERS: the jobs it may not share a GPU with (GNNJob pods only)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, dict) else None


def _sum_requests(containers: Any, field: str) -> tuple[int, int]:
    cpu = 0
    mem = 0
    if containers is None:
        return 0, 0
    if not isinstance(containers, list):
        raise PodError(field, "must be a list of containers")
    for i, c in enumerate(containers):
        requests = _get(_get(c, "resources"), "requests")
        if requests is None:
            continue
        if not isinstance(requests, dict):
            raise PodError(f"{field}[{i}].resources.requests", "must be a map of quantities")
        try:
            if "cpu" in requests:
                cpu += math.ceil(parse_quantity(requests["cpu"]) * 1000)
            if "memory" in requests:
                mem += parse_bytes(requests["memory"])
        except (QuantityError, ValueError, ArithmeticError) as exc:
            raise PodError(f"{field}[{i}].resources.requests", str(exc)) from None
    if cpu < 0 or mem < 0:
        raise PodError(f"{field}.resources.requests", "negative request")
    return cpu, mem


def pod_resources(pod: dict) -> tuple[int, int]:
    """Effective CPU (millicores) and memory (bytes) request: the larger of the containers' sum and the
    largest init container, as the Kubernetes scheduler computes it."""
    spec = _get(pod, "spec")
    cpu, mem = _sum_requests(_get(spec, "containers"), "Pod.spec.containers")
    init = _get(spec, "initContainers")
    if isinstance(init, list):
        for i, c in enumerate(init):
            icpu, imem = _sum_requests([c], f"Pod.spec.initContainers[{i}]")
            cpu, mem = max(cpu, icpu), max(mem, imem)
    return cpu, mem


def _parse_int_bytes(text: Any, key: str) -> int:
    field = f"Pod.metadata.annotations[{key}]"
    if not isinstance(text, str):
        raise PodError(field, "must be a string")
    try:
        value = parse_quantity(text.strip())
    except QuantityError as exc:
        raise PodError(field, str(exc)) from None
    if not value.is_finite() or value <= 0:
        raise PodError(field, f"{text!r} must be a positive number of bytes")
    if value > MAX_GPU_BYTES:
        raise PodError(field, f"{text!r} is more than 1 PiB on one GPU; check the unit")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def parse_pod(pod: Any) -> PodDemand:
    """Read a pod's demand; raises ``PodError`` naming the field on anything missing or absurd."""
    if not isinstance(pod, dict):
        raise PodError("Pod", "missing or not an object")
    meta = _get(pod, "metadata")
    if not isinstance(meta, dict):
        raise PodError("Pod.metadata", "missing or not an object")
    name = meta.get("name")
    namespace = meta.get("namespace") or "default"
    uid = meta.get("uid") or ""
    if not isinstance(name, str) or not name:
        raise PodError("Pod.metadata.name", "missing")
    if not isinstance(namespace, str) or not isinstance(uid, str):
        raise PodError("Pod.metadata", "namespace and uid must be strings")
    annotations = meta.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise PodError("Pod.metadata.annotations", "must be a map of strings")

    if ANN_ADMIT_BYTES in annotations:
        gpu_bytes = _parse_int_bytes(annotations[ANN_ADMIT_BYTES], ANN_ADMIT_BYTES)
    elif ANN_GPU_MEMORY in annotations:
        gpu_bytes = _parse_int_bytes(annotations[ANN_GPU_MEMORY], ANN_GPU_MEMORY)
    else:
        raise PodError(
            "Pod.metadata.annotations",
            f"pod {namespace}/{name} declares no GPU memory: it needs {ANN_ADMIT_BYTES} (set by the gnnsched "
            f"operator) or {ANN_GPU_MEMORY} (a quantity such as 8Gi, for pods not made by the operator)",
        )

    runtime_known = ANN_PREDICTED_RUNTIME in annotations
    runtime = DEFAULT_RUNTIME_SECONDS
    if runtime_known:
        field = f"Pod.metadata.annotations[{ANN_PREDICTED_RUNTIME}]"
        raw = annotations[ANN_PREDICTED_RUNTIME]
        try:
            runtime = float(raw)
        except (TypeError, ValueError):
            raise PodError(field, f"{raw!r} is not a number of seconds") from None
        if not math.isfinite(runtime) or runtime <= 0 or runtime > MAX_RUNTIME_SECONDS:
            raise PodError(field, f"{raw!r} must be a positive number of seconds up to one year")

    intensity = annotations.get(ANN_INTENSITY)
    if intensity is not None and intensity not in ("memory", "compute"):
        raise PodError(f"Pod.metadata.annotations[{ANN_INTENSITY}]", f"{intensity!r} must be 'memory' or 'compute'")

    raw_exclusive = annotations.get(ANN_EXCLUSIVE)
    if raw_exclusive is not None and raw_exclusive not in ("true", "false"):
        raise PodError(f"Pod.metadata.annotations[{ANN_EXCLUSIVE}]", f"{raw_exclusive!r} must be 'true' or 'false'")

    cpu, mem = pod_resources(pod)
    job, apart = pod_apart(meta, namespace, name)
    return PodDemand(
        uid=uid,
        namespace=namespace,
        name=name,
        gpu_bytes=gpu_bytes,
        runtime_seconds=runtime,
        runtime_known=runtime_known,
        intensity=intensity,
        cpu_millis=cpu,
        memory_bytes=mem,
        exclusive=raw_exclusive == "true",
        job=job,
        apart=apart,
    )


def pod_apart(meta: dict, namespace: str, name: str) -> tuple[str | None, frozenset[str]]:
    """The pod's side of the apart rule (``gnnsched.attempts.fault_classes.apart_identity``): its job and fault peers,
    only when a GNNJob owns it, as the node agent's gate reads them (the gate also checks that the GNNJob exists; the
    extender reads no GNNJobs, and the peers can only keep pods apart, never book memory). A malformed
    ``gnnsched.io/fault-peers`` never fails the request: what cannot be read is left out, with a log line."""
    owner = gnnjob_owner(meta)
    if owner is None:
        return None, frozenset()
    annotations = meta.get("annotations") or {}
    job, apart = apart_identity(annotations, f"{namespace}/{owner[0]}")
    raw = annotations.get(ANN_FAULT_PEERS)
    if raw is not None:
        entries = [e for e in raw.split(",") if e.strip()] if isinstance(raw, str) else None
        if entries is None or len(apart) < min(len(set(e.strip() for e in entries)), MAX_FAULT_PEERS):
            log.warning("pod %s/%s: %s=%r has entries that are not <namespace>/<name>; kept apart only from %s",
                        namespace, name, ANN_FAULT_PEERS, raw, sorted(apart) or "none")
    return job, apart


def whole_gpu(demand: PodDemand, largest_capacity: float) -> PodDemand:
    """An exclusive pod's demand as the cache must see it: the whole capacity of the cluster's largest GPU, so it fits
    only a GPU with nothing committed and books all of it (the node agent's gate does the same: it admits the pod
    only into an empty GPU, alone, with that capacity as its MPS limit). Its own admit bytes may exceed a GPU's
    shareable capacity: that is why it runs alone. Unchanged while no GPU is known, or for a shared pod."""
    if not demand.exclusive or largest_capacity <= 0:
        return demand
    return replace(demand, gpu_bytes=int(largest_capacity))
