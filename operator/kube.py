"""The operator's few calls to the Kubernetes API, as raw JSON dicts, through the official ``kubernetes`` client.

Why a wrapper: handlers must tell "already exists" (409, adopt it) and "gone" (404, nothing to do) from transient
failures (5xx, 429, connection refused: retry later) without each handler parsing ``ApiException``; and the same
kubeconfig/in-cluster credentials must serve both this client and kopf's watcher (``connection_info``).
Objects are returned as the server sent them (dicts), never as generated model classes, so a partial or unexpected
object reaches the handlers' own validation instead of failing inside the client's deserialiser.
"""

from __future__ import annotations

import json
from typing import Any

from gnnsched.contract import GNNCALIBRATION_PLURAL, GNNJOB_PLURAL, GPUNODE_PLURAL, GROUP, VERSION

MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        super().__init__(f"HTTP {status}: {message}" if status else message)

    @property
    def transient(self) -> bool:
        """Worth retrying later: the server was unreachable, overloaded or failed internally."""
        return self.status == 0 or self.status == 429 or self.status >= 500


class Kube:
    """Synchronous API access for kopf's threaded (sync) handlers; one ``ApiClient`` and its connection pool."""

    def __init__(self, configuration: Any, pool_size: int = 16) -> None:
        import kubernetes

        configuration.connection_pool_maxsize = pool_size
        self.configuration = configuration
        self._api = kubernetes.client.ApiClient(configuration)
        self._core = kubernetes.client.CoreV1Api(self._api)
        self._custom = kubernetes.client.CustomObjectsApi(self._api)
        self._scheduling = kubernetes.client.SchedulingV1Api(self._api)
        self._exception = kubernetes.client.ApiException

    def close(self) -> None:
        self._api.close()

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        import urllib3

        try:
            response = fn(*args, _preload_content=False, **kwargs)
        except self._exception as exc:
            raise KubeError(int(exc.status or 0), _reason(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"cannot reach the API server: {exc}") from None
        try:
            data = json.loads(response.data or b"{}")
        except ValueError:
            raise KubeError(502, "the API server answered with something that is not JSON") from None
        return data if isinstance(data, dict) else {}

    # --- pods and config maps (the job's children) ---

    def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._core.create_namespaced_pod, namespace, body)

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._core.read_namespaced_pod, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def delete_pod(self, namespace: str, name: str) -> bool:
        """Delete; ``False`` when it was already gone."""
        try:
            self._call(self._core.delete_namespaced_pod, name, namespace)
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        data = self._call(self._core.list_namespaced_pod, namespace, label_selector=label_selector)
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def create_config_map(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._core.create_namespaced_config_map, namespace, body)

    def read_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._core.read_namespaced_config_map, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def delete_config_map(self, namespace: str, name: str) -> bool:
        try:
            self._call(self._core.delete_namespaced_config_map, name, namespace)
            return True
        except KubeError as exc:
            if exc.status == 404:
                return False
            raise

    # --- GNNJobs and GPUNodes ---

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._custom.get_namespaced_custom_object, GROUP, VERSION, namespace, GNNJOB_PLURAL, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_jobs(self, namespace: str | None = None) -> list[dict[str, Any]]:
        if namespace is None:
            data = self._call(self._custom.list_cluster_custom_object, GROUP, VERSION, GNNJOB_PLURAL)
        else:
            data = self._call(self._custom.list_namespaced_custom_object, GROUP, VERSION, namespace, GNNJOB_PLURAL)
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def patch_job_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patch ``status`` (the status subresource); ``None`` when the job is gone."""
        try:
            return self._call(
                self._custom.patch_namespaced_custom_object_status,
                GROUP, VERSION, namespace, GNNJOB_PLURAL, name, {"status": status},
                _content_type=MERGE_PATCH,
            )
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def read_priority_class(self, name: str) -> dict[str, Any] | None:
        """A PriorityClass (cluster-scoped, ``scheduling.k8s.io/v1``); ``None`` when it does not exist."""
        try:
            return self._call(self._scheduling.read_priority_class, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def list_gpunodes(self) -> list[dict[str, Any]]:
        data = self._call(self._custom.list_cluster_custom_object, GROUP, VERSION, GPUNODE_PLURAL)
        return [item for item in data.get("items") or [] if isinstance(item, dict)]


    # --- the cluster's calibration object (GNNCalibration, cluster-scoped) ---

    def read_calibration(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._custom.get_cluster_custom_object, GROUP, VERSION, GNNCALIBRATION_PLURAL, name)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def create_calibration(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._custom.create_cluster_custom_object, GROUP, VERSION, GNNCALIBRATION_PLURAL, body)

    def patch_calibration(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the object; a ``metadata.resourceVersion`` in ``patch`` makes it conditional (409 when the
        object changed since it was read), which is how concurrent recorders avoid losing each other's ratios."""
        return self._call(self._custom.patch_cluster_custom_object, GROUP, VERSION, GNNCALIBRATION_PLURAL, name,
                          patch, _content_type=MERGE_PATCH)


def _reason(exc: Any) -> str:
    """The API server's own message from a ``Status`` body, else the HTTP reason."""
    try:
        body = json.loads(exc.body or b"{}")
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])[:500]
    except (ValueError, TypeError):
        pass
    return str(exc.reason or "error")


def connection_info(configuration: Any) -> Any:
    """kopf's credentials from the same client configuration, so the watcher and the handlers see one cluster."""
    import kopf

    token = None
    auth = (configuration.api_key or {}).get("authorization") or (configuration.api_key or {}).get("BearerToken")
    if auth:
        scheme, _, value = str(auth).partition(" ")
        token = value if value else scheme
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        token=token,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
        default_namespace=None,
    )
