"""The emulated API server of the local cluster, run as its own process (``python tests/e2e/apiserver.py``).

It is ``tests/kube_emulator.StrictKubernetes`` (kmock made faithful where kopf and kubectl depend on it) plus the
three API-server behaviours that only show up when a scheduler and a kubelet take part, each written to what
kube-apiserver does:

* **Nodes** (``v1/nodes``, with the ``status`` subresource), so the scheduler stand-in and the extender see Node
  objects and the kubelet stand-in can publish the extended resources its device plugin advertises.
* **The binding subresource.** ``POST /api/v1/namespaces/NS/bindings`` (body ``metadata.name`` = pod) and
  ``POST .../pods/NAME/binding``. kube-apiserver (``pkg/registry/core/pod/storage/storage.go``, ``BindingREST.Create``
  -> ``assignPod`` -> ``setPodHostAndAnnotations``) sets ``spec.nodeName``, merges the Binding's annotations into the
  pod's, adds ``PodScheduled=True``, all in one guarded update, and answers 409 Conflict ("pod X is already assigned
  to node Y") when the pod already has a node; a UID in the Binding that does not match the pod's is also 409.
  kmock would store the Binding as an object of its own and leave the pod unbound.
* **Graceful pod deletion.** A DELETE of a pod that is bound to a node and not terminal does not remove it: the API
  server sets ``metadata.deletionTimestamp`` and ``deletionGracePeriodSeconds`` (the request's
  ``gracePeriodSeconds``, else the pod's ``terminationGracePeriodSeconds``, default 30) and the kubelet, after
  stopping the containers, deletes it with ``gracePeriodSeconds=0`` (``pkg/registry/core/pod/strategy.go``,
  ``CheckGracefulDelete``: unbound and terminal pods are deleted at once).

* **Eviction** (``POST .../pods/NAME/eviction``, a ``policy/v1`` Eviction: what ``kubectl drain`` sends). As
  kube-apiserver's ``EvictionREST.Create`` (``pkg/registry/core/pod/storage/eviction.go``) with the
  PodDisruptionConditions feature (GA in 1.31): the pod gets the ``DisruptionTarget`` condition (reason
  ``EvictionByEvictionAPI``, message ``Eviction API: evicting``), then the graceful deletion below, with the
  Eviction's ``deleteOptions.gracePeriodSeconds`` if any; the answer is 201 with a Success Status. This cluster has
  no PodDisruptionBudgets, so no eviction is refused with 429.

* **Pod logs** (``GET .../pods/NAME/log``, ``kubectl logs [-f]``). kube-apiserver proxies this to the pod's kubelet,
  which reads the container runtime's log file; here the server reads the file the kubelet stand-in writes the
  container's output to (``NODE_ROOT/<node>/pods/<uid>/containers/<container>/0.log``, ``--node-root``).
  ``follow=true`` streams it until the pod is terminal or gone; ``tailLines`` and ``container`` are honoured.

* **Who asks, and what the admission policies allow** (``--token-auth-file``): each bearer token names a user, and
  the stored ValidatingAdmissionPolicies are enforced before any of the routes above (``kube_emulator``,
  ``kube_admission``).

Usage: ``apiserver.py --url-file FILE [--node-root DIR] [--token-auth-file FILE]`` writes ``http://127.0.0.1:PORT``
to FILE once it serves, then runs until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import kmock
from kmock._internal import enums, rendering

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from kube_emulator import StrictKubernetes, declare_resources  # noqa: E402

DEFAULT_GRACE_SECONDS = 30
FOLLOW_POLL_SECONDS = 0.2


def _now() -> str:
    return datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(code: int, reason: str, message: str) -> aiohttp.web.Response:
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 400 else "Success",
            "message": message, "reason": reason, "code": code}
    return aiohttp.web.json_response(body, status=code)


@attrs.define(kw_only=True)
class ClusterAPI(StrictKubernetes):
    """StrictKubernetes with Nodes, pod binding, graceful pod deletion and pod logs (see the module docstring)."""

    # Where the kubelet stand-ins keep their nodes' pod directories (``<node-root>/<node>/pods/<uid>``); None: no logs.
    node_root: Path | None = attrs.field(default=None)

    async def _handle(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        refused = self._admit(request)  # authentication and admission policies come before every route below
        if refused is not None:
            return refused
        res = request.resource
        if res is not None and res.group == "" and res.version == "v1":
            if (request.method == "GET" and res.plural == "pods" and request.subresource == "log"
                    and request.name is not None):
                return await self._pod_log(request)
            if request.action == enums.action.CREATE and (
                res.plural == "bindings" or (res.plural == "pods" and request.subresource == "binding")
            ):
                return await self._bind(request)
            if (request.method == "POST" and res.plural == "pods" and request.subresource == "eviction"
                    and request.name is not None):  # kmock sees a POST to a named object as no action at all
                return await self._evict(request)
            if (request.action == enums.action.DELETE and res.plural == "pods" and request.name is not None
                    and request.subresource is None):
                answer = await self._delete_pod(request)
                if answer is not None:
                    return answer
        return await super()._handle(request)

    def _pod_key(self, namespace: str | None, name: str) -> Any:
        for key in self._objects:
            resource, ns, obj_name = key
            if resource.plural == "pods" and resource.group == "" and ns == namespace and obj_name == name:
                return key
        return None

    async def _publish(self, key: Any, changes: dict[str, Any]) -> dict[str, Any]:
        changes.setdefault("metadata", {})["resourceVersion"] = self._next_version()
        self._objects[key].patch(changes)
        raw = self._objects[key].raw
        await self._buses[key[0]].put({"type": "MODIFIED", "object": raw})
        return dict(raw)

    async def _bind(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        body = request.data if isinstance(request.data, dict) else {}
        meta = body.get("metadata") or {}
        name = request.name if request.subresource == "binding" else meta.get("name")
        target = (body.get("target") or {}).get("name")
        if not name or not target:
            return _status(400, "BadRequest", "binding needs metadata.name and target.name")
        async with self._write_lock, self._lock:
            key = self._pod_key(request.namespace, name)
            if key is None or self._objects[key].deleted:
                return _status(404, "NotFound", f'pods "{name}" not found')
            pod = self._objects[key].raw
            pmeta = pod.get("metadata") or {}
            if meta.get("uid") and meta["uid"] != pmeta.get("uid"):
                return _status(409, "Conflict", f"Operation cannot be fulfilled on pods/binding \"{name}\": "
                                                 f"Precondition failed: UID in precondition: {meta['uid']}, "
                                                 f"UID in object meta: {pmeta.get('uid')}")
            if pmeta.get("deletionTimestamp"):
                return _status(409, "Conflict", f"pod {name} is being deleted, cannot be assigned to a host")
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound:
                return _status(409, "Conflict", f"pod {name} is already assigned to node \"{bound}\"")
            conditions = [c for c in ((pod.get("status") or {}).get("conditions") or [])
                          if c.get("type") != "PodScheduled"]
            conditions.append({"type": "PodScheduled", "status": "True", "lastTransitionTime": _now()})
            changes: dict[str, Any] = {"spec": {"nodeName": target}, "status": {"conditions": conditions}}
            if meta.get("annotations"):
                changes["metadata"] = {"annotations": dict(meta["annotations"])}
            await self._publish(key, changes)
        return _status(201, "", "")

    async def _evict(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """An Eviction (module docstring): the DisruptionTarget condition, then the graceful deletion."""
        body = request.data if isinstance(request.data, dict) else {}
        options = body.get("deleteOptions") if isinstance(body.get("deleteOptions"), dict) else {}
        grace = options.get("gracePeriodSeconds")
        async with self._write_lock, self._lock:
            key = self._pod_key(request.namespace, str(request.name))
            if key is None or self._objects[key].deleted:
                return _status(404, "NotFound", f'pods "{request.name}" not found')
            pod = self._objects[key].raw
            status = pod.get("status") or {}
            if status.get("phase") not in ("Succeeded", "Failed") and not (pod.get("metadata") or {}).get(
                    "deletionTimestamp"):
                kept = [c for c in status.get("conditions") or [] if c.get("type") != "DisruptionTarget"]
                condition = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                             "message": "Eviction API: evicting", "lastTransitionTime": _now()}
                await self._publish(key, {"status": {"conditions": [condition, *kept]}})
        answer = await self._delete_gracefully(request.namespace, str(request.name),
                                               grace if isinstance(grace, int) else None)
        if answer is None:  # unbound or terminal: removed at once, as kmock's DELETE does
            async with self._write_lock, self._lock:
                key = self._pod_key(request.namespace, str(request.name))
                if key is not None and not self._objects[key].deleted:
                    raw = dict(self._objects[key].raw)
                    self._objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})
        return _status(201, "Success", "")

    async def _delete_pod(self, request: rendering.Request) -> aiohttp.web.StreamResponse | None:
        """The graceful part of a pod DELETE; ``None`` hands the request to kmock (remove now)."""
        grace: int | None = None
        if "gracePeriodSeconds" in request.params:
            grace = int(request.params["gracePeriodSeconds"])
        elif isinstance(request.data, dict) and request.data.get("gracePeriodSeconds") is not None:
            grace = int(request.data["gracePeriodSeconds"])
        return await self._delete_gracefully(request.namespace, str(request.name), grace)

    async def _delete_gracefully(self, namespace: str | None, name: str,
                                 grace: int | None) -> aiohttp.web.StreamResponse | None:
        """Mark a bound, running pod deleted with ``grace`` (else its own); ``None``: remove it now."""
        async with self._write_lock, self._lock:
            key = self._pod_key(namespace, name)
            if key is None or self._objects[key].deleted:
                return None
            pod = self._objects[key].raw
            meta = pod.get("metadata") or {}
            spec = pod.get("spec") or {}
            phase = (pod.get("status") or {}).get("phase")
            if grace is None:
                grace = int(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECONDS))
            if not spec.get("nodeName") or phase in ("Succeeded", "Failed") or grace == 0:
                if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                    # kmock ignores a second DELETE of an object already marked; the kubelet's final one removes it.
                    raw = dict(pod)
                    self._objects[key].delete()
                    await self._buses[key[0]].put({"type": "DELETED", "object": raw})
                    return aiohttp.web.json_response(raw)
                return None
            if meta.get("deletionTimestamp"):
                return aiohttp.web.json_response(dict(pod))  # already terminating: the shorter grace is not applied
            raw = await self._publish(key, {"metadata": {"deletionTimestamp": _now(),
                                                         "deletionGracePeriodSeconds": grace}})
        return aiohttp.web.json_response(raw)


    def _log_file(self, pod: dict[str, Any], container: str | None) -> Path | str:
        """The container's log file, or the message of the 400 the real server gives."""
        spec = pod.get("spec") or {}
        names = [c.get("name") for c in spec.get("containers") or []]
        name = container or (names[0] if len(names) == 1 else None)
        pod_name = (pod.get("metadata") or {}).get("name")
        if name is None:
            return (f"a container name must be specified for pod {pod_name}, choose one of: "
                    f"[{' '.join(str(n) for n in names)}]")
        if name not in names:
            return f"container {name} is not valid for pod {pod_name}"
        if not spec.get("nodeName") or self.node_root is None:
            return f'container "{name}" in pod "{pod_name}" is waiting to start: ContainerCreating'
        return (self.node_root / spec["nodeName"] / "pods" / str((pod.get("metadata") or {}).get("uid"))
                / "containers" / name / "0.log")

    async def _pod_log(self, request: rendering.Request) -> aiohttp.web.StreamResponse:
        """The container's output as text; with ``follow=true`` a stream that ends when the pod is terminal."""
        key = self._pod_key(request.namespace, str(request.name))
        if key is None or self._objects[key].deleted:
            return _status(404, "NotFound", f'pods "{request.name}" not found')
        where = self._log_file(dict(self._objects[key].raw), request.params.get("container"))
        if isinstance(where, str):
            return _status(400, "BadRequest", where)
        if not where.exists():
            name = where.parent.name
            return _status(400, "BadRequest", f'container "{name}" in pod "{request.name}" is waiting to start: '
                                              "ContainerCreating")
        data = where.read_bytes()
        tail = request.params.get("tailLines")
        if tail is not None and tail.isdigit():
            lines = data.splitlines(keepends=True)
            data = b"".join(lines[len(lines) - int(tail):]) if int(tail) < len(lines) else data
        if request.params.get("follow") != "true":
            return aiohttp.web.Response(body=data, content_type="text/plain")
        response = aiohttp.web.StreamResponse(headers={"Content-Type": "text/plain"})
        assert request._raw_request is not None  # only kmock's own tests build requests without one
        await response.prepare(request._raw_request)
        offset = where.stat().st_size
        await response.write(data)
        while True:
            done = key not in self._objects or self._objects[key].deleted or (
                (self._objects[key].raw.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
            with where.open("rb") as f:
                f.seek(offset)
                more = f.read()
            if more:
                offset += len(more)
                await response.write(more)
            elif done:
                break
            else:
                await asyncio.sleep(FOLLOW_POLL_SECONDS)
        await response.write_eof()
        return response


def declare_cluster_resources(k8s: StrictKubernetes) -> None:
    """What the local cluster's clients discover: the operator's resources plus Nodes and bindings."""
    declare_resources(k8s)
    pods = k8s.resources["v1/pods"]
    k8s.resources["v1/pods"] = kmock.ResourceInfo(kind=pods.kind, singular=pods.singular, namespaced=True,
                                                  shortnames=pods.shortnames, verbs=pods.verbs,
                                                  subresources={*pods.subresources, "eviction"})
    k8s.resources["v1/nodes"] = kmock.ResourceInfo(kind="Node", singular="node", namespaced=False, shortnames={"no"},
                                                   verbs={"list", "watch", "get", "create", "patch", "delete"},
                                                   subresources={"status"})
    k8s.resources["v1/bindings"] = kmock.ResourceInfo(kind="Binding", singular="binding", namespaced=True,
                                                      verbs={"create"})


async def serve(url_file: Path, host: str = "127.0.0.1", node_root: Path | None = None,
                tokens: dict[str, dict[str, Any]] | None = None) -> None:
    """Serve until SIGTERM/SIGINT; the URL goes to ``url_file`` once requests are answered."""
    async with ClusterAPI(node_root=node_root, tokens=tokens or {}) as k8s, kmock.Server(k8s, host=host) as server:
        declare_cluster_resources(k8s)
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(str(server.url).rstrip("/"))
        tmp.replace(url_file)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url-file", type=Path, required=True, help="where to write the server's URL")
    parser.add_argument("--node-root", type=Path, help="the kubelet stand-ins' node directories (pod logs)")
    parser.add_argument("--token-auth-file", type=Path,
                        help="JSON {token: {username, uid, groups, extra}}: who each bearer token is (kube-apiserver's "
                             "--token-auth-file, with the extra a projected service-account token carries)")
    args = parser.parse_args()
    tokens = None
    if args.token_auth_file is not None:
        try:
            tokens = json.loads(args.token_auth_file.read_text())
        except (OSError, ValueError) as exc:
            parser.error(f"--token-auth-file: {exc}")
        if not isinstance(tokens, dict) or not all(isinstance(u, dict) and u.get("username")
                                                   for u in tokens.values()):
            parser.error("--token-auth-file: expected a JSON object of token -> {username, ...}")
    asyncio.run(serve(args.url_file, node_root=args.node_root, tokens=tokens))


if __name__ == "__main__":
    main()
