"""A small synchronous REST client for the stand-ins and the harness: plain HTTP/JSON against the API server.

The stand-ins talk to the API server the way kube-scheduler and kubelet do at the protocol level (GET/POST/PATCH/
DELETE on the REST paths, merge patches on ``/status``), without the informer machinery: they poll lists. One
``requests.Session`` per thread (sessions are not thread-safe).
"""

from __future__ import annotations

import datetime
import threading
import uuid
from typing import Any

import requests

from gnnsched.contract import GNNJOB_PLURAL, GPUNODE_PLURAL, GROUP, VERSION

JOBS = f"/apis/{GROUP}/{VERSION}/namespaces/{{ns}}/{GNNJOB_PLURAL}"
ALL_JOBS = f"/apis/{GROUP}/{VERSION}/{GNNJOB_PLURAL}"
GPUNODES = f"/apis/{GROUP}/{VERSION}/{GPUNODE_PLURAL}"
PODS = "/api/v1/namespaces/{ns}/pods"
ALL_PODS = "/api/v1/pods"
NODES = "/api/v1/nodes"
EVENTS = "/api/v1/namespaces/{ns}/events"
ALL_EVENTS = "/api/v1/events"
NAMESPACES = "/api/v1/namespaces"
MERGE = {"Content-Type": "application/merge-patch+json"}


class ApiError(Exception):
    """A request the API server refused or did not answer; ``status`` is 0 when there was no answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status


def now() -> str:
    """RFC 3339 with seconds, as the API server and kubelet write times."""
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Api:
    """GET/POST/PATCH/DELETE JSON against ``url``; raises :class:`ApiError` on a non-2xx answer. ``token``: the
    bearer token of the identity it acts as (``identities.py``); None sends none (``system:anonymous``)."""

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.token = token
        self._local = threading.local()

    def _session(self) -> requests.Session:
        s = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = requests.Session()
            if self.token is not None:
                s.headers["Authorization"] = f"Bearer {self.token}"
        return s

    def request(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
                params: dict[str, Any] | None = None) -> Any:
        try:
            resp = self._session().request(method, self.url + path, json=body, headers=headers, params=params,
                                           timeout=self.timeout)
        except requests.RequestException as exc:
            raise ApiError(0, f"{method} {path}: {exc}") from None
        if resp.status_code >= 300:
            try:
                message = resp.json().get("message") or resp.text
            except ValueError:
                message = resp.text
            raise ApiError(resp.status_code, f"{method} {path}: {message}")
        try:
            return resp.json()
        except ValueError:
            return None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None)

    def get_or_none(self, path: str) -> Any:
        try:
            return self.get(path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise

    def items(self, path: str, **params: Any) -> list[dict[str, Any]]:
        return list((self.get(path, **params) or {}).get("items") or [])

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self.request("PATCH", path, body, headers=MERGE)

    def delete(self, path: str, grace_seconds: int | None = None) -> Any:
        params = None if grace_seconds is None else {"gracePeriodSeconds": grace_seconds}
        return self.request("DELETE", path, params=params)

    def event(self, obj: dict[str, Any], event_type: str, reason: str, message: str, component: str,
              host: str | None = None) -> str:
        """A core/v1 Event about ``obj`` (as client-go's event recorder writes it); returns its name."""
        meta = obj.get("metadata") or {}
        ns = meta.get("namespace") or "default"
        stamp = now()
        name = f"{meta.get('name')}.{uuid.uuid4().hex[:16]}"
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": ns},
            "involvedObject": {"apiVersion": obj.get("apiVersion", "v1"), "kind": obj.get("kind", "Pod"),
                               "name": meta.get("name"), "namespace": ns, "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": event_type, "count": 1,
            "firstTimestamp": stamp, "lastTimestamp": stamp,
            "source": {"component": component, **({"host": host} if host else {})},
            "reportingComponent": component,
        }
        self.post(EVENTS.format(ns=ns), body)
        return name
