"""The GNN runtime model in use, kept in a ConfigMap: its wire format, shared by the writer (the retrain CronJob,
``gnnsched predictor train --model-configmap``) and the reader (the operator, which reloads it without a restart).

Why a ConfigMap and not a volume: two different programs on different nodes write and read it, and the API server is
the one store both already reach with their service accounts; a volume would need a ReadWriteMany storage class that
many clusters lack. A trained model is about 100-300 KB of JSON, well inside a ConfigMap's 1 MiB. The operator reads
the object through the API (a GET every ``--predictor-reload-seconds``), not as a mounted file, because a mounted
ConfigMap reaches the pod only after the kubelet's sync period and cache TTL (up to a minute or more), and never when
mounted with ``subPath`` (https://kubernetes.io/docs/concepts/configuration/configmap/#mounted-configmaps-are-updated-automatically).

Layout: ``data["model.json"]`` is the model file exactly as ``GNNRuntimePredictor.save`` writes it; the annotation
``gnnsched.io/last-retrain`` is the last run's ``RetrainOutcome`` as JSON, written by every run, whatever it decided.
No ``model.json`` key means "no retrained model yet": the reader uses the model shipped in the package.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import ValidationError

from gnnsched.predictor.gnn import GNNRuntimePredictor
from gnnsched.predictor.retrain import RetrainOutcome

MODEL_KEY = "model.json"
RETRAIN_ANNOTATION = "gnnsched.io/last-retrain"
#: "The data stored in a ConfigMap cannot exceed 1 MiB" (https://kubernetes.io/docs/concepts/configuration/configmap/).
CONFIGMAP_LIMIT_BYTES = 1024 * 1024


def model_text(model: GNNRuntimePredictor) -> str:
    """The model as ``save`` writes it; ``ValueError`` when it would not fit a ConfigMap."""
    text = json.dumps(model.to_dict(), separators=(",", ":"), sort_keys=True) + "\n"
    size = len(text.encode("utf-8"))
    if size > CONFIGMAP_LIMIT_BYTES - 4096:  # room for the object's metadata
        raise ValueError(f"the model is {size} bytes; a ConfigMap holds at most {CONFIGMAP_LIMIT_BYTES} "
                         "(fewer trees: --params '{\"n_estimators\": ...}')")
    return text


def digest(text: str) -> str:
    """The content hash the reader compares to decide whether to reload (sha256, first 16 hex digits)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def stored_model_text(configmap: dict[str, Any] | None) -> str | None:
    """The ConfigMap's model JSON, ``None`` when the object or its key is absent."""
    data = (configmap or {}).get("data")
    text = data.get(MODEL_KEY) if isinstance(data, dict) else None
    return text if isinstance(text, str) and text.strip() else None


def parse_model(text: str, origin: str) -> GNNRuntimePredictor:
    """A stored model, or ``ValueError`` naming ``origin`` (the ConfigMap) and the problem."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{origin}: {MODEL_KEY} is not JSON: {exc.msg} at line {exc.lineno}") from None
    return GNNRuntimePredictor.from_dict(data, f"{origin}: {MODEL_KEY}")


def last_retrain(configmap: dict[str, Any] | None) -> RetrainOutcome | None:
    """The last run's outcome from the annotation, ``None`` when absent or not a valid record."""
    annotations = ((configmap or {}).get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(RETRAIN_ANNOTATION) if isinstance(annotations, dict) else None
    if not isinstance(raw, str):
        return None
    try:
        return RetrainOutcome.model_validate_json(raw)
    except ValidationError:
        return None


def store_patch(outcome: RetrainOutcome, model: GNNRuntimePredictor | None) -> dict[str, Any]:
    """The merge patch a run writes: always the outcome; the model only when one was adopted (a rejected or skipped
    run leaves the model in use untouched)."""
    patch: dict[str, Any] = {"metadata": {"annotations": {RETRAIN_ANNOTATION: outcome.model_dump_json()}}}
    if model is not None:
        patch["data"] = {MODEL_KEY: model_text(model)}
    return patch


class StoreError(Exception):
    """The ConfigMap could not be read or written; the message says which and what the API server answered."""


class ModelConfigMap:
    """The writer's access to the ConfigMap (the CronJob's service account may get and patch this one object)."""

    def __init__(self, namespace: str, name: str, kubeconfig: str | None = None, context: str | None = None) -> None:
        import kubernetes

        from gnnsched.kubeclient import load_client_configuration

        self.namespace, self.name = namespace, name
        configuration = load_client_configuration(kubeconfig, context)
        # No urllib3 retries: each retry logs a WARNING, so an unreachable API server gave several lines instead of the
        # one error line, and the CronJob's next run is the retry that matters.
        configuration.retries = False
        self._client = kubernetes.client.ApiClient(configuration)
        self._core = kubernetes.client.CoreV1Api(self._client)
        self._exception = kubernetes.client.ApiException

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        import urllib3

        try:
            response = fn(*args, _preload_content=False, **kwargs)
        except self._exception as exc:
            if exc.status == 404 and what == "read":
                return None
            raise StoreError(f"cannot {what} configmap {self.namespace}/{self.name}: {exc.status} {exc.reason}"
                             + (" (it changed since it was read; the next run retries)" if exc.status == 409 else
                                "")) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise StoreError(f"cannot reach the API server: {exc}") from None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:
            raise StoreError("the API server answered with something that is not JSON") from None
        return data if isinstance(data, dict) else {}

    def read(self) -> dict[str, Any] | None:
        """The ConfigMap, ``None`` when it does not exist."""
        return self._call("read", self._core.read_namespaced_config_map, self.name, self.namespace)

    def write(self, patch: dict[str, Any], read: dict[str, Any] | None) -> None:
        """Apply ``patch`` on the condition that the object is still the version ``read`` (its resourceVersion in the
        merge patch: 409 otherwise), or create the object when ``read`` is ``None``."""
        if read is None:
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": self.name, "namespace": self.namespace, **patch["metadata"]},
                    **({"data": patch["data"]} if "data" in patch else {})}
            self._call("create", self._core.create_namespaced_config_map, self.namespace, body)
            return
        version = (read.get("metadata") or {}).get("resourceVersion")
        guarded = {**patch, "metadata": {**patch["metadata"], **({"resourceVersion": version} if version else {})}}
        self._call("patch", self._core.patch_namespaced_config_map, self.name, self.namespace, guarded,
                   _content_type="application/merge-patch+json")

    def close(self) -> None:
        self._client.close()
