"""Who is on the other end of the gate socket, and how many bytes we may believe it needs.

Two independent checks, because the gate's books are only as honest as their inputs:

1. **The peer is the pod it says it is.** ``SO_PEERCRED`` gives the connecting process's pid from the kernel (a client
   cannot forge it); ``/proc/<pid>/cgroup`` names the pod's cgroup, which embeds the pod UID (``pod<uid>`` with dashes
   under the cgroupfs driver, underscores under systemd). The claimed downward-API UID must match.
2. **The facts come from where a tenant cannot write them.** Admit bytes, predicted runtime, intensity, QoS target
   and fault peers are read from the owning GNNJob's ``status.podFacts`` (a status subresource: only the operator
   writes it), and only when the pod's ownerReference names that job by uid and the status names this pod
   (:func:`gnnsched.trust.job_facts.resolve`). The pod's own annotations count for nothing: any pod creator can write
   them and an ownerReference. An untrusted pod is booked at its ``gpu-memory`` annotation (a user declaration about
   itself, enforced by the MPS pinned-memory limit) or at a whole GPU, with no runtime (``sqtf`` orders it last), no
   intensity, no QoS target and no fault peers.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from gnnsched.contract import (
    ANN_EXCLUSIVE,
    ANN_GPU_MEMORY,
    ANN_PRESTART,
    API_VERSION,
    GNNJOB_KIND,
    GNNJOB_PLURAL,
    GROUP,
    VERSION,
    gnnjob_owner,
)
from gnnsched.quantity import QuantityError, parse_bytes
from gnnsched.trust.job_facts import JobFacts, resolve


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
    owner_job: str | None = None  # "<ns>/<name>" of the GNNJob whose status names this pod (``facts.job``)
    facts: JobFacts | None = None  # the trusted facts from that GNNJob's status; None: an untrusted (plain) pod
    ended: list[ContainerEnd] = field(default_factory=list)  # terminated containers (status.containerStatuses)
    # spec.containers' names, then restartable init containers' (sidecars): what a gate request's ``container`` may
    # name (node_agent.gate_checks.gate_key); empty for a pod object without a spec (a development pods file)
    containers: tuple[str, ...] = ()

    @property
    def terminated(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


REQUEST_TIMEOUT = (5.0, 20.0)
"""Connect and read timeouts of every API call the agent makes (seconds). Without one, a connection the API server
never answers (a half-open socket, a server stalled under load) holds the call forever, and with it the agent's one
ordered annotation writer: every verdict queued behind it (fault records, attempt results) would never land."""


def is_permanent(exc: BaseException) -> bool:
    """Whether a failed API write would fail the same way again: the object is gone (404), or the API server refused
    the write itself (400 malformed, 403 forbidden, 409 conflict, 422 invalid). Anything else (a timeout, a reset
    connection, 429, 5xx, a file lock) is worth retrying."""
    status = getattr(exc, "status", None)
    return isinstance(status, int) and status in (400, 403, 404, 409, 422)


class PodLookup(Protocol):
    """Read pods (and whether a GNNJob owns them). The cluster implementation uses the kubernetes client."""

    def get(self, namespace: str, name: str) -> PodInfo | None: ...

    def on_node(self, node_name: str) -> list[PodInfo]: ...

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None: ...


def pod_from_object(obj: dict[str, Any], job: Callable[[str, str], dict[str, Any] | None]) -> PodInfo:
    """Build ``PodInfo`` from a pod object (``dict``, API shape). ``job(ns, name)`` returns the GNNJob object as the
    API server has it, or ``None`` when it cannot be read; the pod's facts are trusted only as
    :func:`gnnsched.trust.job_facts.resolve` says (the job's uid matches the ownerReference and its status names
    this pod)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ns = str(meta.get("namespace", "default"))
    owner = gnnjob_owner(meta)
    facts = resolve(obj, job(ns, owner[0])) if owner is not None else None
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
        owner_job=facts.job if facts is not None else None,
        facts=facts,
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
            (str(j.get("metadata", {}).get("namespace", "default")), str(j.get("metadata", {}).get("name"))): j
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

    def _job(self, namespace: str, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            obj = self._custom.get_namespaced_custom_object(GROUP, VERSION, namespace, GNNJOB_PLURAL, name,
                                                            _request_timeout=REQUEST_TIMEOUT)
        except ApiException:
            return None
        return obj if isinstance(obj, dict) else None

    def _info(self, pod: Any) -> PodInfo:
        obj = self._core.api_client.sanitize_for_serialization(pod)
        return pod_from_object(obj, self._job)

    def get(self, namespace: str, name: str) -> PodInfo | None:
        from kubernetes.client.rest import ApiException

        try:
            return self._info(self._core.read_namespaced_pod(name, namespace, _request_timeout=REQUEST_TIMEOUT))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def on_node(self, node_name: str) -> list[PodInfo]:
        pods = self._core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}",
                                                      _request_timeout=REQUEST_TIMEOUT)
        infos = [self._info(p) for p in pods.items]
        return [p for p in infos if p.node_name == node_name]  # also when a server ignores the field selector

    def annotate(self, namespace: str, name: str, annotations: dict[str, str | None]) -> None:
        self._core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                        _request_timeout=REQUEST_TIMEOUT)

    def namespace_labels(self, name: str) -> dict[str, str] | None:
        """Namespace ``name``'s labels (``--trust-domain label:<key>``; needs get on namespaces); None if absent."""
        from kubernetes.client.rest import ApiException

        try:
            ns = self._core.read_namespace(name, _request_timeout=REQUEST_TIMEOUT)
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
    qos_seconds: float | None = None  # an inference job's latency target (the share rule keeps it): trusted facts only
    prestarted: bool = False  # ANN_PRESTART: behind gate --prestart, its start-up runs while it waits at the gate
    apart: frozenset[str] = frozenset()  # the jobs it may not share a GPU with (fault peers): trusted facts only
    probation: int | None = None  # the step of its undecided fault: alone until it passes it (trusted facts only)
    probation_suspect: bool = False  # that fault was its own as the suspect: alone even when no GPU is idle


def trusted_demand(pod: PodInfo, whole_gpu_bytes: int) -> Demand:
    """What to book for ``pod``: its trusted facts (``pod.facts``, from its GNNJob's status) or, for an untrusted
    pod, the conservative defaults of the module docstring. Whether it was prestarted (``ANN_PRESTART``) only steers
    the spread rule's view of its start-up: any pod's annotation is taken, since it books nothing."""
    demand = _trusted(pod.facts, whole_gpu_bytes) if pod.facts is not None else _untrusted(pod, whole_gpu_bytes)
    if pod.annotations.get(ANN_PRESTART) == "true":
        demand = replace(demand, prestarted=True)
    return demand


def _trusted(facts: JobFacts, whole_gpu_bytes: int) -> Demand:
    if facts.exclusive:
        return Demand(whole_gpu_bytes, "exclusive", facts.job, facts.predicted_runtime_seconds, facts.intensity,
                      exclusive=True, qos_seconds=facts.qos_target_seconds, apart=facts.fault_peers)
    return Demand(facts.admit_bytes, "admit-bytes", facts.job, facts.predicted_runtime_seconds, facts.intensity,
                  qos_seconds=facts.qos_target_seconds, apart=facts.fault_peers, probation=facts.probation_step,
                  probation_suspect=facts.probation_suspect)


def _untrusted(pod: PodInfo, whole_gpu_bytes: int) -> Demand:
    """A pod no GNNJob status names: no runtime (``sqtf`` admits it after every pod with one), no intensity, no QoS
    target, no job and no fault peers, whatever its annotations say. Its bytes are its own declaration about itself
    (``gpu-memory``), else a whole GPU; ``exclusive`` is honoured because running alone only ever books more."""
    ann = pod.annotations
    raw_x = ann.get(ANN_EXCLUSIVE)
    if raw_x is not None and raw_x not in ("true", "false"):
        raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_EXCLUSIVE}={raw_x!r} is not "
                                              "'true' or 'false'")
    if raw_x == "true":
        return Demand(whole_gpu_bytes, "exclusive", None, None, None, exclusive=True)
    raw_mem = ann.get(ANN_GPU_MEMORY)
    if raw_mem is not None:
        try:
            value = parse_bytes(raw_mem)
        except QuantityError as exc:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_GPU_MEMORY}: {exc}") from None
        if value <= 0:
            raise IdentityError("bad-annotation", f"pod {pod.namespace}/{pod.name}: {ANN_GPU_MEMORY} must be > 0")
        return Demand(value, "gpu-memory", None, None, None)
    return Demand(whole_gpu_bytes, "whole-gpu", None, None, None)


def gnnjob_owner_reference(name: str, uid: str) -> dict[str, Any]:
    """An ownerReference to a GNNJob (what the operator sets; used by tests and the dev pods file)."""
    return {"apiVersion": API_VERSION, "kind": GNNJOB_KIND, "name": name, "uid": uid, "controller": True}


IS_LINUX = sys.platform.startswith("linux")
