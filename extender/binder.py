"""Who carries out a bind: the Kubernetes API (in a cluster) or an in-memory pod store (``--fake-cluster``).

One call: the reservation annotation rides on the ``Binding``'s own metadata. kube-apiserver's binding subresource
(``BindingREST.Create`` -> ``setPodHostAndAnnotations`` in ``pkg/registry/core/pod/storage/storage.go``) sets
``spec.nodeName``, merges the Binding's annotations into the pod's and sets ``PodScheduled``, all in one guarded
update. So the pod is never bound without its reservation (a restarted extender rebuilds its reservations from the
pods) and never annotated without being bound; a separate annotate-then-bind pair could leave either half behind and
doubled the API calls in the scheduler's critical path.

A retry is idempotent: the API server answers 409 Conflict ("pod X is already assigned to node Y") when the pod is
already bound. If it is bound to the node this bind asked for (the earlier attempt succeeded but its answer was
lost, for instance to the timeout), that is success; to another node it is a real failure.

The call carries a timeout below kube-scheduler's ``httpTimeout`` for the extender, so the extender always answers
before the scheduler gives up on it (a bind that the scheduler timed out on but that later succeeded would leave the
scheduler's cache and the cluster disagreeing until the pod's watch event arrives).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from gnnsched.contract import ANN_RESERVATION, GNNJOB_PLURAL, GROUP, VERSION

from .cache import Reservation

#: Seconds a bind's API call may take: below kube-scheduler's default extender ``httpTimeout`` (5 s), leaving it time
#: to read our answer. The chart derives ``--bind-timeout`` from ``scheduler.extender.httpTimeout`` the same way.
DEFAULT_BIND_TIMEOUT = 4.0

log = logging.getLogger("gnnsched.extender")


class BindFailed(Exception):
    """The API refused the Binding; message is for the scheduler's event. ``pod`` is the pod as stored when the
    refusal was because it is already bound elsewhere (its own reservation then stands)."""

    def __init__(self, message: str, pod: dict | None = None) -> None:
        super().__init__(message)
        self.pod = pod


class Binder(Protocol):
    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> dict | None:
        """Bind the pod to ``node`` with ``reservation`` on it; ``None`` when this call bound it, the pod as stored
        when an earlier attempt had already bound it to ``node`` (its reservation annotation is the earlier one).
        Raises ``BindFailed`` otherwise."""
        ...

    def get_pod(self, namespace: str, name: str) -> dict | None: ...

    def get_gnnjob(self, namespace: str, name: str) -> dict | None:
        """The GNNJob as the API server has it now (a pod's facts are in its status), or None."""
        ...


class FakeBinder:
    """Records binds as pod objects in memory, optionally persisted to a JSON file so a restarted
    ``--fake-cluster`` extender rebuilds its reservations from them exactly as it would from the API."""

    def __init__(self, state_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, dict] = {}
        self._jobs: dict[tuple[str, str], dict] = {}  # GNNJobs by (namespace, name): their status holds pod facts
        self.state_file = state_file
        self.anchor: float | None = None
        if state_file is not None and state_file.exists():
            data = json.loads(state_file.read_text())
            self._pods = {p["metadata"]["uid"]: p for p in data.get("pods", [])}
            self.anchor = data.get("anchor")

    def pods(self) -> list[dict]:
        with self._lock:
            return [json.loads(json.dumps(p)) for p in self._pods.values()]

    def add_gnnjob(self, job: dict) -> None:
        """Store a GNNJob as the API server would (tests and tools that play the operator in a fake cluster)."""
        meta = job.get("metadata") or {}
        with self._lock:
            self._jobs[(str(meta.get("namespace") or "default"), str(meta.get("name") or ""))] = \
                json.loads(json.dumps(job))

    def get_gnnjob(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            job = self._jobs.get((namespace, name))
            return json.loads(json.dumps(job)) if job is not None else None

    def get_pod(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            for p in self._pods.values():
                m = p.get("metadata") or {}
                if m.get("name") == name and (m.get("namespace") or "default") == namespace:
                    return json.loads(json.dumps(p))
        return None

    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> dict | None:
        """Record the bound pod (the object the scheduler showed us at filter, if any) with its annotation; the same
        already-assigned rule as the API server's binding subresource."""
        with self._lock:
            stored = self._pods.get(uid)
            bound_to = ((stored or {}).get("spec") or {}).get("nodeName")
            if bound_to == node:
                return json.loads(json.dumps(stored))
            if bound_to:
                raise BindFailed(f"binding pod {namespace}/{name} to {node}: 409 pod {name} is already assigned to "
                                 f"node {bound_to!r}", pod=json.loads(json.dumps(stored)))
            if pod is not None:
                pod = json.loads(json.dumps(pod))
            pod = pod or stored or {"metadata": {"uid": uid, "name": name, "namespace": namespace}}
            meta = pod.setdefault("metadata", {})
            meta.setdefault("annotations", {})[ANN_RESERVATION] = reservation.annotation()
            pod.setdefault("spec", {})["nodeName"] = node
            pod.setdefault("status", {})["phase"] = "Pending"
            self._pods[uid] = pod
            self._persist()
        return None

    def set_anchor(self, anchor: float) -> None:
        with self._lock:
            self.anchor = anchor
            self._persist()

    def _persist(self) -> None:
        if self.state_file is None:
            return
        tmp = self.state_file.with_suffix(self.state_file.suffix + ".tmp")
        tmp.write_text(json.dumps({"anchor": self.anchor, "pods": list(self._pods.values())}))
        os.replace(tmp, self.state_file)


class KubeBinder:
    """Binds through the API server: one ``Binding`` carrying the reservation annotation."""

    def __init__(self, core_v1: Any, timeout: float = DEFAULT_BIND_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout: {timeout} must be positive seconds")
        self.core = core_v1
        self.timeout = timeout

    def get_pod(self, namespace: str, name: str) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False,
                                                 _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BindFailed(f"reading pod {namespace}/{name}: {exc.status} {exc.reason}") from None
        except Exception as exc:  # connection errors and timeouts: report, never crash the request
            raise BindFailed(f"reading pod {namespace}/{name}: {exc}") from None
        return json.loads(resp.data)

    def get_gnnjob(self, namespace: str, name: str) -> dict | None:
        """Read a GNNJob (a pod arrived before the watch brought its job's status); None when it cannot be read."""
        from kubernetes import client

        try:
            obj = client.CustomObjectsApi(self.core.api_client).get_namespaced_custom_object(
                GROUP, VERSION, namespace, GNNJOB_PLURAL, name, _request_timeout=self.timeout)
        except Exception as exc:  # 404, 403, a timeout: the pod is then read as untrusted, never a crash
            log.info("reading GNNJob %s/%s: %s", namespace, name, exc)
            return None
        return obj if isinstance(obj, dict) else None

    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> dict | None:
        from kubernetes.client.rest import ApiException

        metadata: dict[str, Any] = {"name": name, "namespace": namespace,
                                    "annotations": {ANN_RESERVATION: reservation.annotation()}}
        if uid:
            metadata["uid"] = uid  # the API server's UID precondition: never bind a recreated pod of the same name
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": metadata,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        what = f"binding pod {namespace}/{name} to {node}"
        try:
            # pods/<name>/binding, as kube-scheduler's own binder posts it (the chart's RBAC grants pods/binding)
            self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False,
                                                    _request_timeout=self.timeout)
        except ApiException as exc:
            if exc.status != 409:
                raise BindFailed(f"{what}: {exc.status} {exc.reason}") from None
            current = self.get_pod(namespace, name)  # only on a conflict: was it our own earlier attempt?
            meta = (current or {}).get("metadata") or {}
            bound_to = ((current or {}).get("spec") or {}).get("nodeName")
            if current is not None and bound_to == node and (not uid or meta.get("uid") == uid):
                return current
            detail = f"already bound to node {bound_to!r}" if bound_to else _reason(exc)
            raise BindFailed(f"{what}: 409 {detail}", pod=current if bound_to else None) from None
        except Exception as exc:  # connection errors and timeouts: report, never crash the request
            raise BindFailed(f"{what}: {exc}") from None
        return None


def _reason(exc: Any) -> str:
    """The API server's message from an ``ApiException`` body, or its reason phrase."""
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)
