"""An in-memory Kubernetes API for the operator's tests: ``kmock``'s emulator, made faithful where kopf depends on it.

kmock 0.8 (``KubernetesEmulator``) stores objects and streams watch events, but differs from a real API server in
ways that break kopf or kubectl (DESIGN.md, "Facts checked here"). This subclass fixes exactly those, nothing more:

* every write (create, patch, delete-with-finalizers) bumps ``metadata.resourceVersion``; kopf's finalizer and
  progress patches are JSON-patches guarded by ``test /metadata/resourceVersion`` and loop or double-fire without it;
* a JSON-patch whose ``test`` op fails is answered 422 (kmock answers 500), which kopf treats as "retry next cycle";
* create assigns ``uid``, ``creationTimestamp``, ``generation`` and the namespace (owner references need the uid);
* writes are serialised so that the ``test`` check and the write are atomic;
* ``/api/v1/namespaces[/NAME]`` is routed to the namespaces resource (kmock reads it as a namespace prefix);
* core discovery reports ``groupVersion: v1`` (kmock says ``/v1``, which hides core resources from kubectl);
* list and watch honour equality ``labelSelector`` terms; watch streams end after ``timeoutSeconds``;
* matching a request to kmock's reactions looks at that request only (kmock rescans every request so far: quadratic),
  and only recent requests are remembered;
* ``POST pods/<name>/binding`` binds as kube-apiserver's binding subresource does (``BindingREST`` in
  ``pkg/registry/core/pod/storage/storage.go``): one guarded update sets ``spec.nodeName``, merges the Binding's
  annotations into the pod's and sets ``PodScheduled``; a pod already assigned (to any node), being deleted, or whose
  uid differs from the Binding's uid precondition is answered 409 Conflict (kmock would store a "Binding" object);
* ``Accept: ...;as=Table`` gets a server-side ``Table`` built from registered printer columns, as the real API server
  does for CRDs with ``additionalPrinterColumns`` (so ``kubectl get gj`` prints Phase, PMC ...).

It is test infrastructure (imported by ``tests/`` and ``bench/``), not part of the package.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import itertools
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import yaml
from kmock._internal import enums, parsing, rendering

REPO = Path(__file__).resolve().parent.parent


def _parse_path(path: str, _original: Any = parsing.parse_path) -> Any:
    """kmock 0.8 reads ``/api/v1/namespaces[/NAME]`` as a namespace prefix with no resource, so the list and the GET
    of namespaces themselves fail (500 / 404); the real API server routes them to the ``namespaces`` resource."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (3, 4):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _original(path)


parsing.parse_path = _parse_path  # the emulator's module-wide fix (rendering calls parsing.parse_path)
_CURRENT_REQUEST: contextvars.ContextVar[Any] = contextvars.ContextVar("kube_emulator_request", default=None)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _jsonpath(obj: Any, path: str) -> Any:
    """The subset of JSONPath printer columns use: ``.a.b.c``."""
    for part in path.strip(".").split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


@attrs.define(kw_only=True)
class StrictKubernetes(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersion bumps, 422 on failed JSON-patch tests, uids and Table rendering."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    printer_columns: dict[str, list[dict[str, str]]] = attrs.field(factory=dict)
    # Test hook: awaited before a write is applied (may sleep to hold it, or raise KubernetesError to refuse it).
    before_write: Any = attrs.field(default=None)
    # Test hook: awaited after a write was applied, before the response is sent (to lose responses).
    after_write: Any = attrs.field(default=None)
    # ``GET /version``'s gitVersion (kmock answers a fixed k3s version); None keeps kmock's answer.
    server_version: str | None = attrs.field(default=None)

    def _next_version(self) -> str:
        return str(next(self._versions))

    def __iter__(self) -> Any:
        """While a request is being matched, the record is just that request.

        kmock decides whether a reaction applies to a request by scanning *every* request recorded so far through
        the reaction's filters and looking for this one (``request in view``): quadratic over a run, seconds per
        request after a few thousand. Only membership of the current request matters for that decision.
        """
        current = _CURRENT_REQUEST.get()
        if current is not None:
            yield current
            return
        yield from super().__iter__()

    def _forget_old_requests(self, keep: int = 64, limit: int = 256) -> None:
        """Nothing here asserts on old requests; keep memory bounded in long runs (benchmarks)."""
        if len(self._requests) > limit:
            del self._requests[:-keep]
        for payload in self._payloads:
            recorded = getattr(payload, "_requests", None)
            if isinstance(recorded, list) and len(recorded) > limit:
                del recorded[:-keep]

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        self._forget_old_requests()
        _CURRENT_REQUEST.set(request)  # per aiohttp handler task (contextvars are task-local)
        if _is_binding(request):  # kmock sees a POST to a named object as no action at all
            if self.before_write is not None:
                await self.before_write(request)
            response = await self._serve_binding(request)
            if self.after_write is not None:
                await self.after_write(request)
            return response
        if request.resource is None or request.action not in (
            enums.action.CREATE,
            enums.action.UPDATE,
            enums.action.DELETE,
        ):
            if request.action == enums.action.LIST and "as=Table" in request.headers.get("Accept", ""):
                return await self._serve_table(request)
            if request.action == enums.action.FETCH and "as=Table" in request.headers.get("Accept", ""):
                return await self._serve_table(request)
            return await super()._handle(request)
        if self.before_write is not None:
            await self.before_write(request)
        async with self._write_lock:
            self._prepare_write(request)
            response = await super()._handle(request)
        if self.after_write is not None:
            await self.after_write(request)
        return response

    async def _serve_binding(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """The binding subresource: the pod's node, the Binding's annotations and PodScheduled in one write."""
        body = request.data if isinstance(request.data, dict) else {}
        target = (body.get("target") or {}).get("name") if isinstance(body.get("target"), dict) else None
        meta = body.get("metadata") if isinstance(body.get("metadata"), dict) else {}
        if not target:
            return await self._render_error(kmock.KubernetesError(
                status=422, reason="Invalid", message="Binding is invalid: target.name: Required value"))
        key = (request.resource, request.namespace, request.name)
        async with self._write_lock, self._lock:  # the same order as other writes (kmock's lock inside ours)
            stored = self._objects[key] if key in self._objects else None  # noqa: SIM401 - ObjectsArray has no get()
            if stored is None or stored.deleted:
                return await self._render_error(kmock.KubernetesObjectNotFoundError())
            pod = stored.raw
            pod_meta = pod.get("metadata") or {}
            conflict = None
            if meta.get("uid") and meta["uid"] != pod_meta.get("uid"):
                conflict = (f"Precondition failed: UID in precondition: {meta['uid']}, "
                            f"UID in object meta: {pod_meta.get('uid')}")
            elif pod_meta.get("deletionTimestamp"):
                conflict = f"pod {request.name} is being deleted, cannot be assigned to a host"
            elif (pod.get("spec") or {}).get("nodeName"):
                conflict = f"pod {request.name} is already assigned to node \"{pod['spec']['nodeName']}\""
            if conflict is not None:
                return await self._render_error(kmock.KubernetesError(
                    status=409, reason="Conflict", message=f'Operation cannot be fulfilled on pods/binding '
                                                           f'"{request.name}": {conflict}'))
            conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                          if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
            stored.patch({
                "metadata": {"resourceVersion": self._next_version(),
                             "annotations": {**(pod_meta.get("annotations") or {}), **(meta.get("annotations") or {})}},
                "spec": {"nodeName": target},
                "status": {"conditions": conditions},
            })
            await self._buses[request.resource].put({"type": "MODIFIED", "object": stored.raw})
        return aiohttp.web.json_response(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201)

    def _prepare_write(self, request: rendering.Request) -> None:
        """Make the write look like the real API server's before kmock applies it (mutates ``request.data``)."""
        version = self._next_version()
        if request.action == enums.action.CREATE:
            if not isinstance(request.data, dict):
                raise kmock.KubernetesError(status=400, reason="BadRequest", message="body must be an object")
            meta = request.data.setdefault("metadata", {})
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta["resourceVersion"] = version
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = _now()
            meta["generation"] = 1
            return
        key = (request.resource, request.namespace, request.name)
        stored = self._objects[key] if key in self._objects else None  # noqa: SIM401 - kmock's ObjectsArray has no get()
        if stored is None or stored.deleted:
            return  # kmock answers 404 itself
        if request.action == enums.action.UPDATE:
            if isinstance(request.data, list):
                current = stored.raw
                for op in request.data:
                    if isinstance(op, dict) and op.get("op") == "test":
                        actual = _pointer(current, str(op.get("path", "")))
                        if actual != op.get("value"):
                            raise kmock.KubernetesError(
                                status=422,
                                reason="Invalid",
                                message=f"the server rejected our request: test failed at {op.get('path')}",
                            )
                request.data.append({"op": "add", "path": "/metadata/resourceVersion", "value": version})
            elif isinstance(request.data, dict):
                meta = request.data.get("metadata")
                if not isinstance(meta, dict):
                    meta = request.data["metadata"] = {}
                meta["resourceVersion"] = version
                if "spec" in request.data and request.subresource is None:
                    meta["generation"] = int(stored.raw.get("metadata", {}).get("generation", 1)) + 1
        elif request.action == enums.action.DELETE:
            meta = stored.raw.get("metadata", {})
            if meta.get("finalizers") and not meta.get("deletionTimestamp"):
                stored.patch({"metadata": {"resourceVersion": version}})

    async def _serve_watch(self, request: rendering.Request) -> Any:
        """kmock's watch stream, ended after ``timeoutSeconds`` as the real API server does.

        kmock 0.8 never ends a watch stream server-side; a client that reconnects every few seconds then leaves a
        growing number of live streams behind, each fed every event (quadratic CPU in a long run).
        """
        try:
            timeout = float(request.params.get("timeoutSeconds") or 0)
        except ValueError:
            timeout = 0.0
        stream = self._selected(request, super()._serve_watch(request))
        if timeout <= 0:
            async for item in stream:
                yield item
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        try:
            while (remaining := deadline - loop.time()) > 0:
                try:
                    item = await asyncio.wait_for(stream.__anext__(), remaining)
                except (StopAsyncIteration, asyncio.TimeoutError):
                    break
                yield item
        finally:
            close = getattr(stream, "aclose", None)  # kmock's stream is an async generator; close it with this one
            if close is not None:
                await close()

    async def _selected(self, request: rendering.Request, stream: Any) -> Any:
        """Watch events of the objects the request's ``labelSelector`` selects (kmock sends every object)."""
        terms = _selector_terms(request.params.get("labelSelector"))
        async for item in stream:
            if terms and isinstance(item, dict) and isinstance(item.get("object"), dict) \
                    and not _matches(item["object"], terms):
                continue
            yield item

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_list(request)
        terms = _selector_terms(request.params.get("labelSelector"))
        if terms and isinstance(result, dict):
            result["items"] = [item for item in result["items"] if _matches(item, terms)]
        return result

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_version(request)
        if isinstance(result, dict) and result.get("groupVersion", "").startswith("/"):
            result["groupVersion"] = result["groupVersion"][1:]
        return result

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_server_version(request)
        if self.server_version and isinstance(result, dict):
            major, minor = self.server_version.lstrip("v").split(".")[:2]
            result.update(gitVersion=self.server_version, major=major, minor=minor)
        return result

    async def _serve_table(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        plural = request.resource.plural if request.resource is not None else None
        columns = [{"name": "Name", "type": "string", "jsonPath": ".metadata.name"}]
        columns += self.printer_columns.get(str(plural), [])
        async with self._lock:
            objs = [
                o.raw
                for (res, ns, name), o in self._objects.items()
                if res == request.resource
                and not o.deleted
                and (request.namespace is None or ns == request.namespace)
                and (request.name is None or name == request.name)
            ]
        if request.name is not None and not objs:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        table = {
            "apiVersion": "meta.k8s.io/v1",
            "kind": "Table",
            "metadata": {"resourceVersion": self._next_version()},
            "columnDefinitions": [
                {"name": c["name"], "type": "string" if c.get("type") == "date" else c.get("type", "string"),
                 "format": "name" if c["name"] == "Name" else "", "description": c.get("description", ""),
                 "priority": 0}
                for c in columns
            ],
            "rows": [
                {
                    "cells": [_cell(_jsonpath(obj, c["jsonPath"])) for c in columns],
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": obj.get("metadata", {})},
                }
                for obj in objs
            ],
        }
        return aiohttp.web.json_response(table)


def _is_binding(request: rendering.Request) -> bool:
    resource = request.resource
    return (request.method == "POST" and request.subresource == "binding" and request.name is not None
            and resource is not None and resource.plural == "pods" and not resource.group)


def _selector_terms(selector: Any) -> list[list[str]]:
    """Equality terms of a label selector (``a=b,c==d``), the only kind the operator and the tests send."""
    if not isinstance(selector, str) or not selector:
        return []
    return [t.split("=", 1) for t in selector.replace("==", "=").split(",") if "=" in t]


def _matches(obj: dict[str, Any], terms: list[list[str]]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in terms)


def _cell(value: Any) -> Any:
    return "<none>" if value is None else value


def _pointer(obj: Any, path: str) -> Any:
    """Resolve an RFC 6901 JSON pointer; ``None`` when absent."""
    for part in [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]:
        if isinstance(obj, dict):
            obj = obj.get(part)
        elif isinstance(obj, list) and part.isdigit() and int(part) < len(obj):
            obj = obj[int(part)]
        else:
            return None
    return obj


def declare_resources(k8s: StrictKubernetes) -> None:
    """Declare what the operator and kubectl discover: core namespaces/pods/events, GNNJob and GPUNode from the CRDs."""
    k8s.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", singular="namespace", namespaced=False,
                                                        verbs={"list", "watch", "get"})
    k8s.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", singular="pod", namespaced=True, shortnames={"po"},
                                                  verbs={"list", "watch", "get", "create", "patch", "delete"},
                                                  subresources={"status", "binding"})
    k8s.resources["v1/configmaps"] = kmock.ResourceInfo(kind="ConfigMap", singular="configmap", namespaced=True,
                                                        shortnames={"cm"}, verbs={"list", "get", "create", "delete"})
    k8s.resources["v1/events"] = kmock.ResourceInfo(kind="Event", singular="event", namespaced=True,
                                                    shortnames={"ev"}, verbs={"list", "watch", "get", "create"})
    for crd_file in ("gnnjob.yaml", "gpunode.yaml", "gnncalibration.yaml"):
        crd = yaml.safe_load((REPO / "crds" / crd_file).read_text())
        spec = crd["spec"]
        version = next(v for v in spec["versions"] if v.get("storage"))
        names = spec["names"]
        k8s.resources[f"{spec['group']}/{version['name']}/{names['plural']}"] = kmock.ResourceInfo(
            kind=names["kind"],
            singular=names["singular"],
            namespaced=spec["scope"] == "Namespaced",
            shortnames=set(names.get("shortNames", [])),
            categories=set(names.get("categories", [])),
            verbs={"list", "watch", "get", "create", "patch", "delete"},
            subresources=set(version.get("subresources", {})),
        )
        k8s.printer_columns[names["plural"]] = list(version.get("additionalPrinterColumns", []))
