"""Who is on the other end of the gate socket, and how many bytes we may believe it needs.

Two independent checks, because the gate's books are only as honest as their inputs:

1. **The peer is the pod it says it is.** ``SO_PEERCRED`` gives the connecting process's pid from the kernel (a client
   cannot forge it); ``/proc/<pid>/cgroup`` names the pod's cgroup, which embeds the pod UID (``pod<uid>`` with dashes
   under the cgroupfs driver, underscores under systemd). The claimed downward-API UID must match.
2. **The bytes come from the API server, not from the client.** ``admit-bytes`` is read from the pod's annotations and
   trusted only if the pod is owned (``ownerReferences``) by a GNNJob that exists with that UID — the operator wrote
   it. A pod that writes its own ``admit-bytes`` annotation gets no credit for it: non-GNNJob pods are booked at their
   ``gpu-memory`` annotation (a user declaration, enforced by the MPS pinned-memory limit) or at a whole GPU.
"""

from __future__ import annotations

import json
import math
import re
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gnnsched.contract import (
    ANN_ADMIT_BYTES,
    ANN_EXCLUSIVE,
    ANN_GPU_MEMORY,
    ANN_INTENSITY,
    ANN_JOB,
    ANN_PREDICTED_RUNTIME,
    ANN_PRESTART,
    ANN_QOS_TARGET,
    API_VERSION,
    GNNJOB_KIND,
    GNNJOB_PLURAL,
    GROUP,
    VERSION,
    gnnjob_owner,
)
from gnnsched.fault_classes import apart_identity
from gnnsched.quantity import QuantityError, parse_bytes


class IdentityError(Exception):
    """The peer or its pod fails a check. ``reason`` is a stable label for replies and metrics."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message


# --- peer credentials ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerCred:
    pid: int
    uid: int
    gid: int


def peer_cred(sock: socket.socket) -> PeerCred | None:
    """The kernel's view of the connecting process (Linux ``SO_PEERCRED``); ``None`` where unsupported."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None or sock.family != socket.AF_UNIX:
        return None
    raw = sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return PeerCred(pid, uid, gid)


_UUID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_CGROUPFS_POD = re.compile(rf"pod({_UUID})")
_SYSTEMD_POD = re.compile(rf"(.*)-pod({_UUID})\.slice")
_QOS_CLASSES = ("burstable", "besteffort")


def _pod_in_path(path: str) -> str | None:
    """The pod UID a cgroup path places the process under, if the path has kubelet's shape; else ``None``.

    Kubelet (``pkg/kubelet/cm``: ``qos_container_manager_linux.go``, ``pod_container_manager_linux.go``,
    ``cgroup_manager_linux.go``) names a pod's cgroup ``pod<uid>`` under the node's ``kubepods`` cgroup, directly
    (Guaranteed) or under its QoS class (``burstable`` / ``besteffort``); the container's cgroup is a child of it.

    * cgroupfs driver: ``.../kubepods[/burstable|/besteffort]/pod<uid>/<container>``;
    * systemd driver: each level is a slice named after the whole path so far, with dashes in the UID turned into
      underscores (``ToSystemd`` / ``escapeSystemdCgroupName``):
      ``.../kubepods.slice[/kubepods-burstable.slice]/kubepods[-burstable]-pod<uid_>.slice/cri-...scope``; with a
      ``--cgroup-root`` (kind: ``/kubelet``) the names gain its prefix (``kubelet-kubepods-...``).

    The ``pod`` segment counts only right after the kubepods (or kubepods QoS) segment, so a ``pod<uid>`` anywhere
    else (a user's own sub-cgroup, a slice name chosen inside a container that owns its cgroup) is no identity.

    A reader in its own cgroup namespace (containerd's default on cgroup v2) sees a path outside its namespace as
    ``/../../<rest>``: the kernel hides the common ancestors. Then the first visible segments may have a hidden
    parent. A process cannot choose those segments (it can only create cgroups below its own container's), so a pod
    segment there is accepted when it is the first visible one (or the second, after a QoS class segment); a systemd
    slice name spells its whole parent chain anyway (``kubepods-burstable-pod<uid>.slice``) and is checked on it.
    """
    raw = [p for p in path.strip().split("/") if p]
    hidden = 0
    while hidden < len(raw) and raw[hidden] == "..":
        hidden += 1
    parts = raw[hidden:]
    for i, seg in enumerate(parts):
        prev = parts[i - 1] if i >= 1 else None
        m = _CGROUPFS_POD.fullmatch(seg)
        if m is not None:
            if "_" in m.group(1):
                continue  # cgroupfs keeps the UID as it is, with dashes
            if prev == "kubepods" or (prev in _QOS_CLASSES and (parts[i - 2] == "kubepods" if i >= 2 else hidden)):
                return m.group(1)
            if prev is None and hidden:
                return m.group(1)
            continue
        m = _SYSTEMD_POD.fullmatch(seg)
        if m is None or "-" in m.group(2):
            continue  # the systemd driver escapes the UID's dashes as underscores
        parent = m.group(1)
        if not (parent.endswith("kubepods") or any(parent.endswith(f"kubepods-{q}") for q in _QOS_CLASSES)):
            continue
        if prev == f"{parent}.slice" or (prev is None and hidden):
            return m.group(2)
    return None


def pod_uids_in_cgroup(text: str) -> set[str]:
    """Pod UIDs a ``/proc/<pid>/cgroup`` file places the process in (v1: one line per hierarchy, ``N:ctrl:/path``;
    v2: ``0::/path``; cgroupfs or systemd driver), dash-normalised. Only kubelet's pod positions count (see
    :func:`_pod_in_path`)."""
    found = set()
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        uid = _pod_in_path(fields[2])
        if uid is not None:
            found.add(uid.replace("_", "-").lower())
    return found


def read_proc_cgroup(pid: int, proc_root: Path = Path("/proc")) -> str:
    return (proc_root / str(pid) / "cgroup").read_text()


@dataclass(slots=True)
class PeerVerifier:
    """Checks a claimed pod UID against the peer's cgroup. ``enabled=False`` for tests and non-Linux hosts."""

    enabled: bool = True
    read_cgroup: Callable[[int], str] = read_proc_cgroup

    def verify(self, cred: PeerCred | None, claimed_uid: str) -> None:
        if not self.enabled:
            return
        if cred is None:
            raise IdentityError("no-peer-credentials", "this platform cannot identify the peer process (SO_PEERCRED)")
        try:
            text = self.read_cgroup(cred.pid)
        except OSError as exc:
            raise IdentityError("peer-unreadable", f"cannot read the cgroup of pid {cred.pid}: {exc}") from None
        found = pod_uids_in_cgroup(text)
        if found != {claimed_uid.lower()}:  # also when hierarchies disagree: one process is in one pod
            seen = ", ".join(sorted(found)) or "none"
            raise IdentityError(
                "pod-uid-mismatch", f"pid {cred.pid} claims pod {claimed_uid} but its cgroup names pod(s) {seen}"
            )


def check_peer_uid(cred: PeerCred | None, jobs_uid: int | None) -> None:
    """Refuse a peer that does not run as the jobs' UID (``jobs_uid`` None: any UID).

    Why: an MPS control daemon serves one Linux user at a time. A client of a second UID is not refused by MPS; it
    waits until every client of the first user's server has exited, which on a busy GPU can be forever. Saying so at
    the gate, with the fix, beats a pod that hangs with no message."""
    if jobs_uid is None:
        return
    if cred is None:
        raise IdentityError("no-peer-credentials", "this platform cannot tell the peer's uid (SO_PEERCRED)")
    if cred.uid != jobs_uid:
        raise IdentityError(
            "wrong-uid",
            f"pid {cred.pid} runs as uid {cred.uid}, but every gated process on this node must run as uid {jobs_uid} "
            f"(set the pod's securityContext.runAsUser to {jobs_uid}): the node's MPS control daemon serves one user "
            "at a time, so a client of another uid would wait behind the jobs' MPS server without end",
        )


# --- pods ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ContainerEnd:
    """A container that has terminated, as the pod status shows it (``state.terminated``): the exit code and the
    termination message (the result line, or the log tail under ``terminationMessagePolicy: FallbackToLogsOnError``)."""

    name: str
    exit_code: int | None
    message: str | None
    reason: str | None = None


@dataclass(slots=True)
class PodInfo:
    """The parts of a pod the gate needs, as read from the API server."""

    uid: str
    namespace: str
    name: str
    node_name: str | None = None
    phase: str = "Running"
    annotations: dict[str, str] = field(default_factory=dict)
    owner_job: str | None = None  # "<ns>/<name>" of an owning GNNJob that exists with the referenced UID
    ended: list[ContainerEnd] = field(default_factory=list)  # terminated containers (status.containerStatuses)
    # spec.containers' names, then restartable init containers' (sidecars): what a gate request's ``container`` may
    # name (node_agent.gate_checks.gate_key); empty for a pod object without a spec (a development pods file)
    containers: tuple[str, ...] = ()

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


class PodLookup(Protocol):
    """Read pods (and whether a GNNJob owns them). The cluster implementation uses the kubernetes client."""

    def get(self, namespace: str, name: str) -> PodInfo | None: ...

    def on_node(self, node_name: str) -> list[PodInfo]: ...

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None: ...


def pod_from_object(obj: dict[str, Any], job_uid: Callable[[str, str], str | None]) -> PodInfo:
    """Build ``PodInfo`` from a pod object (``dict``, API shape). ``job_uid(ns, name)`` returns the GNNJob's UID or
    ``None`` when it cannot be read; ownership counts only when it exists with the UID the pod references."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ns = str(meta.get("namespace", "default"))
    owner = gnnjob_owner(meta)
    owner_job = None
    if owner is not None:
        real = job_uid(ns, owner[0])
        if real is not None and real == owner[1]:
            owner_job = f"{ns}/{owner[0]}"
    ended = []
    for cs in status.get("containerStatuses") or []:
        term = ((cs or {}).get("state") or {}).get("terminated") if isinstance(cs, dict) else None
        if isinstance(term, dict):
            code = term.get("exitCode")
            ended.append(ContainerEnd(
                name=str(cs.get("name", "")), exit_code=code if isinstance(code, int) else None,
                message=str(term["message"]) if term.get("message") is not None else None,
                reason=str(term["reason"]) if term.get("reason") is not None else None,
            ))
    containers = tuple(str(c.get("name", "")) for c in spec.get("containers") or [] if isinstance(c, dict)) + tuple(
        str(c.get("name", "")) for c in spec.get("initContainers") or []
        if isinstance(c, dict) and c.get("restartPolicy") == "Always"
    )
    return PodInfo(
        uid=str(meta.get("uid", "")),
        namespace=ns,
        name=str(meta.get("name", "")),
        node_name=spec.get("nodeName"),
        phase=str(status.get("phase", "Running")),
        annotations={str(k): str(v) for k, v in (meta.get("annotations") or {}).items()},
        owner_job=owner_job,
        ended=ended,
        containers=containers,
    )


class FilePodLookup:
    """Pods and GNNJobs from a JSON file ``{"pods": [...], "gnnjobs": [...]}`` (API object shape), re-read on every
    call. For running the agent without a cluster (development, tests); annotations the agent writes go to the
    same file so a restarted agent sees them, as it would on the API server."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {"pods": [], "gnnjobs": []}
        return data if isinstance(data, dict) else {"pods": [], "gnnjobs": []}

    def _infos(self) -> list[PodInfo]:
        data = self._load()
        jobs = {
            (str(j.get("metadata", {}).get("namespace", "default")), str(j.get("metadata", {}).get("name"))): str(
                j.get("metadata", {}).get("uid", "")
            )
            for j in data.get("gnnjobs") or []
            if isinstance(j, dict)
        }
        return [
            pod_from_object(p, lambda ns, n: jobs.get((ns, n))) for p in data.get("pods") or [] if isinstance(p, dict)
        ]

    def get(self, namespace: str, name: str) -> PodInfo | None:
        return next((p for p in self._infos() if p.namespace == namespace and p.name == name), None)

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """The labels of Namespace ``name`` from the file's ``namespaces`` list (``--trust-domain label:<key>``);
        None when it is not listed."""
        for ns in self._load().get("namespaces") or []:
            meta = ns.get("metadata") if isinstance(ns, dict) else None
            if isinstance(meta, dict) and meta.get("name") == name:
                labels = meta.get("labels") or {}
                return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}
        return None

    def on_node(self, node_name: str) -> list[PodInfo]:
        return [p for p in self._infos() if p.node_name in (None, node_name)]

    def mutate(self, change: Callable[[dict[str, Any]], None]) -> None:
        """Read-modify-write the file under an exclusive lock (the agent and a test or tool may both write it)."""
        import fcntl

        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = self._load()
            data.setdefault("pods", [])
            data.setdefault("gnnjobs", [])
            change(data)
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        def change(data: dict[str, Any]) -> None:
            for p in data.get("pods") or []:
                meta = p.setdefault("metadata", {})
                if meta.get("namespace", "default") == namespace and meta.get("name") == name:
                    ann = meta.setdefault("annotations", {})
                    for k, v in annotations.items():
                        if v is None:
                            ann.pop(k, None)
                        else:
                            ann[k] = v

        self.mutate(change)


class KubePodLookup:
    """The in-cluster lookup (kubernetes client); tested against kmock's in-memory API server."""

    def __init__(self, api_client: Any = None) -> None:
        """``api_client``: a configured ``kubernetes.client.ApiClient`` (tests); default: in-cluster, else
        kubeconfig."""
        from kubernetes import client

        from gnnsched.kubeclient import api_client as _default_api_client

        if api_client is None:
            api_client = _default_api_client()
        self._core = client.CoreV1Api(api_client)
        self._custom = client.CustomObjectsApi(api_client)

    def _job_uid(self, namespace: str, name: str) -> str | None:
        from kubernetes.client.rest import ApiException

        try:
            obj = self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, GNNJOB_PLURAL, name)
        except ApiException:
            return None
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        if not isinstance(meta, dict):
            return None
        return str(meta.get("uid", "")) or None

    def _info(self, pod: Any) -> PodInfo:
        obj = self._core.api_client.sanitize_for_serialization(pod)
        return pod_from_object(obj, self._job_uid)

    def get(self, namespace: str, name: str) -> PodInfo | None:
        from kubernetes.client.rest import ApiException

        try:
            return self._info(self._core.read_namespaced_pod(name, namespace))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def on_node(self, node_name: str) -> list[PodInfo]:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}")
        infos = [self._info(p) for p in pods.items]
        return [p for p in infos if p.node_name == node_name]  # also when a server ignores the field selector

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}})

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """Namespace ``name``'s labels (``--trust-domain label:<key>``; needs get on namespaces); None if absent."""
        from kubernetes.client.rest import ApiException

        try:
            ns = self._core.read_namespace(name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        meta = ns.metadata
        return dict((meta.labels if meta is not None else None) or {})


@dataclass(frozen=True, slots=True)
class Demand:
    """What the gate books for a pod, and where the number came from (``admit-bytes``, ``gpu-memory``,
    ``whole-gpu``)."""

    bytes: int
    source: str
    job: str | None
    qt_seconds: float | None
    intensity: str | None
    exclusive: bool = False
    qos_seconds: float | None = None  # ANN_QOS_TARGET: an inference pod's latency target (the share rule keeps it)
    prestarted: bool = False  # ANN_PRESTART: behind gate --prestart, its start-up runs while it waits at the gate
    apart: frozenset[str] = frozenset()  # ANN_FAULT_PEERS: the jobs it may not share a GPU with (GNNJob pods only)


def trusted_demand(pod: PodInfo, whole_gpu_bytes: int) -> Demand:
    """The bytes to book for ``pod``: trusted ``admit-bytes`` only under a GNNJob owner (see module docstring).
    Whether it was prestarted (``ANN_PRESTART``) only steers the spread rule's view of its start-up: any pod's
    annotation is taken, since it books nothing."""
    demand = _demand(pod, whole_gpu_bytes)
    if pod.annotations.get(ANN_PRESTART) == "true":
        demand = replace(demand, prestarted=True)
    _, peers = apart_identity(pod.annotations, pod.owner_job)
    if peers:
        demand = replace(demand, apart=peers)
    return demand



def _demand(pod: PodInfo, whole_gpu_bytes: int) -> Demand:
    ann = pod.annotations
    qt: float | None = None
    raw_rt = ann.get(ANN_PREDICTED_RUNTIME)
    if raw_rt is not None:
        try:
            qt = float(raw_rt)
            if not qt >= 0:
                qt = None
        except ValueError:
            qt = None
    intensity = ann.get(ANN_INTENSITY) if ann.get(ANN_INTENSITY) in ("memory", "compute") else None
    qos = _qos_target(ann.get(ANN_QOS_TARGET))
    raw_x = ann.get(ANN_EXCLUSIVE)
    if raw_x is not None and raw_x not in ("true", "false"):
        raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_EXCLUSIVE}={raw_x!r} is not "
                                              "'true' or 'false'")
    if raw_x == "true":
        # Trusted from any pod: running alone only ever books more than a shared slot would, never less.
        job = ann.get(ANN_JOB, pod.owner_job) if pod.owner_job is not None else None
        return Demand(whole_gpu_bytes, "exclusive", job, qt, intensity, exclusive=True, qos_seconds=qos)
    if pod.owner_job is not None:
        raw = ann.get(ANN_ADMIT_BYTES)
        if raw is None:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_ADMIT_BYTES} is missing")
        try:
            value = int(raw)
        except ValueError:
            raise IdentityError(
                "bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_ADMIT_BYTES}={raw!r} is not an integer"
            ) from None
        if value <= 0:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_ADMIT_BYTES} must be > 0")
        return Demand(value, "admit-bytes", ann.get(ANN_JOB, pod.owner_job), qt, intensity, qos_seconds=qos)
    raw_mem = ann.get(ANN_GPU_MEMORY)
    if raw_mem is not None:
        try:
            value = parse_bytes(raw_mem)
        except QuantityError as exc:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_GPU_MEMORY}: {exc}") from None
        if value <= 0:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_GPU_MEMORY} must be > 0")
        return Demand(value, "gpu-memory", None, qt, intensity, qos_seconds=qos)
    return Demand(whole_gpu_bytes, "whole-gpu", None, qt, intensity, qos_seconds=qos)


def _qos_target(raw: str | None) -> float | None:
    """``ANN_QOS_TARGET`` as seconds: a positive finite number, else None (no target). Like the predicted runtime, an
    unreadable value is ignored rather than refused: the target only steers the share rule, it books no memory, so a
    wrong one can cost latency but never break the gate's bound."""
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if value > 0 and not math.isinf(value) else None


def gnnjob_owner_reference(name: str, uid: str) -> dict[str, Any]:
    """An ownerReference to a GNNJob (what the operator sets; used by tests and the dev pods file)."""
    return {"apiVersion": API_VERSION, "kind": GNNJOB_KIND, "name": name, "uid": uid, "controller": True}


IS_LINUX = sys.platform.startswith("linux")
