"""Who carries out a bind: the Kubernetes API (in a cluster) or an in-memory pod store (``--fake-cluster``).

Both write the reservation annotation *before* the Binding, so a restarted extender can rebuild its reservations
from the pods; if the Binding then fails the caller releases the reservation and the scheduler retries.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any, Protocol

from gnnsched.contract import ANN_RESERVATION

from .cache import Reservation


class BindFailed(Exception):
    """The API refused the Binding or the annotation; message is for the scheduler's event."""


class Binder(Protocol):
    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> None: ...

    def get_pod(self, namespace: str, name: str) -> dict | None: ...


class FakeBinder:
    """Records binds as pod objects in memory, optionally persisted to a JSON file so a restarted
    ``--fake-cluster`` extender rebuilds its reservations from them exactly as it would from the API."""

    def __init__(self, state_file: Path | None = None) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, dict] = {}
        self.state_file = state_file
        self.anchor: float | None = None
        if state_file is not None and state_file.exists():
            data = json.loads(state_file.read_text())
            self._pods = {p["metadata"]["uid"]: p for p in data.get("pods", [])}
            self.anchor = data.get("anchor")

    def pods(self) -> list[dict]:
        with self._lock:
            return [json.loads(json.dumps(p)) for p in self._pods.values()]

    def get_pod(self, namespace: str, name: str) -> dict | None:
        with self._lock:
            for p in self._pods.values():
                m = p.get("metadata") or {}
                if m.get("name") == name and (m.get("namespace") or "default") == namespace:
                    return json.loads(json.dumps(p))
        return None

    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> None:
        """Record the bound pod (the object the scheduler showed us at filter, if any) with its annotation."""
        with self._lock:
            if pod is not None:
                pod = json.loads(json.dumps(pod))
            pod = pod or self._pods.get(uid) or {"metadata": {"uid": uid, "name": name, "namespace": namespace}}
            meta = pod.setdefault("metadata", {})
            meta.setdefault("annotations", {})[ANN_RESERVATION] = reservation.annotation()
            pod.setdefault("spec", {})["nodeName"] = node
            pod.setdefault("status", {})["phase"] = "Pending"
            self._pods[uid] = pod
            self._persist()

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
    """Binds through the API server: annotate the pod with its reservation, then create its Binding."""

    def __init__(self, core_v1: Any) -> None:
        self.core = core_v1

    def get_pod(self, namespace: str, name: str) -> dict | None:
        from kubernetes.client.rest import ApiException

        try:
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise BindFailed(f"reading pod {namespace}/{name}: {exc.status} {exc.reason}") from None
        return json.loads(resp.data)

    def bind(
        self, namespace: str, name: str, uid: str, node: str, reservation: Reservation, pod: dict | None = None
    ) -> None:
        from kubernetes.client.rest import ApiException

        patch = {"metadata": {"annotations": {ANN_RESERVATION: reservation.annotation()}}}
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        try:
            self.core.patch_namespaced_pod(name, namespace, patch, _preload_content=False)
            self.core.create_namespaced_binding(namespace, body, _preload_content=False)
        except ApiException as exc:
            raise BindFailed(f"binding pod {namespace}/{name} to {node}: {exc.status} {exc.reason}") from None
        except Exception as exc:  # connection errors: report, never crash the request
            raise BindFailed(f"binding pod {namespace}/{name} to {node}: {exc}") from None
