"""The operator's few calls to the Kubernetes API, as raw JSON dicts, through the official ``kubernetes`` client.

Why a wrapper: handlers must tell "already exists" (409, adopt it) and "gone" (404, nothing to do) from transient
failures (5xx, 429, connection refused: retry later) without each handler parsing ``ApiException``; and the same
kubeconfig/in-cluster credentials must serve both this client and kopf's watcher (``connection_info``).
Objects are returned as the server sent them (dicts), never as generated model classes, so a partial or unexpected
object reaches the handlers' own validation instead of failing inside the client's deserialiser.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

from gnnsched.contract import GNNCALIBRATION_PLURAL, GNNJOB_PLURAL, GPUNODE_PLURAL, GROUP, VERSION

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
TOKEN_REFRESH_PERIOD = datetime.timedelta(minutes=1)  # the kubernetes client's own re-read period


REQUEST_TIMEOUT = (10.0, 60.0)
"""Connect and read timeouts of every API call but the watches (which set their own): a connection the API server
never answers would otherwise hold a handler's thread, and the job it works on, forever; a timeout is a
``KubeError`` with status 0 (``transient``), which the handlers retry like any unreachable API server."""


class KubeError(Exception):
    """An API call failed; ``status`` is the HTTP status (0 when the server could not be reached)."""

    def __init__(self, status: int, message: str, details: dict[str, Any] | None = None) -> None:
        self.status = status
        self.message = message
        self.details = details or {}  # the Status body's ``details`` (``causes`` with ``field`` for a 422)
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

        kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT)
        try:
            response = fn(*args, _preload_content=False, **kwargs)
        except self._exception as exc:
            raise KubeError(int(exc.status or 0), _reason(exc), _details(exc)) from None
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

    def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> dict[str, Any]:
        """A JSON patch of a pod; a ``test`` op on ``/metadata/resourceVersion`` makes it conditional (the API server
        answers 422 when the pod changed since it was read, e.g. the scheduler bound it)."""
        return self._call(self._core.patch_namespaced_pod, name, namespace, ops, _content_type=JSON_PATCH)

    def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        data = self._call(self._core.list_namespaced_pod, namespace, label_selector=label_selector)
        return [item for item in data.get("items") or [] if isinstance(item, dict)]

    def list_pods_page(self, namespace: str | None, label_selector: str) -> dict[str, Any]:
        """One LIST of pods (a namespace's, or every namespace's when ``namespace`` is None) filtered by
        ``label_selector`` on the server; the raw ``PodList`` with its ``metadata.resourceVersion``."""
        if namespace is None:
            return self._call(self._core.list_pod_for_all_namespaces, label_selector=label_selector)
        return self._call(self._core.list_namespaced_pod, namespace, label_selector=label_selector)

    def watch_pods(self, namespace: str | None, label_selector: str, resource_version: str | None,
                   timeout_seconds: int, on_open: Any = None) -> Iterator[dict[str, Any]]:
        """Watch events (``{"type", "object"}`` dicts) of the pods ``label_selector`` selects, filtered on the server.

        The server ends the stream after ``timeout_seconds``; the client gives up reading 30 s after that (a stalled
        connection). ``on_open(response)`` receives the open response so that another thread can close it to stop
        the watch at once. Raises ``KubeError`` as the other calls do.
        """
        import urllib3

        kwargs: dict[str, Any] = dict(label_selector=label_selector, watch=True, allow_watch_bookmarks=True,
                                      timeout_seconds=timeout_seconds, _preload_content=False,
                                      _request_timeout=(10, timeout_seconds + 30))
        if resource_version:
            kwargs["resource_version"] = resource_version
        response: Any
        try:
            if namespace is None:
                response = self._core.list_pod_for_all_namespaces(**kwargs)
            else:
                response = self._core.list_namespaced_pod(namespace, **kwargs)
        except self._exception as exc:
            raise KubeError(int(exc.status or 0), _reason(exc), _details(exc)) from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeError(0, f"cannot reach the API server: {exc}") from None
        if on_open is not None:
            on_open(response)
        buffer = b""
        try:
            for chunk in response.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    event = _json_object(line)
                    if event is not None:
                        yield event
            event = _json_object(buffer)
            if event is not None:
                yield event
        except (urllib3.exceptions.HTTPError, OSError, ValueError, AttributeError) as exc:
            # A closed or reset stream (including our own close on stop): the caller re-watches or stops.
            raise KubeError(0, f"watch stream ended: {exc}") from None
        finally:
            response.release_conn()

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

    def create_pvc(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._call(self._core.create_namespaced_persistent_volume_claim, namespace, body)

    def read_pvc(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._call(self._core.read_namespaced_persistent_volume_claim, name, namespace)
        except KubeError as exc:
            if exc.status == 404:
                return None
            raise

    def post_event(self, target: dict[str, Any], type_: str, reason: str, message: str) -> dict[str, Any]:
        """A ``core/v1`` Event about ``target`` (apiVersion, kind, metadata name/namespace/uid), as kopf posts them,
        for code that runs outside kopf's handler context."""
        meta = target.get("metadata") or {}
        now = datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        namespace = str(meta.get("namespace") or "default")
        body = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name') or 'gnnjob'}.", "namespace": namespace},
            "involvedObject": {"apiVersion": target.get("apiVersion"), "kind": target.get("kind"),
                               "name": meta.get("name"), "namespace": namespace, "uid": meta.get("uid")},
            "reason": reason[:128], "message": message, "type": type_,
            "source": {"component": "gnnsched-operator"}, "reportingComponent": "gnnsched-operator",
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        return self._call(self._core.create_namespaced_event, namespace, body)

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


def _details(exc: Any) -> dict[str, Any]:
    """The ``details`` of the API server's ``Status`` body (a 422 lists the rejected fields in ``causes``)."""
    try:
        body = json.loads(exc.body or b"{}")
    except (ValueError, TypeError):
        return {}
    details = body.get("details") if isinstance(body, dict) else None
    return details if isinstance(details, dict) else {}


def _json_object(line: bytes) -> dict[str, Any] | None:
    line = line.strip()
    if not line:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def connection_info(configuration: Any) -> Any:
    """kopf's credentials from the same client configuration, so the watcher and the handlers see one cluster.

    Rotating service-account tokens: kubelet rewrites the projected token file before the old token expires (it
    rotates at 80 % of the token's lifetime, an hour by default). The ``kubernetes`` client's in-cluster loader
    installs ``refresh_api_key_hook``, which re-reads the file at most a minute after the last read, on every call of
    this process's own client. kopf keeps its own copy, so the hook is run here and the credentials are given an
    ``expiration`` one refresh period ahead: kopf's vault then drops them and calls the login handler again (it does
    the same at once on a 401), which reads the current file.
    """
    import kopf

    expiration = None
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook(configuration)
        expiration = datetime.datetime.now(tz=datetime.timezone.utc) + TOKEN_REFRESH_PERIOD
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
        expiration=expiration,
    )
