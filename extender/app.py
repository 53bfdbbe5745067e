"""The FastAPI app kube-scheduler calls: ``POST /filter``, ``/prioritize``, ``/bind``; health, readiness, metrics.

Hot path: ``filter`` and ``prioritize`` receive up to thousands of node names per pod. They read the raw body
with orjson and touch only ``Pod`` and ``NodeNames`` / ``Nodes.items[].metadata.name``, do the decision in numpy
(``ClusterCache``), and write the reply with orjson. Running the 5,000-name payload through pydantic would cost
more than the decision itself; the pydantic models in ``wire`` still define the OpenAPI schema.

Errors: a request that cannot be understood never produces a 5xx. ``filter`` and ``bind`` answer HTTP 200 with
``Error`` set (kube-scheduler's convention: the pod stays unschedulable with that message); ``prioritize``,
whose reply is a bare list, answers 400 with ``{"Error": ...}`` (the scheduler logs it and scores without us).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Any

import numpy as np
import orjson
from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gnnsched.trust.job_facts import owner_name

from .binder import Binder, BindFailed
from .cache import BindError, ClusterCache
from .metrics import ExtenderMetrics
from .pods import PodDemand, PodError, parse_pod, whole_gpu
from .wire import (
    ErrorReply,
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
)

log = logging.getLogger("gnnsched.extender")

#: Pods remembered between filter/prioritize and bind (bind carries only names and the UID).
PENDING_PODS = 20_000
#: Seconds between recomputations of the job-size mix used by the fragmentation term.
SIZE_MIX_INTERVAL = 30.0
_JSON = "application/json"


class _RequestError(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _PodError(_RequestError):
    """The request is well formed but the pod itself cannot be placed by gnnsched (a missing or unparsable
    annotation): no node can help it, whatever is preempted."""

    def __init__(self, message: str, cands: _Candidates) -> None:
        super().__init__(message)
        self.cands = cands


def _field(obj: dict, name: str) -> Any:
    """Go's JSON decoder matches keys case-insensitively; so do we (exact spelling first)."""
    if name in obj:
        return obj[name]
    low = name.lower()
    for k, v in obj.items():
        if isinstance(k, str) and k.lower() == low:
            return v
    return None


class _Candidates:
    """The candidate nodes of a filter/prioritize request, in either of kube-scheduler's two shapes."""

    __slots__ = ("names", "items", "nodes_obj")

    def __init__(self, args: dict) -> None:
        names = _field(args, "NodeNames")
        nodes = _field(args, "Nodes")
        self.items: list | None = None
        self.nodes_obj: dict | None = None
        if names is not None:
            if not isinstance(names, list):
                raise _RequestError("NodeNames: must be a list of node names")
            self.names: list[str] = names  # element types are checked in rows() (only names the cache misses)
        elif nodes is not None:
            items = nodes.get("items") if isinstance(nodes, dict) else None
            if not isinstance(items, list):
                raise _RequestError("Nodes.items: must be a list of Node objects")
            out = []
            for i, item in enumerate(items):
                meta = item.get("metadata") if isinstance(item, dict) else None
                name = meta.get("name") if isinstance(meta, dict) else None
                if not isinstance(name, str) or not name:
                    raise _RequestError(f"Nodes.items[{i}].metadata.name: missing")
                out.append(name)
            self.names = out
            self.items = items
            self.nodes_obj = nodes
        else:
            raise _RequestError("NodeNames or Nodes: one is required (nodeCacheCapable true sends NodeNames)")


def _rows(cache: ClusterCache, names: list) -> np.ndarray:
    """Cache rows of the candidate names; a name that is not a string is a request error."""
    try:
        rows = cache.index_of(names)
    except TypeError:
        rows = None
    if rows is None or (rows < 0).any():
        for n in names:
            if type(n) is not str:
                raise _RequestError(f"NodeNames: {n!r} is not a node name")
    return rows  # type: ignore[return-value]


class _RecentNames:
    """The last few candidate lists and their rows.

    kube-scheduler sends the same list of names (every feasible node) for pod after pod; comparing a list of
    5,000 strings with the previous one costs a fifth of looking each name up, so a hit saves most of the
    request's Python work. Keyed also on the cache's node count: rows of known names never change, but an
    unknown name (-1) may become known when a node joins.
    """

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self._entries: list[tuple[int, list, np.ndarray, dict]] = []

    def lookup(self, cache: ClusterCache, names: list) -> tuple[np.ndarray, dict]:
        n_nodes = cache.node_count
        for i, (count, cached, cached_rows, cached_extra) in enumerate(self._entries):
            if count == n_nodes and len(cached) == len(names) and cached == names:
                if i:
                    self._entries.insert(0, self._entries.pop(i))
                return cached_rows, cached_extra
        rows = _rows(cache, names)
        extra: dict = {}
        self._entries.insert(0, (n_nodes, names, rows, extra))
        del self._entries[self.size :]
        return rows, extra


class _ScoreTemplate:
    """The prioritize reply for one list of names, with two blank bytes where each score goes.

    ``[{"Host":"node-0","Score":10},{"Host":"node-1","Score": 7}, ...]`` — JSON allows the space, so every
    score takes exactly two bytes and a reply is the template with 2 × N bytes written by numpy: no per-node
    Python work. Built once per distinct list of names (kube-scheduler repeats them).
    """

    __slots__ = ("template", "tens", "ones")

    def __init__(self, names: list[str]) -> None:
        encoded = [orjson.dumps({"Host": n, "Score": 0})[:-2] for n in names]  # b'{"Host":"x","Score":'
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) + 3  # + 2 digits + '}'
        body = b"[" + b",".join([e + b"  }" for e in encoded]) + b"]"
        # position of each entry's first digit: 1 ('[') + sum of previous entries and commas + own prefix
        starts = 1 + np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])
        self.tens = starts + lengths - 3
        self.ones = self.tens + 1
        self.template = np.frombuffer(body, dtype=np.uint8).copy()

    def render(self, scores: np.ndarray) -> bytes:
        out = self.template.copy()
        out[self.tens] = np.where(scores >= 10, ord("1"), ord(" "))
        out[self.ones] = ord("0") + scores % 10
        return out.tobytes()


def _encode_scores(names: list[str], scores: np.ndarray, memo: dict | None = None) -> bytes:
    """``[{"Host": name, "Score": s}, ...]`` for 0..10 scores, from a template kept in ``memo``."""
    if not names:
        return b"[]"
    tpl = memo.get("scores") if memo is not None else None
    if tpl is None:
        tpl = _ScoreTemplate(names)
        if memo is not None:
            memo["scores"] = tpl
    return tpl.render(np.asarray(scores, dtype=np.int64))


class ExtenderService:
    """The extender's request handling, independent of HTTP (the app below is a thin layer over it)."""

    def __init__(self, cache: ClusterCache, binder: Binder, metrics: ExtenderMetrics | None = None) -> None:
        self.cache = cache
        self.binder = binder
        self.metrics = metrics or ExtenderMetrics()
        self.ready = False
        self._pending: OrderedDict[str, tuple[PodDemand, dict]] = OrderedDict()
        self._recent = _RecentNames()

    # ---------------------------------------------------------------- helpers

    def _trusted(self, pod: Any) -> Any:
        """``pod`` with its facts as its GNNJob's status states them, or none (``gnnsched.trust.job_facts``): the
        watch's copy of the job first; a pod that names a GNNJob the copy does not trust it under (it arrived before
        the watch brought the status the operator wrote ahead of it) costs one read of that job."""
        if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
            return pod
        view, trusted = self.cache.trusted(pod)
        owner = owner_name(pod)
        if trusted or owner is None:
            return view
        job = self.binder.get_gnnjob(str(pod["metadata"].get("namespace") or "default"), owner)
        if job is None:
            return view
        self.cache.upsert_gnnjob(job)
        return self.cache.trusted(pod, job)[0]

    def _remember(self, demand: PodDemand, pod: dict) -> None:
        key = demand.key
        self._pending[key] = (demand, pod)
        self._pending.move_to_end(key)
        while len(self._pending) > PENDING_PODS:
            self._pending.popitem(last=False)

    def _parse(self, body: bytes) -> tuple[PodDemand, dict, _Candidates]:
        try:
            args = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _RequestError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(args, dict):
            raise _RequestError("request body must be a JSON object (ExtenderArgs)")
        pod = _field(args, "Pod")
        if pod is None:
            raise _RequestError("Pod: missing (ExtenderArgs.Pod is required)")
        cands = _Candidates(args)
        pod = self._trusted(pod)
        try:
            demand = whole_gpu(parse_pod(pod), self.cache.max_capacity())
        except PodError as exc:
            meta = pod.get("metadata") if isinstance(pod, dict) else None
            if isinstance(meta, dict) and isinstance(meta.get("name"), str) and meta["name"]:
                raise _PodError(str(exc), cands) from None  # a real pod whose gnnsched fields are wrong
            raise _RequestError(str(exc)) from None  # not a pod at all: the request itself is broken
        return demand, pod, cands

    # ---------------------------------------------------------------- verbs

    def filter(self, body: bytes) -> bytes:
        t0 = time.perf_counter()
        m = self.metrics
        try:
            demand, pod, cands = self._parse(body)
        except _PodError as exc:
            # Every candidate fails as unresolvable, with the reason: kube-scheduler records the message on the pod
            # and skips preemption for nodes marked UnschedulableAndUnresolvable (an Error would instead be
            # retried as a scheduling error, and a plain failure would let it preempt pods to no avail).
            m.requests.labels("filter", "unresolvable").inc()
            m.latency.labels("filter").observe(time.perf_counter() - t0)
            c = exc.cands
            reply: dict[str, Any] = {
                "FailedNodes": {}, "Error": "",
                "FailedAndUnresolvableNodes": {n: exc.message for n in c.names if isinstance(n, str)},
                "NodeNames": [] if c.items is None else None,
                "Nodes": None if c.items is None else {**(c.nodes_obj or {}), "items": []},
            }
            return orjson.dumps(reply)
        except _RequestError as exc:
            m.requests.labels("filter", "error").inc()
            m.latency.labels("filter").observe(time.perf_counter() - t0)
            return orjson.dumps({"NodeNames": None, "FailedNodes": {}, "Error": exc.message})
        self._remember(demand, pod)
        names = cands.names
        try:
            rows, _ = self._recent.lookup(self.cache, names)
        except _RequestError as exc:
            m.requests.labels("filter", "error").inc()
            return orjson.dumps({"NodeNames": None, "FailedNodes": {}, "Error": exc.message})
        out = self.cache.filter(demand, rows)
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        target = unresolvable if out.unresolvable else failed
        counts: dict[str, int] = {}
        for i, (code, msg) in out.reasons.items():
            target[names[i]] = msg
            counts[code] = counts.get(code, 0) + 1
        for code, n in counts.items():
            m.filtered_out.labels(code).inc(n)
        if out.reasons:
            keep = np.flatnonzero(out.passed).tolist()
            passed_names = [names[i] for i in keep]
        else:
            keep = None
            passed_names = names
        reply = {"FailedNodes": failed, "FailedAndUnresolvableNodes": unresolvable, "Error": ""}
        if cands.items is None:
            reply["NodeNames"] = passed_names
            reply["Nodes"] = None
        else:
            items = cands.items if keep is None else [cands.items[i] for i in keep]
            reply["Nodes"] = {**cands.nodes_obj, "items": items}  # type: ignore[dict-item]
            reply["NodeNames"] = None
        m.requests.labels("filter", "ok").inc()
        m.latency.labels("filter").observe(time.perf_counter() - t0)
        return orjson.dumps(reply)

    def prioritize(self, body: bytes) -> tuple[int, bytes]:
        t0 = time.perf_counter()
        m = self.metrics
        try:
            demand, pod, cands = self._parse(body)
        except _RequestError as exc:
            m.requests.labels("prioritize", "error").inc()
            m.latency.labels("prioritize").observe(time.perf_counter() - t0)
            return 400, orjson.dumps({"Error": exc.message})
        self._remember(demand, pod)
        names = cands.names
        try:
            rows, memo = self._recent.lookup(self.cache, names)
        except _RequestError as exc:
            m.requests.labels("prioritize", "error").inc()
            return 400, orjson.dumps({"Error": exc.message})
        reply = _encode_scores(names, self.cache.score(demand, rows), memo)
        m.requests.labels("prioritize", "ok").inc()
        m.latency.labels("prioritize").observe(time.perf_counter() - t0)
        return 200, reply

    def _bind_args(self, body: bytes) -> ExtenderBindingArgs:
        try:
            raw = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise _RequestError(f"request body is not valid JSON: {exc}") from None
        if not isinstance(raw, dict):
            raise _RequestError("request body must be a JSON object (ExtenderBindingArgs)")
        fields = {k: _field(raw, k) for k in ("PodName", "PodNamespace", "PodUID", "Node")}
        for k, v in fields.items():
            if not isinstance(v, str) or (k != "PodUID" and not v):
                raise _RequestError(f"{k}: must be a non-empty string")
        return ExtenderBindingArgs(**fields)

    def _demand_for_bind(self, args: ExtenderBindingArgs) -> tuple[PodDemand, dict | None]:
        key = f"{args.PodNamespace}/{args.PodName}"
        hit = self._pending.get(key)
        if hit is not None and (not args.PodUID or not hit[0].uid or hit[0].uid == args.PodUID):
            return hit
        pod = self.binder.get_pod(args.PodNamespace, args.PodName)
        if pod is None and hit is not None:
            raise _RequestError(
                f"PodUID: {args.PodUID} is not the uid of pod {key} seen in filter ({hit[0].uid}); was it recreated?"
            )
        if pod is None:
            raise _RequestError(f"pod {key}: not found (the extender has not seen it in filter and cannot read it)")
        pod = self._trusted(pod)
        try:
            return whole_gpu(parse_pod(pod), self.cache.max_capacity()), pod
        except PodError as exc:
            raise _RequestError(str(exc)) from None

    def reserve_for_bind(self, body: bytes) -> tuple[ExtenderBindingArgs, Any, dict | None] | bytes:
        """First half of bind (fast, no I/O): parse and reserve under the cache lock; returns an error reply
        as bytes, or what the second half (the API calls) needs."""
        m = self.metrics
        try:
            args = self._bind_args(body)
            demand, pod = self._demand_for_bind(args)
            if args.PodUID and demand.uid and args.PodUID != demand.uid:
                raise _RequestError(f"PodUID: {args.PodUID} does not match pod {demand.key} ({demand.uid})")
            if not demand.uid:
                demand = _with_uid(demand, args.PodUID or demand.key)
            res = self.cache.reserve(demand, args.Node)
        except (_RequestError, BindError) as exc:
            m.requests.labels("bind", "error").inc()
            m.binds.labels("refused").inc()
            return orjson.dumps({"Error": str(exc)})
        return args, res, pod

    def complete_bind(self, args: ExtenderBindingArgs, res: Any, pod: dict | None) -> bytes:
        """Second half of bind: the API calls (may block); releases the reservation on failure."""
        m = self.metrics
        try:
            already = self.binder.bind(args.PodNamespace, args.PodName, args.PodUID or res.uid, args.Node, res, pod)
        except Exception as exc:  # BindFailed, or anything unexpected: the capacity must not stay promised
            if not isinstance(exc, BindFailed):
                log.exception("bind of %s/%s failed", args.PodNamespace, args.PodName)
            self.cache.release(res.uid)
            if isinstance(exc, BindFailed) and exc.pod is not None:
                self.cache.upsert_pod(exc.pod)  # bound elsewhere already: that bind's reservation stands
            m.requests.labels("bind", "error").inc()
            m.binds.labels("failed").inc()
            return orjson.dumps({"Error": str(exc)})
        if already is not None:
            # A retried bind whose earlier attempt had bound the pod: the pod carries that attempt's reservation,
            # which the node agent and a restarted extender will read, so the cache keeps that one, not this one.
            self.cache.release(res.uid)
            self.cache.upsert_pod(already)
        self._pending.pop(f"{args.PodNamespace}/{args.PodName}", None)
        m.requests.labels("bind", "ok").inc()
        m.binds.labels("immediate" if res.immediate else "queued").inc()
        return orjson.dumps({"Error": ""})

    def bind(self, body: bytes) -> bytes:
        """The whole bind (may block on the API: call it from a worker thread)."""
        first = self.reserve_for_bind(body)
        if isinstance(first, bytes):
            return first
        return self.complete_bind(*first)

    def refresh_gauges(self) -> None:
        imm, queued = self.cache.reservation_counts()
        self.metrics.reservations.labels("immediate").set(imm)
        self.metrics.reservations.labels("queued").set(queued)
        self.metrics.cache_nodes.set(self.cache.node_count)


def _with_uid(d: PodDemand, uid: str) -> PodDemand:
    return replace(d, uid=uid)


class HotPathMiddleware:
    """Serves ``POST /filter`` and ``POST /prioritize`` straight from ASGI, skipping routing, dependency
    resolution and exception middleware (about 0.3 ms of CPU per request, a sixth of a pod's budget). The
    FastAPI routes below stay the documented API (OpenAPI) and answer every other method and path.

    Any unexpected exception becomes an ``Error`` reply, never a 5xx: kube-scheduler must get an answer.
    """

    def __init__(self, app: Any, service: ExtenderService) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ("/filter", "/prioritize"):
            await self.app(scope, receive, send)
            return
        chunks = []
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            if scope["path"] == "/filter":
                status, reply = 200, self.service.filter(body)
            else:
                status, reply = self.service.prioritize(body)
        except Exception as exc:  # a bug must still produce an answer the scheduler understands
            log.exception("%s failed", scope["path"])
            status = 200 if scope["path"] == "/filter" else 400
            reply = orjson.dumps({"Error": f"internal error in extender: {type(exc).__name__}: {exc}"})
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(reply))],
            }
        )
        await send({"type": "http.response.body", "body": reply})


def create_ops_app(service: ExtenderService) -> FastAPI:
    """Health, readiness and metrics on their own port (``--metrics-port``): probes and Prometheus reach them
    from the cluster network while the scheduler verbs stay on loopback."""
    ops = FastAPI(title="gnnsched extender (ops)", docs_url=None, redoc_url=None, openapi_url=None)
    _add_ops_routes(ops, service)
    return ops


def _add_ops_routes(app: FastAPI, service: ExtenderService) -> None:
    @app.get("/healthz", summary="Liveness")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", summary="Readiness: the cache is synced", responses={503: {"model": ErrorReply}})
    async def readyz() -> Response:
        if service.ready:
            return Response(orjson.dumps({"status": "ready", "nodes": service.cache.node_count}), media_type=_JSON)
        return Response(orjson.dumps({"Error": "cache not synced yet"}), status_code=503, media_type=_JSON)

    @app.get("/metrics", summary="Prometheus metrics", response_class=Response)
    async def metrics_() -> Response:
        service.refresh_gauges()
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)


def _schema_body(model: type) -> dict:
    return {
        "required": True,
        "content": {_JSON: {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}},
    }


def create_app(
    cache: ClusterCache,
    binder: Binder,
    *,
    metrics: ExtenderMetrics | None = None,
    ready: bool = True,
    background: list[Callable[[ExtenderService], Any]] | None = None,
    maintain_interval: float = 1.0,
) -> FastAPI:
    """Build the extender app over a filled (or filling) cache.

    ``background``: callables started with the app (e.g. the cluster watcher); each gets the service and may
    set ``service.ready`` once its initial sync is done. ``ready=False`` makes ``/readyz`` fail until then.
    """
    service = ExtenderService(cache, binder, metrics)
    service.ready = ready

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stops = []
        for start in background or []:
            stop = start(service)
            if stop is not None:
                stops.append(stop)

        async def maintain() -> None:
            last_mix = time.monotonic()
            while True:
                await asyncio.sleep(maintain_interval)
                try:
                    cache.expire()
                    service.refresh_gauges()
                    if time.monotonic() - last_mix >= SIZE_MIX_INTERVAL:
                        last_mix = time.monotonic()
                        await run_in_threadpool(cache.refresh_size_mix)
                except Exception:  # never let housekeeping kill the server
                    log.exception("extender maintenance failed")

        task = asyncio.create_task(maintain())
        try:
            yield
        finally:
            task.cancel()
            for stop in stops:
                with contextlib.suppress(Exception):
                    stop()

    app = FastAPI(
        title="gnnsched scheduler extender",
        version="1",
        description="kube-scheduler extender (k8s.io/kube-scheduler/extender/v1): filter, prioritize and bind "
        "GNN pods from predicted peak GPU memory, predicted runtime and GPU state.",
        lifespan=lifespan,
    )
    app.state.service = service
    app.add_middleware(HotPathMiddleware, service=service)

    @app.post(
        "/filter",
        summary="Filter candidate nodes",
        openapi_extra={"requestBody": _schema_body(ExtenderArgs)},
        responses={200: {"model": ExtenderFilterResult}},
        response_class=Response,
    )
    async def filter_(request: Request) -> Response:
        return Response(service.filter(await request.body()), media_type=_JSON)

    @app.post(
        "/prioritize",
        summary="Score candidate nodes 0..10",
        openapi_extra={"requestBody": _schema_body(ExtenderArgs)},
        responses={200: {"model": list[HostPriority]}, 400: {"model": ErrorReply}},
        response_class=Response,
    )
    async def prioritize(request: Request) -> Response:
        status, body = service.prioritize(await request.body())
        return Response(body, status_code=status, media_type=_JSON)

    @app.post(
        "/bind",
        summary="Reserve GPU capacity and bind the pod",
        openapi_extra={"requestBody": _schema_body(ExtenderBindingArgs)},
        responses={200: {"model": ExtenderBindingResult}},
        response_class=Response,
    )
    async def bind(request: Request) -> Response:
        try:
            # in a worker thread: reading an unseen pod and creating the Binding are API calls; the reservation
            # itself is atomic under the cache lock, whichever thread takes it
            body = await run_in_threadpool(service.bind, await request.body())
        except Exception as exc:  # never a 5xx: the scheduler retries on Error
            log.exception("bind failed")
            body = orjson.dumps({"Error": f"internal error in extender: {type(exc).__name__}: {exc}"})
        return Response(body, media_type=_JSON)

    _add_ops_routes(app, service)

    def openapi() -> dict:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
            comps = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in (ExtenderArgs, ExtenderBindingArgs, ExtenderFilterResult, ExtenderBindingResult, ErrorReply):
                js = model.model_json_schema(ref_template="#/components/schemas/{model}")
                for name, sub in js.pop("$defs", {}).items():
                    comps.setdefault(name, sub)
                comps[model.__name__] = js
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
