"""Keeps the cache in step with the cluster: watches ``GPUNode``, ``Node``, ``GNNJob`` (whose status holds its pod's
facts: ``gnnsched.trust.job_facts``) and gnnsched pods in background threads.

Nothing here runs in a request: kube-scheduler's calls read the cache only. Start-up lists all three kinds first
(the pods through ``ClusterCache.rebuild`` so reservations come back in their original order), marks the service
ready, then follows each watch from the list's resourceVersion, relisting on ``410 Gone`` or a broken stream.

Scope: pods are those whose ``spec.schedulerName`` is gnnsched's; their CPU/memory requests are what the
extender's CPU/memory check subtracts from a node's allocatable. Pods of other schedulers are not watched (at
5,000 nodes that stream is large); kube-scheduler's own NodeResourcesFit, which runs before the extender, still
accounts for them.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from gnnsched.contract import GNNJOB_PLURAL, GPUNODE_PLURAL, GROUP, SCHEDULER_NAME, VERSION, GPUNodeStatus

from .cache import ClusterCache, node_allocatable

log = logging.getLogger("gnnsched.extender.watcher")


def _status_of(obj: dict) -> GPUNodeStatus | None:
    status = obj.get("status")
    if not isinstance(status, dict):
        return None
    status = dict(status)
    status.setdefault("nodeName", (obj.get("metadata") or {}).get("name"))
    try:
        return GPUNodeStatus.model_validate(status)
    except ValidationError as exc:
        log.warning("ignoring GPUNode %s with invalid status: %s", status.get("nodeName"), exc)
        return None



def _resource_version(resp: Any) -> str:
    """The list's resourceVersion, to watch from (empty when the server sent no list metadata)."""
    meta = getattr(resp, "metadata", None)
    return (getattr(meta, "resource_version", None) or "") if meta is not None else ""

class ClusterWatcher:
    """List-then-watch loops for the three kinds the cache needs."""

    def __init__(self, cache: ClusterCache, api_client: Any, *, watch_timeout: int = 300) -> None:
        from kubernetes import client

        self.cache = cache
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.watch_timeout = watch_timeout
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -------------------------------------------------------------- apply one object

    def _apply_gpunode(self, obj: dict, deleted: bool) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if deleted:
            if name:
                self.cache.remove_gpunode(name)
            return
        status = _status_of(obj)
        if status is not None:
            self.cache.upsert_gpunode(status)

    def _apply_node(self, obj: dict, deleted: bool) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if not name:
            return
        if deleted:
            self.cache.upsert_node(name, 0, 0)
            return
        cpu, mem = node_allocatable(obj)
        self.cache.upsert_node(name, cpu, mem)

    def _apply_pod(self, obj: dict, deleted: bool) -> None:
        self.cache.upsert_pod(obj, deleted=deleted)

    def _apply_gnnjob(self, obj: dict, deleted: bool) -> None:
        self.cache.upsert_gnnjob(obj, deleted=deleted)

    # -------------------------------------------------------------- list / watch

    def _list_gpunodes(self) -> tuple[list[dict], str]:
        resp = self.custom.list_cluster_custom_object(GROUP, VERSION, GPUNODE_PLURAL)
        body: dict[str, Any] = resp if isinstance(resp, dict) else {}
        return body.get("items", []), (body.get("metadata") or {}).get("resourceVersion", "")

    def _list_nodes(self) -> tuple[list[dict], str]:
        resp = self.core.list_node()
        return [self.api.sanitize_for_serialization(n) for n in resp.items], _resource_version(resp)

    def _list_gnnjobs(self) -> tuple[list[dict], str]:
        resp = self.custom.list_cluster_custom_object(GROUP, VERSION, GNNJOB_PLURAL)
        body: dict[str, Any] = resp if isinstance(resp, dict) else {}
        return body.get("items", []), (body.get("metadata") or {}).get("resourceVersion", "")

    def _list_pods(self) -> tuple[list[dict], str]:
        resp = self.core.list_pod_for_all_namespaces(field_selector=f"spec.schedulerName={SCHEDULER_NAME}")
        return [self.api.sanitize_for_serialization(p) for p in resp.items], _resource_version(resp)

    def initial_sync(self) -> dict[str, str]:
        """List everything once; returns the resourceVersions to watch from."""
        nodes, rv_nodes = self._list_nodes()
        for n in nodes:
            self._apply_node(n, False)
        gpunodes, rv_gpu = self._list_gpunodes()
        for g in gpunodes:
            self._apply_gpunode(g, False)
        jobs, rv_jobs = self._list_gnnjobs()  # before the pods: a pod's facts are in its GNNJob's status
        for j in jobs:
            self._apply_gnnjob(j, False)
        pods, rv_pods = self._list_pods()
        self.cache.rebuild(pods)
        self.cache.refresh_size_mix(force=True)
        return {"nodes": rv_nodes, "gpunodes": rv_gpu, "gnnjobs": rv_jobs, "pods": rv_pods}

    def _loop(self, kind: str, rv: str) -> None:
        from kubernetes import watch
        from kubernetes.client.rest import ApiException

        funcs: dict[str, tuple[Callable, tuple, dict, Callable[[dict, bool], None], Callable]] = {
            "nodes": (self.core.list_node, (), {}, self._apply_node, self._list_nodes),
            "gpunodes": (
                self.custom.list_cluster_custom_object, (GROUP, VERSION, GPUNODE_PLURAL), {}, self._apply_gpunode,
                self._list_gpunodes,
            ),
            "gnnjobs": (
                self.custom.list_cluster_custom_object, (GROUP, VERSION, GNNJOB_PLURAL), {}, self._apply_gnnjob,
                self._list_gnnjobs,
            ),
            "pods": (
                self.core.list_pod_for_all_namespaces, (), {"field_selector": f"spec.schedulerName={SCHEDULER_NAME}"},
                self._apply_pod, self._list_pods,
            ),
        }
        func, args, kwargs, apply, relist = funcs[kind]
        while not self._stop.is_set():
            try:
                w = watch.Watch()
                for event in w.stream(func, *args, resource_version=rv, timeout_seconds=self.watch_timeout, **kwargs):
                    if self._stop.is_set():
                        w.stop()
                        return
                    obj = event.get("raw_object") or event.get("object")
                    if not isinstance(obj, dict):
                        obj = self.api.sanitize_for_serialization(obj)
                    etype = event.get("type")
                    if etype == "ERROR":
                        raise ApiException(status=(obj or {}).get("code", 500), reason=(obj or {}).get("message"))
                    new_rv = (obj.get("metadata") or {}).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    apply(obj, etype == "DELETED")
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s watch expired; relisting", kind)
                else:
                    log.warning("%s watch failed (%s); relisting in 1 s", kind, exc.status)
                    self._stop.wait(1.0)
                rv = self._relist(kind, apply, relist)
            except Exception as exc:  # broken stream: relist, never die
                log.warning("%s watch broke (%s); relisting in 1 s", kind, exc)
                self._stop.wait(1.0)
                rv = self._relist(kind, apply, relist)

    def _relist(self, kind: str, apply: Callable[[dict, bool], None], relist: Callable) -> str:
        while not self._stop.is_set():
            try:
                items, rv = relist()
                if kind == "pods":
                    self.cache.rebuild(items)
                else:
                    for item in items:
                        apply(item, False)
                return rv
            except Exception as exc:
                log.warning("relisting %s failed (%s); retrying in 2 s", kind, exc)
                self._stop.wait(2.0)
        return ""

    def start(self, service: Any) -> Callable[[], None]:
        """Background start: initial sync (retried until it works), ready, then the three watch loops."""

        def run() -> None:
            while not self._stop.is_set():
                try:
                    rvs = self.initial_sync()
                    break
                except Exception as exc:
                    log.warning("initial sync failed (%s); retrying in 2 s", exc)
                    self._stop.wait(2.0)
            else:
                return
            gc.collect()
            gc.freeze()  # the synced cache is long-lived: keep full collections from walking it (tail latency)
            service.ready = True
            for kind, rv in rvs.items():
                t = threading.Thread(target=self._loop, args=(kind, rv), name=f"watch-{kind}", daemon=True)
                t.start()
                self._threads.append(t)

        t = threading.Thread(target=run, name="watch-sync", daemon=True)
        t.start()
        self._threads.append(t)
        return self.stop

    def stop(self) -> None:
        self._stop.set()
        # Drop the open watch connections so the loops notice the stop now, not at their next event.
        with contextlib.suppress(Exception):  # best effort: the threads are daemons anyway
            self.api.rest_client.pool_manager.clear()
        deadline = time.monotonic() + 0.5  # daemon threads blocked in a stream read may outlive this
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
