"""The probe pod of an entrypoint job: the user's model traced in the user's own image, before any GPU pod.

Why a pod: a user's code (``spec.model.entrypoint``) must never run in the operator, and only the user's image has it.
The pod runs the torch-only probe (``gnnsched/portable``), copied from gnnsched's image by an init container into an
``emptyDir``, with the user's image's own Python, torch and PyG (``docs/custom-models.md``).

What it may do, and why each limit:

* **No GPU.** It requests no GPU resource and runs under no RuntimeClass; the image's own
  ``NVIDIA_VISIBLE_DEVICES=all`` (set by NVIDIA's CUDA base images) is overridden with ``void``, which the NVIDIA
  container runtime reads as "no GPU" on nodes where it is the default runtime. The trace needs none: it runs on
  meta tensors and replays the caching allocator in Python.
* **Pod Security ``restricted``**: the job pods' own security context (non-root, one UID, no privilege escalation,
  every capability dropped, ``RuntimeDefault`` seccomp), only ``emptyDir`` volumes, no service-account token.
* **Bounded**: CPU and memory requests equal to their limits, ``activeDeadlineSeconds`` (the kubelet fails the pod
  with reason ``DeadlineExceeded``), and a size limit on the ``emptyDir``.
* **The job's namespace**, under the namespace's default service account as the job's own pods (a GNNJob names none).

The result comes back as the probe container's termination message (at most 4096 bytes, ``ProbeResult``), which the
operator reads from the pod's status; the pod is owned by the job, labelled as its pods are (so the operator's pod
watch sees it and the job's deletion removes it), and marked ``gnnsched.io/role: probe``.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from gnnsched.entrypoint_probe import LAUNCHER, ProbeError, ProbeRecord, cache_key, parse_probe_result
from gnnsched.spec import GNNJobSpec

from .podspec import MAX_NAME, TERMINATION_LOG, JobPodSettings, _shorten, owned_metadata

LABEL_ROLE = "gnnsched.io/role"
ROLE_PROBE = "probe"
ANN_PROBE_KEY = "gnnsched.io/probe-key"
PROBE_CONTAINER = "probe"
INSTALL_CONTAINER = "install-probe"
PROBE_DIR = "/gnnsched-probe"
PROBE_VOLUME = "gnnsched-probe"
INVALID_ENTRYPOINT = "InvalidEntrypoint"


class ProbeSettings(BaseModel):
    """The probe pod's bounds (``gnnsched operator --probe-*``, chart values ``operator.probe.*``).

    The defaults fit a PyTorch image: importing torch and torch-geometric takes about 0.5 GiB of memory and most of
    the probe's time; the trace itself works on meta tensors (no data) and takes well under a second on one core for
    the shapes the estimator benchmarks (``bench/estimate_latency.py``)."""

    model_config = ConfigDict(frozen=True)

    cpu: str = "1"
    memory: str = "2Gi"
    deadline_seconds: int = Field(default=600, ge=30)
    scratch: str = "64Mi"  # the emptyDir's sizeLimit: the probe's copy is about 200 KiB


def probe_settings(cpu: str, memory: str, deadline_seconds: int) -> ProbeSettings:
    """``ProbeSettings`` from the operator's flags; ``FieldError`` names the flag of a value Kubernetes would refuse."""
    from gnnsched.errors import FieldError
    from gnnsched.quantity import parse_bytes, parse_cpu

    for flag, value, parse in (("--probe-cpu", cpu, parse_cpu), ("--probe-memory", memory, parse_bytes)):
        try:
            positive = parse(value) > 0
        except ValueError as exc:
            raise FieldError(flag, str(exc)) from None
        if not positive:
            raise FieldError(flag, f"must be positive, got {value!r}")
    if deadline_seconds < 30:
        raise FieldError("--probe-deadline", f"{deadline_seconds} s is too short to import torch; at least 30")
    return ProbeSettings(cpu=cpu, memory=memory, deadline_seconds=deadline_seconds)


def probe_pod_name(job_name: str) -> str:
    suffix = "-probe"
    return _shorten(job_name, MAX_NAME - len(suffix)) + suffix


def is_probe_pod(pod: dict[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return isinstance(labels, dict) and labels.get(LABEL_ROLE) == ROLE_PROBE


def build_probe_pod(job: dict[str, Any], spec: GNNJobSpec, request: dict[str, Any], key: str, gnnsched_image: str,
                    settings: JobPodSettings, probe: ProbeSettings, scheduler_name: str) -> dict[str, Any]:
    """The probe pod of ``job``: an init container from ``gnnsched_image`` installs the probe into the shared
    ``emptyDir``; the probe container runs it in ``spec.image`` with ``request``."""
    if spec.image is None:
        raise ValueError("build_probe_pod: an entrypoint job names its image (extra_validation checks it)")
    meta = job["metadata"]
    bounds = {"cpu": probe.cpu, "memory": probe.memory}
    mount = [{"name": PROBE_VOLUME, "mountPath": PROBE_DIR}]
    no_gpu = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}, {"name": "CUDA_VISIBLE_DEVICES", "value": ""}]
    security = settings.container_security_context()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": owned_metadata(job, probe_pod_name(meta["name"]), labels={LABEL_ROLE: ROLE_PROBE},
                                   annotations={ANN_PROBE_KEY: key}),
        "spec": {
            # Any node will do (it uses no GPU); the profile that calls the extender schedules it like any pod that
            # requests no GPU share (kube-scheduler asks an extender only about pods with a resource it manages).
            "schedulerName": scheduler_name,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": probe.deadline_seconds,
            "automountServiceAccountToken": False,
            "securityContext": settings.pod_security_context(),
            "tolerations": settings.tolerations_for(spec),
            "initContainers": [{
                "name": INSTALL_CONTAINER,
                "image": gnnsched_image,
                "command": ["python", "-m", "gnnsched.entrypoint_probe", "--install", PROBE_DIR],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"cpu": "100m", "memory": "128Mi"}},
                "securityContext": security,
                "volumeMounts": mount,
            }],
            "containers": [{
                "name": PROBE_CONTAINER,
                "image": spec.image,
                "command": ["python", f"{PROBE_DIR}/{LAUNCHER}", "--request",
                            json.dumps(request, sort_keys=True, separators=(",", ":")), "--result", TERMINATION_LOG],
                "env": no_gpu,
                "resources": {"requests": dict(bounds), "limits": dict(bounds)},
                "terminationMessagePath": TERMINATION_LOG,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": security,
                "volumeMounts": [{**mount[0], "readOnly": True}],
            }],
            "volumes": [{"name": PROBE_VOLUME, "emptyDir": {"sizeLimit": probe.scratch}}],
        },
    }


def read_probe_pod(pod: dict[str, Any], key: str) -> ProbeRecord:
    """What the probe pod says so far: ``Running`` until it ends, then its result or why it failed."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    name = str(meta.get("name") or "")
    statuses = [s for s in status.get("containerStatuses") or [] if isinstance(s, dict)]
    probe = next((s for s in statuses if s.get("name") == PROBE_CONTAINER), {})
    terminated = (probe.get("state") or {}).get("terminated") or {}
    image_id = probe.get("imageID") or None
    phase = status.get("phase")
    if meta.get("deletionTimestamp") and phase not in ("Succeeded", "Failed"):
        return ProbeRecord(key=key, pod=name, state="Failed", reason="PodDeleted", cacheable=False,
                           error="the probe pod was deleted before it finished")
    if phase == "Succeeded":
        try:
            result = parse_probe_result(str(terminated.get("message") or ""))
        except ProbeError as exc:
            return ProbeRecord(key=key, pod=name, state="Failed", reason="ProbeError", error=str(exc),
                               image_id=image_id, cacheable=False)
        return ProbeRecord(key=key, pod=name, state="Succeeded", result=result, image_id=image_id)
    if phase != "Failed":
        return ProbeRecord(key=key, pod=name, state="Running")
    init = next((s for s in status.get("initContainerStatuses") or [] if isinstance(s, dict)
                 and ((s.get("state") or {}).get("terminated") or {}).get("exitCode") not in (None, 0)), None)
    if init is not None:  # gnnsched's own half failed: nothing of the user's to blame or to cache
        done = (init.get("state") or {}).get("terminated") or {}
        return ProbeRecord(key=key, pod=name, state="Failed", reason="InstallFailed", cacheable=False,
                           error=f"init container {init.get('name')}: {done.get('reason') or 'Error'} "
                                 f"{str(done.get('message') or '').strip()[-1500:]}".strip())
    message = str(terminated.get("message") or "")
    reason = str(terminated.get("reason") or status.get("reason") or "Error")
    if reason in ("OOMKilled", "DeadlineExceeded") or status.get("reason") == "DeadlineExceeded":
        why = "DeadlineExceeded" if "DeadlineExceeded" in (reason, status.get("reason")) else reason
        detail = {"DeadlineExceeded": "the probe did not finish within its deadline (operator --probe-deadline)",
                  "OOMKilled": "the probe exceeded its memory limit (operator --probe-memory)"}[why]
        return ProbeRecord(key=key, pod=name, state="Failed", reason=why, error=detail, image_id=image_id,
                           cacheable=False)
    try:
        parse_probe_result(message)
        error, cacheable = f"the probe exited {terminated.get('exitCode')} after writing a result", False
    except ProbeError as exc:
        if exc.field is not None:  # the spec is wrong (no such module or function, no module returned)
            return ProbeRecord(key=key, pod=name, state="Failed", reason=INVALID_ENTRYPOINT, error=str(exc),
                               image_id=image_id)
        error = str(exc)
        # the probe's own error report (its JSON) is the user's code failing on data-less tensors: deterministic
        cacheable = message.lstrip().startswith("{")
    return ProbeRecord(key=key, pod=name, state="Failed", reason="ProbeError", error=error, image_id=image_id,
                       cacheable=cacheable)


class ProbeCache:
    """Finished probes by namespace and ``cache_key``, bounded and thread-safe, owned by one operator. A re-submitted
    job (same namespace, image, entrypoint and spec fields the probe depends on) skips its probe pod. In memory: a
    restarted operator probes again (one CPU pod per distinct entrypoint spec).

    Why the namespace (issue 39, item 7): a probe's result sizes the job's GPU reservation, and the code it traced is
    whatever the image held when that namespace's probe pod pulled it. Keyed by the image string alone, one
    namespace's probe of a tag sized another namespace's job of the same tag, built from another push or another
    registry credential. So an entry serves only its own namespace, under the image as the job names it and, once the
    probe pod ran, also under the image ID its container status reports (the resolved digest), which a job that pins
    that digest then hits."""

    def __init__(self, size: int = 1024) -> None:
        self._size = size
        self._items: OrderedDict[tuple[str, str], ProbeRecord] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, namespace: str, key: str) -> ProbeRecord | None:
        with self._lock:
            record = self._items.get((namespace, key))
            if record is not None:
                self._items.move_to_end((namespace, key))
            return record

    def put(self, namespace: str, record: ProbeRecord, request: dict[str, Any] | None = None) -> None:
        """Keep ``record`` for ``namespace`` under its key and, with the probe's ``request`` and the image ID the
        pod ran, under that resolved image's key too."""
        if record.state == "Running" or not record.cacheable:
            return
        keys = [record.key]
        if request is not None and record.image_id and "@sha256:" in record.image_id:
            keys.append(cache_key(record.image_id.split("://")[-1], request))
        with self._lock:
            for key in keys:
                self._items[(namespace, key)] = record
                self._items.move_to_end((namespace, key))
            while len(self._items) > self._size:
                self._items.popitem(last=False)
