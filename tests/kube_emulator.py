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
* list and watch honour equality ``labelSelector`` terms and the ``fieldSelector`` fields the real server supports
  for the kind (``kubectl describe`` lists an object's events with ``involvedObject.*``; another field is refused
  with 400, as kube-apiserver does); watch streams end after ``timeoutSeconds``;
* matching a request to kmock's reactions looks at that request only (kmock rescans every request so far: quadratic),
  and only recent requests are remembered;
* ``POST pods/<name>/binding`` binds as kube-apiserver's binding subresource does (``BindingREST`` in
  ``pkg/registry/core/pod/storage/storage.go``): one guarded update sets ``spec.nodeName``, merges the Binding's
  annotations into the pod's and sets ``PodScheduled``; a pod already assigned (to any node), being deleted, or whose
  uid differs from the Binding's uid precondition is answered 409 Conflict (kmock would store a "Binding" object);
* ``Accept: ...;as=Table`` gets a server-side ``Table`` (lists, gets and watches), built from the CRD's
  ``additionalPrinterColumns`` with dates as ages, or from the core printers' columns (``kube_kubectl.table``);
* list replies carry ``kind`` (``GNNJobList``), ``apiVersion`` and a real ``resourceVersion``, and a watch from a
  ``resourceVersion`` sends only what changed after it (kmock replays every object: ``kubectl get -w`` printed each
  twice); discovery lists subresources with their own verbs and without the resource's short names (kubectl
  otherwise reports ``short name "gj" could also match lower priority resource gnnjobs/status``);
* ``/openapi/v2``, ``/openapi/v3`` and ``/openapi/v3/<group-version>`` are built from the installed CRDs' schemas
  (``kubectl explain``, client-side validation and ``apply``'s patch type read them); a create or patch of a custom
  resource with ``fieldValidation=Strict`` (kubectl's default) and an undeclared field is refused as the real
  server refuses it (a create or update: 400 ``strict decoding error``; a patch: 422 Invalid on the field
  ``patch``); ``dryRun=All`` validates and answers without storing;
* ``kube-apiserver``'s own namespaces exist from the start (``default``, ``kube-system``, ``kube-public``,
  ``kube-node-lease``), namespaces have their short name ``ns``, and nothing is created in a namespace that does
  not exist (404 ``namespaces "x" not found``, as the NamespaceLifecycle admission plugin answers);
* ``SelfSubjectAccessReview`` (``kubectl auth can-i``) answers allowed: there is no RBAC here;
* with ``tokens`` set (none: no authentication, no admission), a bearer token names its user (username, groups and
  ``extra``, as a projected service-account token's claims do; an unknown token is 401, no token is
  ``system:anonymous``), and the ValidatingAdmissionPolicies and bindings stored through the API are enforced on
  every create, update, patch and delete (and the binding subresource) as kube-apiserver enforces them
  (``kube_admission``: CEL evaluated with celpy, a refusal is ``ValidatingAdmissionPolicy 'P' with binding 'B'
  denied request: ...`` with the validation's reason and code).

It is test infrastructure (imported by ``tests/`` and ``bench/``), not part of the package.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime
import itertools
import json
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
import kube_admission
import kube_kubectl
import yaml
from kmock._internal import enums, parsing, rendering

REPO = Path(__file__).resolve().parent.parent
NAMESPACES = kmock.resource(group="", version="v1", plural="namespaces")


def _parse_path(path: str, _original: Any = parsing.parse_path) -> Any:
    """kmock 0.8 reads ``/api/v1/namespaces[/NAME]`` as a namespace prefix with no resource, so the list and the GET
    of namespaces themselves fail (500 / 404); the real API server routes them to the ``namespaces`` resource."""
    parts = path.strip("/").split("/")
    if parts[:3] == ["api", "v1", "namespaces"] and len(parts) in (3, 4):
        return parsing.ParsedPath("", "v1", "namespaces", None, parts[3] if len(parts) == 4 else None, None)
    return _original(path)


parsing.parse_path = _parse_path  # the emulator's module-wide fix (rendering calls parsing.parse_path)
_CURRENT_REQUEST: contextvars.ContextVar[Any] = contextvars.ContextVar("kube_emulator_request", default=None)
# The request whose admission was already reviewed in this handler task (a subclass reviews before its own routes).
_ADMITTED: contextvars.ContextVar[Any] = contextvars.ContextVar("kube_emulator_admitted", default=None)
ANONYMOUS = {"username": "system:anonymous", "groups": ["system:unauthenticated"]}


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class StrictKubernetes(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersion bumps, 422 on failed JSON-patch tests, uids and Table rendering."""

    _versions: Any = attrs.field(factory=lambda: itertools.count(1000), init=False)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    printer_columns: dict[str, list[dict[str, str]]] = attrs.field(factory=dict)
    # The installed CRDs by plural (their schemas make the OpenAPI documents and strict field validation).
    crds: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    # Test hook: awaited before a write is applied (may sleep to hold it, or raise KubernetesError to refuse it).
    before_write: Any = attrs.field(default=None)
    # Test hook: awaited after a write was applied, before the response is sent (to lose responses).
    after_write: Any = attrs.field(default=None)
    # ``GET /version``'s gitVersion (kmock answers a fixed k3s version); None keeps kmock's answer.
    server_version: str | None = attrs.field(default=None)
    # Bearer token -> user info ({"username", "uid", "groups", "extra"}); empty: every request is anonymous.
    tokens: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    _policies: kube_admission.PolicyEvaluator = attrs.field(factory=kube_admission.PolicyEvaluator, init=False)
    # The stored policies and bindings, re-read after a write to their API group (not a scan per write).
    _admission_cache: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = attrs.field(default=None, init=False)

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
        special = self._serve_kubectl(request)
        if special is not None:
            return special
        if request.action in (enums.action.LIST, enums.action.WATCH) and request.resource is not None:
            try:
                kube_kubectl.field_selector(str(request.resource.plural), request.params.get("fieldSelector"))
            except ValueError as exc:
                return aiohttp.web.json_response(_status(400, "BadRequest", str(exc)), status=400)
        if request.action == enums.action.CREATE and not self._namespace_exists(request.namespace):
            return await self._render_error(kmock.KubernetesError(
                status=404, reason="NotFound", message=f'namespaces "{request.namespace}" not found',
                details={"name": request.namespace, "kind": "namespaces"}))
        refused = self._admit(request)
        if refused is not None:
            return refused
        if request.action in (enums.action.CREATE, enums.action.UPDATE) and request.resource is not None:
            strict = self._strict_fields(request)
            if isinstance(strict, dict):
                return aiohttp.web.json_response(strict, status=strict["code"])
            if strict is not None:
                return await self._render_error(strict)
            if request.params.get("dryRun") == "All":
                return await self._dry_run(request)
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
            if request.action in (enums.action.LIST, enums.action.FETCH) and _wants_table(request):
                return await self._serve_table(request)
            if request.action == enums.action.WATCH and request.resource is not None:
                return await self._stream_watch(request)
            return await super()._handle(request)
        if self.before_write is not None:
            await self.before_write(request)
        async with self._write_lock:
            self._prepare_write(request)
            response = await super()._handle(request)
            if request.resource.group == kube_admission.ADMISSION_GROUP:
                self._admission_cache = None
        if self.after_write is not None:
            await self.after_write(request)
        return response

    def _user(self, request: rendering.Request) -> dict[str, Any] | None:
        """The request's user: the bearer token's, ``system:anonymous`` without one; None for an unknown token."""
        auth = str(request.headers.get("Authorization") or "")
        if not self.tokens or not auth.startswith("Bearer "):
            return dict(ANONYMOUS)
        return self.tokens.get(auth[len("Bearer "):].strip())

    def _admission_objects(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The stored ValidatingAdmissionPolicies and their bindings."""
        if self._admission_cache is None:
            stored: dict[str, list[dict[str, Any]]] = {kube_admission.POLICY_PLURAL: [],
                                                       kube_admission.BINDING_PLURAL: []}
            for (res, _, _), o in self._objects.items():
                if res.group == kube_admission.ADMISSION_GROUP and res.plural in stored and not o.deleted:
                    stored[str(res.plural)].append(json.loads(json.dumps(o.raw)))
            self._admission_cache = (stored[kube_admission.POLICY_PLURAL], stored[kube_admission.BINDING_PLURAL])
        return self._admission_cache

    def _admit(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """Authentication and ValidatingAdmissionPolicy admission of a write: a refusal's response, else None."""
        if _ADMITTED.get() is request or not self.tokens:
            return None  # without tokens: no identities to decide by, nothing enforced (the operator's unit tests)
        _ADMITTED.set(request)
        user = self._user(request)
        if user is None:
            body = _status(401, "Unauthorized", "Unauthorized")
            return aiohttp.web.json_response(body, status=401)
        res = request.resource
        operation = {"POST": "CREATE", "PUT": "UPDATE", "PATCH": "UPDATE", "DELETE": "DELETE"}.get(
            str(request.method.value) if request.method is not None else "")
        if res is None or operation is None:
            return None
        if res.group == kube_admission.ADMISSION_GROUP:
            self._admission_cache = None  # re-read once this write is stored (and again after it: _handle)
            return None
        policies, bindings = self._admission_objects()
        if not policies or not bindings:
            return None
        attrs = self._admission_attributes(request, operation, user)
        if attrs is None:
            return None
        denial = self._policies.review(attrs, policies, bindings)
        if denial is None:
            return None
        return aiohttp.web.json_response(denial.status(), status=denial.code)

    def _admission_attributes(self, request: rendering.Request, operation: str,
                              user: dict[str, Any]) -> kube_admission.Attributes | None:
        """What admission sees of a write: the object after it (a patch applied to the stored object), the stored
        object before it, the kind and the subresource. None when there is nothing to review (a write of an object
        that does not exist is kmock's 404)."""
        res = request.resource
        assert res is not None
        subresource = str(request.subresource or "")
        body = json.loads(json.dumps(request.data)) if request.data is not None else None
        key = (res, request.namespace, request.name)
        stored = self._objects[key] if request.name is not None and key in self._objects else None  # noqa: SIM401
        current = None if stored is None or stored.deleted else json.loads(json.dumps(stored.raw))
        info = self._info(res)
        kind = str(info.kind) if info is not None and info.kind else ""
        obj: Any = None
        old: Any = None
        name = str(request.name or "")
        if (operation == "CREATE" and subresource == "binding") or res.plural == "bindings":
            kind, obj = "Binding", body  # the Binding is the object; the pod is not (kube-apiserver's BindingREST)
            name = name or str(((body or {}).get("metadata") or {}).get("name") or "")
        elif operation == "CREATE":
            obj = body
            if isinstance(obj, dict):
                meta = obj.setdefault("metadata", {})
                if request.namespace and not meta.get("namespace"):
                    meta["namespace"] = request.namespace
                name = str(meta.get("name") or "")
        elif current is None:
            return None
        elif operation == "DELETE":
            old = current
        elif isinstance(body, list):
            try:
                obj = kube_admission.apply_json_patch(current, body)
            except ValueError:
                return None  # kmock answers the bad patch itself
            old = current
        elif request.method == "PATCH":
            obj, old = _merge(current, body), current
        else:
            obj, old = body, current
        namespace_obj = None
        if request.namespace:
            ns_key = (NAMESPACES, None, request.namespace)
            if ns_key in self._objects and not self._objects[ns_key].deleted:
                namespace_obj = json.loads(json.dumps(self._objects[ns_key].raw))
        return kube_admission.Attributes(
            operation=operation, group=str(res.group or ""), version=str(res.version or ""),
            resource=str(res.plural), subresource=subresource, kind=kind, user=user,
            namespace=str(request.namespace or ""), name=name, object=obj, old_object=old,
            namespace_object=namespace_obj, dry_run=request.params.get("dryRun") == "All")

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        """kube-apiserver's wording for a missing or existing object (``gnnjobs.gnnsched.io "x" not found``); kmock
        answers reason ``Object Not Found`` and a hint for its own users, which kubectl prints as is."""
        request = _CURRENT_REQUEST.get()
        res = request.resource if request is not None else None
        conflict = type(exc).__name__ == "KubernetesObjectConflictError"
        if res is not None and (isinstance(exc, kmock.KubernetesObjectNotFoundError) or conflict):
            name = request.name
            if not name and isinstance(request.data, dict):
                name = (request.data.get("metadata") or {}).get("name")
            what = f"{res.plural}.{res.group}" if res.group else str(res.plural)
            details = {"name": name, "group": res.group or "", "kind": str(res.plural)}
            if conflict:
                body = _status(409, "AlreadyExists", f'{what} "{name}" already exists')
            else:
                body = _status(404, "NotFound", f'{what} "{name}" not found')
            return aiohttp.web.json_response({**body, "details": details}, status=body["code"])
        return await super()._render_error(exc)

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

    async def _stream_watch(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """The watch stream as ``application/json`` lines, as the real server sends it (kmock's renderer sends
        ``application/octet-stream``, which client-go refuses: ``no stream serializers registered``)."""
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "application/json"})
        assert request._raw_request is not None  # only kmock's own tests build requests without one
        await response.prepare(request._raw_request)
        try:
            async for item in self._serve_watch(request):
                if isinstance(item, dict):
                    await response.write(json.dumps(item).encode() + b"\n")
            await response.write_eof()
        except ConnectionError:
            pass  # the client went away
        return response

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
        if _wants_table(request):
            stream = self._as_tables(request, stream)
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
        """Watch events of the objects the request's selectors select (kmock sends every object)."""
        selects = _selection(request)
        since = _version_number(request.params.get("resourceVersion"))
        async for item in stream:
            if isinstance(item, dict) and isinstance(item.get("object"), dict) and not selects(item["object"]):
                continue
            if since is not None and isinstance(item, dict) and isinstance(item.get("object"), dict):
                seen = _version_number((item["object"].get("metadata") or {}).get("resourceVersion"))
                if seen is not None and seen <= since:  # kmock replays every object; the list already had it
                    continue
            yield item

    async def _as_tables(self, request: rendering.Request, stream: Any) -> Any:
        """A watch asked ``as=Table`` (``kubectl get -w``): each event's object is a one-row Table."""
        plural, columns = self._table_columns(request)
        async for item in stream:
            if isinstance(item, dict) and isinstance(item.get("object"), dict):
                item = {**item, "object": kube_kubectl.table(plural, [item["object"]], columns)}
            yield item

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_list(request)
        if isinstance(result, dict):
            selects = _selection(request)
            result["items"] = [item for item in result["items"] if selects(item)]
        if isinstance(result, dict) and request.resource is not None:
            info = self._info(request.resource)
            res = request.resource
            kind = str(info.kind) if info is not None and info.kind else ""
            result = {"kind": f"{kind}List" if kind else "List",
                      "apiVersion": f"{res.group}/{res.version}" if res.group else str(res.version or "v1"),
                      **result, "metadata": {"resourceVersion": str(next(self._versions))}}
        return result

    async def _serve_version(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_version(request)
        if isinstance(result, dict) and result.get("groupVersion", "").startswith("/"):
            result["groupVersion"] = result["groupVersion"][1:]
        if isinstance(result, dict):
            for entry in result.get("resources") or []:
                if "/" in entry.get("name", ""):  # a subresource: its own verbs, no short names or categories
                    sub = entry["name"].split("/", 1)[1]
                    entry.update(shortNames=[], categories=[],
                                 verbs=kube_kubectl.SUBRESOURCE_VERBS.get(sub, ["get"]))
                    if sub == "log":
                        entry["kind"] = "Pod"
                    elif sub == "binding":
                        entry["kind"] = "Binding"
                    elif sub == "eviction":
                        # kubectl drain evicts only where discovery lists pods/eviction with its group and version
                        # (kubectl's drain.CheckEvictionSupport); otherwise it deletes the pods outright
                        entry.update(kind="Eviction", group="policy", version="v1")
        return result

    async def _serve_server_version(self, request: rendering.Request) -> rendering.Payload:
        result = await super()._serve_server_version(request)
        if self.server_version and isinstance(result, dict):
            major, minor = self.server_version.lstrip("v").split(".")[:2]
            result.update(gitVersion=self.server_version, major=major, minor=minor)
        return result

    def _namespace_exists(self, namespace: str | None) -> bool:
        """The NamespaceLifecycle admission plugin's check (``apiserver/pkg/admission/plugin/namespace/lifecycle``):
        nothing is created in a namespace that does not exist. Only where namespaces are declared
        (``declare_resources``); an emulator without them has no namespaces to check against."""
        if namespace is None or "v1/namespaces" not in self.resources:
            return True
        key = (NAMESPACES, None, namespace)
        return key in self._objects and not self._objects[key].deleted

    def _info(self, resource: Any) -> Any:
        """The declared ResourceInfo, or None (kmock's ``resources[...]`` would declare it)."""
        return self.resources[resource] if resource is not None and resource in self.resources else None

    def _table_columns(self, request: rendering.Request) -> tuple[str, list[dict[str, Any]] | None]:
        plural = str(request.resource.plural) if request.resource is not None else ""
        columns = self.printer_columns.get(plural)
        core = request.resource is not None and not request.resource.group
        return plural, columns if columns is not None or core else []

    async def _serve_table(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        plural, columns = self._table_columns(request)
        async with self._lock:
            objs = [
                o.raw
                for (res, ns, name), o in self._objects.items()
                if res == request.resource
                and not o.deleted
                and (request.namespace is None or ns == request.namespace)
                and (request.name is None or name == request.name)
            ]
        selects = _selection(request)
        objs = [o for o in objs if selects(o)]
        if request.name is not None and not objs:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        result = kube_kubectl.table(plural, objs, columns)
        result["metadata"]["resourceVersion"] = self._next_version()
        return aiohttp.web.json_response(result)

    # -- what kubectl asks beyond objects (kube_kubectl) ---------------------------------------------------------
    def _openapi_documents(self) -> dict[str, dict[str, Any]]:
        docs: dict[str, dict[str, Any]] = {}
        core: dict[str, tuple[str, bool]] = {}
        for key, info in self.resources.items():
            if not key.group and key.version == "v1" and info.kind and key.plural:
                core[str(info.kind)] = (str(key.plural), bool(info.namespaced))
        gv, paths, schemas = kube_kubectl.core_openapi_v3(core)
        docs[gv] = kube_kubectl.v3_document(paths, schemas)
        for crd in self.crds.values():
            gv, paths, schemas = kube_kubectl.crd_openapi_v3(crd)
            doc = docs.setdefault(gv, kube_kubectl.v3_document({}, {}))
            doc["paths"].update(paths)
            doc["components"]["schemas"].update(schemas)
        return docs

    def _serve_kubectl(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """OpenAPI documents and access reviews; ``None`` for every other request."""
        path = request.url.path.rstrip("/")
        if request.method == "GET" and path in ("/openapi/v2", "/openapi/v3"):
            docs = self._openapi_documents()
            body = kube_kubectl.v2_document(docs) if path.endswith("v2") else kube_kubectl.v3_root(docs)
            return aiohttp.web.json_response(body)
        if request.method == "GET" and path.startswith("/openapi/v3/"):
            doc = self._openapi_documents().get(path[len("/openapi/v3/"):])
            if doc is None:
                return aiohttp.web.json_response(_status(404, "NotFound", "the server could not find the "
                                                                          "requested resource"), status=404)
            return aiohttp.web.json_response(doc)
        if request.method == "POST" and path == "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews":
            return aiohttp.web.json_response(kube_kubectl.self_subject_access_review(request.data), status=201)
        return None

    def _schema_of(self, request: rendering.Request) -> dict[str, Any] | None:
        resource = request.resource
        crd = self.crds.get(str(resource.plural)) if resource is not None and resource.group else None
        if crd is None:
            return None
        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
        return schema

    def _strict_fields(self, request: rendering.Request) -> kmock.KubernetesError | dict[str, Any] | None:
        """kube-apiserver's strict field validation of a custom resource, naming each undeclared field: 400 for a
        create or update, a 422 Status (returned as is) for a patch of a stored object."""
        if request.params.get("fieldValidation") != "Strict" or not isinstance(request.data, dict):
            return None
        schema = self._schema_of(request)
        if schema is None:
            return None
        body = request.data
        if request.subresource == "status":
            body = {"status": body.get("status")} if "status" in body else {}
        fields = kube_kubectl.unknown_fields(body, schema)
        if not fields:
            return None
        if request.method == "PATCH":
            key = (request.resource, request.namespace, request.name)
            stored = self._objects[key] if key in self._objects else None  # noqa: SIM401 - ObjectsArray has no get()
            if stored is not None and not stored.deleted:
                return kube_kubectl.strict_patch_error(_merge(stored.raw, request.data), fields)
        message = kube_kubectl.strict_decoding_message(fields)
        info = self._info(request.resource)
        kind = str(info.kind) if info is not None and info.kind else str(body.get("kind", ""))
        message = f'{kind} in version "{request.resource.version}" cannot be handled as a {kind}: {message}'
        return kmock.KubernetesError(status=400, reason="BadRequest", message=message)

    async def _dry_run(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """``dryRun=All``: what the write would store, nothing stored, no watch event."""
        if not isinstance(request.data, dict):
            return await self._render_error(kmock.KubernetesError(status=400, reason="BadRequest",
                                                                  message="body must be an object"))
        obj = json.loads(json.dumps(request.data))
        meta = obj.setdefault("metadata", {})
        key = (request.resource, request.namespace, request.name or meta.get("name"))
        async with self._lock:
            stored = self._objects[key] if key in self._objects else None  # noqa: SIM401 - ObjectsArray has no get()
            current = None if stored is None or stored.deleted else json.loads(json.dumps(stored.raw))
        if request.action == enums.action.CREATE:
            if current is not None:
                return await self._render_error(kmock.KubernetesError(
                    status=409, reason="AlreadyExists",
                    message=f'{request.resource.plural}.{request.resource.group} "{meta.get("name")}" already exists'
                    if request.resource.group else f'{request.resource.plural} "{meta.get("name")}" already exists'))
            if request.namespace and not meta.get("namespace"):
                meta["namespace"] = request.namespace
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
            return aiohttp.web.json_response(obj, status=201)
        if current is None:
            return await self._render_error(kmock.KubernetesObjectNotFoundError())
        return aiohttp.web.json_response(_merge(current, obj))


def _wants_table(request: rendering.Request) -> bool:
    return "as=Table" in request.headers.get("Accept", "")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def _merge(current: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (``null`` removes a key)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(current) if isinstance(current, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


def _is_binding(request: rendering.Request) -> bool:
    resource = request.resource
    return (request.method == "POST" and request.subresource == "binding" and request.name is not None
            and resource is not None and resource.plural == "pods" and not resource.group)


def _selector_terms(selector: Any) -> list[list[str]]:
    """Equality terms of a label selector (``a=b,c==d``), the only kind the operator and the tests send."""
    if not isinstance(selector, str) or not selector:
        return []
    return [t.split("=", 1) for t in selector.replace("==", "=").split(",") if "=" in t]


def _version_number(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _matches(obj: dict[str, Any], terms: list[list[str]]) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return all(labels.get(k) == v for k, v in terms)


def _selection(request: rendering.Request) -> Any:
    """Whether an object is selected by the request's ``labelSelector`` and ``fieldSelector`` (checked in
    ``_handle``: an unsupported field was answered 400 before)."""
    labels = _selector_terms(request.params.get("labelSelector"))
    plural = str(request.resource.plural) if request.resource is not None else ""
    fields = kube_kubectl.field_selector(plural, request.params.get("fieldSelector"))
    return lambda obj: _matches(obj, labels) and kube_kubectl.fields_match(obj, fields)


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
    """Declare what the operator and kubectl discover: core namespaces/pods/events, GNNJob and GPUNode from the CRDs;
    store the namespaces a new cluster has."""
    k8s.resources["v1/namespaces"] = kmock.ResourceInfo(kind="Namespace", singular="namespace", namespaced=False,
                                                        shortnames={"ns"},
                                                        verbs={"list", "watch", "get", "create", "patch", "delete"})
    for name in ("default", "kube-system", "kube-public", "kube-node-lease"):  # kube-apiserver makes these at start
        k8s.objects["v1/namespaces", None, name] = {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "uid": f"ns-{name}", "creationTimestamp": _now(), "resourceVersion": "1",
                         "labels": {"kubernetes.io/metadata.name": name}},
            "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}
    k8s.resources["v1/pods"] = kmock.ResourceInfo(kind="Pod", singular="pod", namespaced=True, shortnames={"po"},
                                                  verbs={"list", "watch", "get", "create", "patch", "delete"},
                                                  subresources={"status", "binding", "log"})
    k8s.resources["v1/configmaps"] = kmock.ResourceInfo(kind="ConfigMap", singular="configmap", namespaced=True,
                                                        shortnames={"cm"}, verbs={"list", "get", "create", "delete"})
    k8s.resources["v1/persistentvolumeclaims"] = kmock.ResourceInfo(
        kind="PersistentVolumeClaim", singular="persistentvolumeclaim", namespaced=True, shortnames={"pvc"},
        verbs={"list", "get", "create", "delete"})
    k8s.resources["v1/events"] = kmock.ResourceInfo(kind="Event", singular="event", namespaced=True,
                                                    shortnames={"ev"}, verbs={"list", "watch", "get", "create"})
    for plural, kind in ((kube_admission.POLICY_PLURAL, "ValidatingAdmissionPolicy"),
                         (kube_admission.BINDING_PLURAL, "ValidatingAdmissionPolicyBinding")):
        k8s.resources[f"{kube_admission.ADMISSION_GROUP}/v1/{plural}"] = kmock.ResourceInfo(
            kind=kind, singular=kind.lower(), namespaced=False,
            verbs={"list", "watch", "get", "create", "patch", "delete"})
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
        k8s.crds[names["plural"]] = crd
