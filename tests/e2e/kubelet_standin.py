"""A kubelet stand-in for one node: device-plugin manager, pod workers and pod status, with local processes.

What it does, each step as kubelet does it (``pkg/kubelet``):

* **Device plugins** (``cm/devicemanager``): serves ``Registration`` on ``<plugin dir>/kubelet.sock``; on ``Register``
  it dials the plugin's endpoint, calls ``GetDevicePluginOptions`` before answering, then follows ``ListAndWatch``
  and publishes the number of healthy devices as the Node's ``capacity``/``allocatable`` of the resource
  (``setNodeStatus`` -> ``MachineInfo``'s extended resources).
* **Admission** (``devicemanager.Allocate`` at pod admission): the pod's request for the resource must be covered by
  healthy, unallocated devices, else the pod fails with ``UnexpectedAdmissionError``; devices are chosen with
  ``GetPreferredAllocation`` when the plugin offers it, then ``Allocate`` returns envs and mounts.
* **Container start** (``kuberuntime_container.go`` ``startContainer``, ``kubelet_pods.go``
  ``GenerateRunContainerOptions`` and ``makeEnvironmentVariables``): env = Allocate's envs, then the container's
  ``env`` (``value``, downward-API ``fieldRef``: ``metadata.name``, ``metadata.namespace``, ``metadata.uid``,
  ``spec.nodeName``, ``spec.serviceAccountName``, ``status.hostIP``, ``status.podIP``, and ``metadata.labels['k']``/
  ``metadata.annotations['k']``, and ``resourceFieldRef`` for ``requests``/``limits`` ``cpu``/``memory``), later
  names winning; ``command`` + ``args``; volumes (configMap files, emptyDir, persistentVolumeClaim: a directory
  shared by every node, ``<cluster root>/claims/<namespace>/<claim>``);
  the termination-message file. Init containers run first, one after another, each to success
  (``kuberuntime_manager.go`` ``computePodActions``), with ``initContainerStatuses``; a failed one fails the pod
  (``restartPolicy: Never``). ``activeDeadlineSeconds`` is enforced: past it the pod's processes are killed and it
  fails with reason ``DeadlineExceeded`` (``pkg/kubelet/active_deadline.go``).
* **Pod status** (``status/status_manager.go``, ``kubelet_pods.go`` ``generateAPIPodStatus``): ``Pending`` with the
  container ``waiting: ContainerCreating``, then ``Running`` (``startTime``, ``running.startedAt``, ``Ready``), then
  ``Succeeded``/``Failed`` for ``restartPolicy: Never`` with ``terminated`` {``exitCode``, ``reason``
  Completed/Error/OOMKilled, ``message``, ``startedAt``, ``finishedAt``}. The message is the termination-message file
  (at most 4096 bytes), or with ``FallbackToLogsOnError`` and an error exit and an empty file the log's last 80
  lines (at most 2048 bytes).
* **Deletion** (``killPod``/``killContainer``): a pod with ``deletionTimestamp`` gets SIGTERM, then SIGKILL after
  ``deletionGracePeriodSeconds``; once its containers are gone **and their terminal status is written** the kubelet
  deletes the object with grace 0 (the status manager's ``canBeDeleted``: a pod is removed only once the API shows
  its final status, so the DELETED event carries how it ended).
* **Status writes** (``status_manager.go`` ``syncPod``): the object is read first and a status is never written to
  a pod of the same name with another UID ("Pod was deleted and then recreated, skipping status update"); the
  conditions the kubelet does not own (``PodScheduled``, ``DisruptionTarget`` from an eviction, any other
  controller's) are kept from the object as it is (``mergePodStatus``), the kubelet's own (``Initialized``,
  ``ContainersReady``, ``Ready``) replaced. Before, a terminal status dropped an eviction's ``DisruptionTarget``, and
  a late one could land on a pod re-created under the same name.

Without a container runtime there are no namespaces or cgroups. So:

* The container is a process group (``start_new_session``); when its main process exits, what is left of the group
  is killed, as the end of a container's PID namespace kills every process in it.
* Mounts are path mappings: every path in the command, the args and env values that starts with a mount's
  container path is rewritten to the host path (configMap and emptyDir volumes live under the pod's directory;
  the device plugin's mounts map container paths to the node's own directories). A program that builds such a
  path itself (not from its env or argv) would not see the mapping.
* No cgroup: the gate's peer check (``--peer-check cgroup``: the pod UID in ``/proc/<pid>/cgroup`` of the socket
  peer, via SO_PEERCRED) cannot match, so the local cluster runs the agents with ``--peer-check off``.
* No image: every container runs the local ``gnnsched`` (the harness' Python environment) whatever ``image`` says;
  ``images`` maps an image name to the directories of what that image adds (a user's own package), which go on the
  container's ``PYTHONPATH``, as they would be on the image's path. A user's image (``bare_images``) runs instead a
  Python with torch and PyG and no gnnsched at all (``bare_image.py``), with only its own directories on
  ``PYTHONPATH``: what a GPU pod needs of gnnsched must come from gnnsched's init container, as on a real node.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The harness forks its processes (preexec_fn) while this stand-in's gRPC threads run: gRPC's fork handlers must be
# off before grpc loads, or a child can abort in gRPC's poller before exec (see tests/conftest.py).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

import grpc  # noqa: E402
from kubeapi import ALL_PODS, NODES, PODS, Api, ApiError, now

from gnnsched.device_plugin.v1beta1 import api_pb2 as pb
from gnnsched.device_plugin.v1beta1 import api_pb2_grpc as pb_grpc

log = logging.getLogger("e2e.kubelet")

MAX_MESSAGE = 4096
KUBELET_CONDITIONS = frozenset({"Initialized", "ContainersReady", "Ready", "PodReadyToStartContainers"})
"""The pod conditions the kubelet owns and rewrites (``kubetypes.PodConditionByKubelet``); it keeps every other."""
FALLBACK_LINES = 80
FALLBACK_BYTES = 2048
HEALTHY = "Healthy"


def resource_count(pod: dict[str, Any], resource: str) -> int:
    total = 0
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(resource) or (res.get("requests") or {}).get(resource)
        if value is not None:
            total += int(value)
    return total


def field_ref(pod: dict[str, Any], path: str, host_ip: str) -> str:
    """The downward API's ``fieldRef`` values (``pkg/fieldpath`` and ``podFieldSelectorRuntimeValue``)."""
    meta = pod.get("metadata") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": (pod.get("spec") or {}).get("nodeName"),
              "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "default"),
              "status.hostIP": host_ip, "status.podIP": host_ip}
    if path in simple:
        return str(simple[path] or "")
    for prefix, source in (("metadata.labels", meta.get("labels")), ("metadata.annotations", meta.get("annotations"))):
        if path.startswith(prefix + "['") and path.endswith("']"):
            return str((source or {}).get(path[len(prefix) + 2:-2], ""))
    raise ValueError(f"unsupported fieldRef fieldPath {path!r}")


def resource_field_ref(pod: dict[str, Any], ref: dict[str, Any], allocatable: dict[str, Any]) -> str:
    """The downward API's ``resourceFieldRef`` value (``pkg/api/v1/resource/helpers.go``
    ``ExtractContainerResourceValue``): ``requests.``/``limits.`` ``cpu``/``memory`` of the named container (the one
    being started when ``containerName`` is empty) divided by ``divisor`` (default 1) and rounded up; a missing limit
    is the node's allocatable (``MergeContainerResourceLimits``), a missing request 0."""
    from gnnsched.quantity import parse_quantity

    name = ref.get("containerName") or ""
    containers = (pod.get("spec") or {}).get("containers") or []
    container = next((c for c in containers if not name or c.get("name") == name), None)
    if container is None:
        raise ValueError(f"resourceFieldRef: no container {name!r} in the pod")
    kind, _, resource = str(ref.get("resource", "")).partition(".")
    if kind not in ("requests", "limits") or resource not in ("cpu", "memory"):
        raise ValueError(f"unsupported resourceFieldRef resource {ref.get('resource')!r}")
    value = ((container.get("resources") or {}).get(kind) or {}).get(resource)
    if value is None:
        value = allocatable.get(resource, "0") if kind == "limits" else "0"
    divisor = parse_quantity(str(ref.get("divisor") or "1"))
    if divisor <= 0:
        raise ValueError(f"resourceFieldRef divisor must be positive, got {ref.get('divisor')!r}")
    return str(math.ceil(parse_quantity(str(value)) / divisor))


class _Registration(pb_grpc.RegistrationServicer):
    def __init__(self, kubelet: KubeletStandIn) -> None:
        self.k = kubelet

    def Register(self, request: Any, context: Any) -> Any:  # noqa: N802 - gRPC method name
        return self.k.register(request, context)


@dataclass
class _Plugin:
    resource: str
    stub: Any
    channel: Any
    options: Any
    devices: dict[str, str] = field(default_factory=dict)  # ID -> health


@dataclass
class _Container:
    pod_uid: str
    proc: subprocess.Popen[bytes] | None = None
    started_at: str | None = None
    devices: list[str] = field(default_factory=list)
    done: bool = False
    terminating: bool = False
    reported: bool = False  # its terminal status is written (or there is none to write): the pod may be deleted now


class KubeletStandIn:
    """One node's kubelet. ``start()`` serves the registration socket and the pod loop; ``stop()`` kills its pods."""

    def __init__(self, api: Api, node_name: str, node_dir: Path, plugin_dir: Path, base_env: dict[str, str],
                 on_event: Callable[[str, dict[str, Any], str], None], poll: float = 0.2,
                 host_ip: str = "127.0.0.1", images: dict[str, list[str]] | None = None,
                 bare_images: frozenset[str] = frozenset(), bare_bin: Path | None = None) -> None:
        self.api = api
        self.images = images or {}  # image -> directories its Python finds beyond the harness' (its own packages)
        # images whose Python has torch and PyG but no gnnsched (bare_image.py), run with the Python in bare_bin
        self.bare_images = bare_images
        self.bare_bin = bare_bin
        if bare_images and bare_bin is None:
            raise ValueError("bare_images need bare_bin (bare_image.make_bare_python)")
        self.node = node_name
        self.dir = node_dir
        self.plugin_dir = plugin_dir
        self.base_env = base_env
        self.on_event = on_event
        self.poll = poll
        self.host_ip = host_ip
        self._lock = threading.Lock()
        self._plugins: dict[str, _Plugin] = {}
        self._allocated: dict[str, set[str]] = {}  # resource -> device IDs in use
        self._containers: dict[str, _Container] = {}
        self._server: grpc.Server | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.registrations = 0

    # -- device plugin manager ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        sock = self.plugin_dir / "kubelet.sock"
        sock.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_RegistrationServicer_to_server(_Registration(self), server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        self._server = server
        loop = threading.Thread(target=self._loop, name=f"kubelet-{self.node}", daemon=True)
        loop.start()
        self._threads.append(loop)

    def register(self, request: Any, context: Any) -> Any:
        if request.version != "v1beta1":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unsupported API version {request.version!r}")
        channel = grpc.insecure_channel(f"unix://{self.plugin_dir / request.endpoint}")
        stub = pb_grpc.DevicePluginStub(channel)
        try:
            options = stub.GetDevicePluginOptions(pb.Empty(), timeout=5)
        except grpc.RpcError as exc:
            channel.close()
            context.abort(grpc.StatusCode.UNAVAILABLE, f"cannot reach plugin: {exc.code().name}")
        plugin = _Plugin(resource=request.resource_name, stub=stub, channel=channel, options=options)
        with self._lock:
            old = self._plugins.get(request.resource_name)
            self._plugins[request.resource_name] = plugin
            self._allocated.setdefault(request.resource_name, set())
            self.registrations += 1
        if old is not None:
            old.channel.close()
        stream = stub.ListAndWatch(pb.Empty())
        t = threading.Thread(target=self._watch_devices, args=(plugin, stream), daemon=True,
                             name=f"kubelet-{self.node}-law")
        t.start()
        self._threads.append(t)
        return pb.Empty()

    def _watch_devices(self, plugin: _Plugin, stream: Any) -> None:
        try:
            for resp in stream:
                with self._lock:
                    plugin.devices = {d.ID: d.health for d in resp.devices}
                self._publish_capacity(plugin)
        except grpc.RpcError:
            pass  # the plugin went away; it re-registers when it comes back
        with self._lock:
            if self._plugins.get(plugin.resource) is plugin:
                plugin.devices = {}
        if not self._stop.is_set():
            self._publish_capacity(plugin)

    def _publish_capacity(self, plugin: _Plugin) -> None:
        with self._lock:
            healthy = sum(1 for h in plugin.devices.values() if h == HEALTHY)
            total = len(plugin.devices)
        try:
            self.api.patch(f"{NODES}/{self.node}/status", {"status": {
                "capacity": {plugin.resource: str(total)}, "allocatable": {plugin.resource: str(healthy)}}})
        except ApiError as exc:
            log.warning("%s: cannot publish %s capacity: %s", self.node, plugin.resource, exc)

    # -- pod loop ----------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except ApiError as exc:
                log.debug("%s: API unavailable (%s)", self.node, exc)
            except Exception:
                log.exception("%s: kubelet stand-in sync failed", self.node)
            self._stop.wait(self.poll)

    def sync(self) -> None:
        pods = [p for p in self.api.items(ALL_PODS) if (p.get("spec") or {}).get("nodeName") == self.node]
        for pod in pods:
            uid = pod["metadata"]["uid"]
            with self._lock:
                known = self._containers.get(uid)
            deleting = bool(pod["metadata"].get("deletionTimestamp"))
            phase = (pod.get("status") or {}).get("phase")
            if known is None:
                if phase in ("Succeeded", "Failed"):
                    if deleting:
                        self._finish_delete(pod)
                    continue
                container = _Container(pod_uid=uid)
                with self._lock:
                    self._containers[uid] = container
                if deleting:
                    container.done = True
                    self._finish_delete(pod)
                    continue
                t = threading.Thread(target=self._run_pod, args=(pod, container), daemon=True,
                                     name=f"pod-{pod['metadata']['name']}")
                t.start()
                self._threads.append(t)
            elif deleting and not known.terminating:
                known.terminating = True
                threading.Thread(target=self._kill, args=(pod, known), daemon=True).start()
            elif deleting and known.done and phase in ("Succeeded", "Failed"):
                self._finish_delete(pod)

    def _path(self, pod: dict[str, Any]) -> str:
        return f"{PODS.format(ns=pod['metadata'].get('namespace', 'default'))}/{pod['metadata']['name']}"

    def _finish_delete(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(ApiError):
            self.api.delete(self._path(pod), grace_seconds=0)

    def _status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        """Write ``status`` to ``pod`` as the status manager does (module docstring): only to the same pod (UID), with
        the conditions the kubelet does not own kept from the object."""
        name = pod["metadata"]["name"]
        try:
            current = self.api.get_or_none(self._path(pod))
            if current is None or (current.get("metadata") or {}).get("uid") != pod["metadata"]["uid"]:
                log.debug("%s: pod %s was deleted (and maybe re-created): its status is not written", self.node, name)
                return
            if "conditions" in status:
                mine = {c.get("type") for c in status["conditions"]} | KUBELET_CONDITIONS
                kept = [c for c in (current.get("status") or {}).get("conditions") or [] if c.get("type") not in mine]
                status = {**status, "conditions": [*kept, *status["conditions"]]}
            self.api.patch(self._path(pod) + "/status", {"status": status})
        except ApiError as exc:
            log.debug("%s: status of %s not written: %s", self.node, name, exc)

    def _conditions(self, pod: dict[str, Any], ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
        """The kubelet's own conditions (the others are kept from the object by :meth:`_status`)."""
        stamp = now()
        out = [{"type": "Initialized", "status": "True", "lastTransitionTime": stamp}]
        for kind in ("ContainersReady", "Ready"):
            cond = {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": stamp}
            if not ready and reason:
                cond["reason"] = reason
            out.append(cond)
        return out

    # -- one pod ---------------------------------------------------------------------------------------------
    def _launch(self, pod: dict[str, Any], c: dict[str, Any], pod_dir: Path, mounts: dict[str, str],
                allocated_env: dict[str, str]) -> tuple[list[str], dict[str, str], Path]:
        """argv, env and termination-message file of one container (its volumes added to ``mounts``; the device
        plugins' ``allocated_env`` under the container's own env, as kubelet orders them)."""
        cdir = pod_dir / "containers" / c.get("name", "main")
        cdir.mkdir(parents=True, exist_ok=True)
        mounts = {**mounts, **self._volumes(pod, pod_dir, c)}
        term_path = c.get("terminationMessagePath", "/dev/termination-log")
        term_file = cdir / "termination-log"
        term_file.write_bytes(b"")
        mounts[term_path] = str(term_file)
        env = dict(self.base_env)
        env["HOSTNAME"] = pod["metadata"]["name"]
        env["HOME"] = str(pod_dir)
        content = self.images.get(str(c.get("image", "")))
        if str(c.get("image", "")) in self.bare_images:  # torch, PyG and its own packages; nothing of gnnsched
            from bare_image import bare_env

            assert self.bare_bin is not None
            env = bare_env(env, self.bare_bin, list(content or []))
        elif content:  # what the image holds beyond the harness' environment (its own packages)
            env["PYTHONPATH"] = os.pathsep.join([*content, *filter(None, [env.get("PYTHONPATH")])])
        env.update(allocated_env)
        for item in c.get("env") or []:
            if "value" in item:
                env[item["name"]] = str(item["value"])
            elif (item.get("valueFrom") or {}).get("fieldRef"):
                env[item["name"]] = field_ref(pod, item["valueFrom"]["fieldRef"]["fieldPath"], self.host_ip)
            elif (item.get("valueFrom") or {}).get("resourceFieldRef"):
                node = self.api.get(f"{NODES}/{self.node}")
                env[item["name"]] = resource_field_ref(pod, item["valueFrom"]["resourceFieldRef"],
                                                       (node.get("status") or {}).get("allocatable") or {})
            else:
                raise ValueError(f"env {item.get('name')}: only value, fieldRef and resourceFieldRef are "
                                 "supported here")
        argv = [*(c.get("command") or []), *(c.get("args") or [])]
        if not argv:
            raise ValueError("container has no command (no image entrypoint without a container runtime)")
        return [_map(a, mounts) for a in argv], {k: _map(v, mounts) for k, v in env.items()}, term_file

    def _exec(self, container: _Container, c: dict[str, Any], argv: list[str], env: dict[str, str],
              pod_dir: Path) -> bool:
        """Start one container's process; False when the pod was deleted before it started."""
        log_file = pod_dir / "containers" / c.get("name", "main") / "0.log"
        with log_file.open("ab") as out:
            if container.terminating:  # deleted while being created
                return False
            container.proc = subprocess.Popen(argv, env=env, cwd=str(pod_dir), stdout=out, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, start_new_session=True)
        container.started_at = now()
        return True

    def _wait(self, container: _Container, deadline: float | None) -> tuple[int, bool]:
        """The container's exit code, killing its group at the pod's active deadline (the kubelet's
        ``activeDeadlineSeconds`` check: the pod fails with reason ``DeadlineExceeded``)."""
        assert container.proc is not None
        expired = False
        try:
            code = container.proc.wait(timeout=None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            expired = True
            _kill_group(container.proc.pid, signal.SIGKILL)
            code = container.proc.wait()
        _kill_group(container.proc.pid, signal.SIGKILL)  # the container's PID namespace ends with its main process
        return code, expired

    def _run_pod(self, pod: dict[str, Any], container: _Container) -> None:
        spec = pod.get("spec") or {}
        c = (spec.get("containers") or [{}])[0]
        inits = spec.get("initContainers") or []
        cname = c.get("name", "main")
        pod_dir = self.dir / "pods" / pod["metadata"]["uid"]
        pod_dir.mkdir(parents=True, exist_ok=True)
        start_time = now()
        active = spec.get("activeDeadlineSeconds")
        deadline = time.monotonic() + float(active) if isinstance(active, (int, float)) else None
        # name, image, imageID, ready and restartCount are required fields of a ContainerStatus
        waiting = {"name": cname, "image": c.get("image", ""), "imageID": "", "ready": False, "restartCount": 0,
                   "state": {"waiting": {"reason": "PodInitializing" if inits else "ContainerCreating"}}}
        init_statuses = [{"name": ic.get("name", f"init-{i}"), "image": ic.get("image", ""), "imageID": "",
                          "ready": False, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}
                         for i, ic in enumerate(inits)]
        base = {"phase": "Pending", "hostIP": self.host_ip, "startTime": start_time,
                "conditions": self._conditions(pod, False, "ContainersNotReady"), "containerStatuses": [waiting]}
        if inits:
            base["initContainerStatuses"] = init_statuses
        self._status(pod, base)

        def fail(reason: str, message: str, statuses: dict[str, Any]) -> None:
            self._release(container)
            container.done = True
            self._status(pod, {"phase": "Failed", "reason": reason, "message": message,
                               "conditions": self._conditions(pod, False, "PodFailed"), **statuses})
            container.reported = True
            self.on_event("failed", pod, message)

        try:
            # init containers run one after another, each to success, before the app container is created
            # (kuberuntime_manager.go computePodActions: the next init container only after the previous succeeded)
            for i, ic in enumerate(inits):
                argv, env, term_file = self._launch(pod, ic, pod_dir, {}, {})
                if not self._exec(container, ic, argv, env, pod_dir):
                    container.done = container.reported = True  # deleted while starting: nothing ran to report
                    return
                started = container.started_at
                init_statuses[i]["state"] = {"running": {"startedAt": started}}
                self._status(pod, {"initContainerStatuses": init_statuses})
                code, expired = self._wait(container, deadline)
                message = term_file.read_bytes()[:MAX_MESSAGE].decode(errors="replace")
                done = {"exitCode": code if code >= 0 else 128 - code, "startedAt": started, "finishedAt": now(),
                        "reason": "Completed" if code == 0 else "Error", **({"message": message} if message else {})}
                init_statuses[i]["state"] = {"terminated": done}
                if expired:
                    fail("DeadlineExceeded", "Pod was active on the node longer than the specified deadline",
                         {"initContainerStatuses": init_statuses})
                    return
                if code != 0:
                    fail("", f"init container {init_statuses[i]['name']} failed",
                         {"initContainerStatuses": init_statuses})
                    return
            envs, mounts = self._allocate(pod, container)
            argv, env, term_file = self._launch(pod, c, pod_dir, mounts, envs)
        except (ApiError, ValueError, OSError, grpc.RpcError) as exc:
            message = str(exc) if not isinstance(exc, grpc.RpcError) else f"{exc.code().name}: {exc.details()}"
            fail("UnexpectedAdmissionError", message, {"containerStatuses": [{**waiting, "state": {"terminated": {
                "exitCode": 128, "reason": "StartError", "message": message[:MAX_MESSAGE],
                "startedAt": start_time, "finishedAt": now()}}}]})
            return
        if not self._exec(container, c, argv, env, pod_dir):
            container.done = container.reported = True  # deleted while starting: nothing ran to report
            return
        assert container.proc is not None
        waiting["containerID"] = f"local://{container.proc.pid}"
        ready = {"phase": "Running", "conditions": self._conditions(pod, True),
                 "containerStatuses": [{**waiting, "ready": True, "started": True,
                                        "state": {"running": {"startedAt": container.started_at}}}]}
        if inits:
            ready["initContainerStatuses"] = init_statuses
        self._status(pod, ready)
        self.on_event("running", pod, "")
        code, expired = self._wait(container, deadline)
        finished = now()
        message = term_file.read_bytes()[:MAX_MESSAGE].decode(errors="replace")
        log_file = pod_dir / "containers" / cname / "0.log"
        if not message.strip() and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            message = _log_tail(log_file)
        if code < 0:
            exit_code = 128 - code  # killed by signal N: 128 + N, as the runtime reports it
            reason = "Error"
        else:
            exit_code = code
            reason = "Completed" if code == 0 else "Error"
        self._release(container)
        container.done = True
        terminated = {"exitCode": exit_code, "reason": reason, "startedAt": container.started_at,
                      "finishedAt": finished}
        if message:
            terminated["message"] = message
        phase = "Succeeded" if exit_code == 0 and not expired else "Failed"
        final: dict[str, Any] = {"phase": phase, "conditions": self._conditions(pod, False, "PodCompleted"),
                                 "containerStatuses": [{**waiting, "ready": False, "started": False,
                                                        "state": {"terminated": terminated}}]}
        if expired:
            final.update(reason="DeadlineExceeded",
                         message="Pod was active on the node longer than the specified deadline")
        self._status(pod, final)
        container.reported = True
        self.on_event("finished", pod, f"{phase} exit {exit_code}")
        if container.terminating:
            self._finish_delete(pod)

    def _kill(self, pod: dict[str, Any], container: _Container) -> None:
        """SIGTERM, the grace period, SIGKILL; then the final delete (the pod worker's ``killPod``)."""
        grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or
                    (pod.get("spec") or {}).get("terminationGracePeriodSeconds") or 30)
        proc = container.proc
        if proc is not None and proc.poll() is None:
            self.on_event("killing", pod, f"SIGTERM, grace {grace}s")
            _kill_group(proc.pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            if proc.poll() is None:
                _kill_group(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while not container.reported and time.monotonic() < deadline:  # its final status first, then the delete
            time.sleep(0.05)
        self._finish_delete(pod)

    def _allocate(self, pod: dict[str, Any], container: _Container) -> tuple[dict[str, str], dict[str, str]]:
        envs: dict[str, str] = {}
        mounts: dict[str, str] = {}
        with self._lock:
            plugins = dict(self._plugins)
        for resource, plugin in plugins.items():
            want = resource_count(pod, resource)
            if want == 0:
                continue
            with self._lock:
                free = sorted(i for i, h in plugin.devices.items() if h == HEALTHY and i not in
                              self._allocated[resource])
            if len(free) < want:
                raise ValueError(f"Allocate failed due to requested number of devices unavailable for {resource}. "
                                 f"Requested: {want}, Available: {len(free)}, which is unexpected")
            ids = free[:want]
            if plugin.options.get_preferred_allocation_available:
                pref = plugin.stub.GetPreferredAllocation(pb.PreferredAllocationRequest(container_requests=[
                    pb.ContainerPreferredAllocationRequest(available_deviceIDs=free, must_include_deviceIDs=[],
                                                           allocation_size=want)]), timeout=10)
                chosen = list(pref.container_responses[0].deviceIDs)
                if len(chosen) == want and set(chosen) <= set(free):
                    ids = chosen
            with self._lock:
                self._allocated[resource].update(ids)
            container.devices.extend(f"{resource}={i}" for i in ids)
            resp = plugin.stub.Allocate(pb.AllocateRequest(container_requests=[
                pb.ContainerAllocateRequest(devices_ids=ids)]), timeout=10)
            cresp = resp.container_responses[0]
            envs.update(dict(cresp.envs))
            for m in cresp.mounts:
                if not Path(m.host_path).exists():
                    raise ValueError(f"Allocate mount {m.container_path}: host path {m.host_path} does not exist")
                mounts[m.container_path] = m.host_path
            if len(cresp.devices):
                raise ValueError("Allocate returned device specs, which need a container runtime")
        return envs, mounts

    def _release(self, container: _Container) -> None:
        with self._lock:
            for item in container.devices:
                resource, _, dev = item.partition("=")
                self._allocated.get(resource, set()).discard(dev)
            container.devices = []

    def _volumes(self, pod: dict[str, Any], pod_dir: Path, c: dict[str, Any]) -> dict[str, str]:
        vols = {v["name"]: v for v in (pod.get("spec") or {}).get("volumes") or []}
        mounts: dict[str, str] = {}
        ns = pod["metadata"].get("namespace", "default")
        for vm in c.get("volumeMounts") or []:
            vol = vols.get(vm["name"])
            if vol is None:
                raise ValueError(f"volumeMounts {vm['name']}: no such volume")
            host = pod_dir / "volumes" / vm["name"]
            host.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                cm = self.api.get(f"/api/v1/namespaces/{ns}/configmaps/{vol['configMap']['name']}")
                data = cm.get("data") or {}
                items = vol["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                for item in items:
                    (host / item["path"]).write_text(data[item["key"]])
            elif "persistentVolumeClaim" in vol:
                # A claim is a directory every node of the local cluster shares (as a ReadWriteMany volume is), kept
                # under the cluster's root by namespace and claim name; the claim must exist, as kubelet requires.
                claim = vol["persistentVolumeClaim"]["claimName"]
                self.api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
                host = self.dir.parent / "claims" / ns / claim
                host.mkdir(parents=True, exist_ok=True)
            elif "emptyDir" not in vol:
                raise ValueError(f"volume {vm['name']}: only configMap, emptyDir and persistentVolumeClaim volumes "
                                 "are supported here")
            mounts[vm["mountPath"]] = str(host)
        return mounts

    # -- shutdown ------------------------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            containers = list(self._containers.values())
            plugins = list(self._plugins.values())
        for cont in containers:
            if cont.proc is not None and cont.proc.poll() is None:
                _kill_group(cont.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        for cont in containers:
            if cont.proc is None:
                continue
            while cont.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            _kill_group(cont.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                cont.proc.wait(timeout=5)
        for p in plugins:
            p.channel.close()
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
        (self.plugin_dir / "kubelet.sock").unlink(missing_ok=True)

    def device_health(self, resource: str) -> dict[str, str]:
        """Device ID -> health, as the plugin of ``resource`` last sent it in ListAndWatch (empty: none registered)."""
        with self._lock:
            plugin = self._plugins.get(resource)
            return dict(plugin.devices) if plugin is not None else {}

    def all_pids(self) -> list[int]:
        """The process-group ids of every container this kubelet started (for the orphan check)."""
        with self._lock:
            return [c.proc.pid for c in self._containers.values() if c.proc is not None]


def _map(value: str, mounts: dict[str, str]) -> str:
    """Rewrite a container path to the host path of the longest mount that contains it."""
    best = ""
    for container_path in mounts:
        cp = container_path.rstrip("/")
        if (value == cp or value.startswith(cp + "/")) and len(cp) > len(best):
            best = cp
    if not best:
        return value
    host = next(h for cp, h in mounts.items() if cp.rstrip("/") == best)
    return host + value[len(best):]


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _log_tail(path: Path) -> str:
    try:
        lines = path.read_bytes().splitlines()[-FALLBACK_LINES:]
    except OSError:
        return ""
    text = b"\n".join(lines)[-FALLBACK_BYTES:]
    return text.decode(errors="replace")
