"""Wire types of ``k8s.io/kube-scheduler/extender/v1``, as pydantic models.

The Go structs carry no json tags, so kube-scheduler marshals them with the Go field names as keys (``Pod``,
``NodeNames``, ``FailedNodes`` ...); the embedded ``v1.Pod`` / ``v1.NodeList`` use the ordinary Kubernetes
camelCase keys. Go's decoder matches keys case-insensitively, so our replies are read either way; we send
the Go spelling.

These models document the API (OpenAPI schema, schemathesis) and validate the small requests (bind).
The filter/prioritize hot path does not validate a 5,000-node payload through them: it decodes with orjson and
reads only the fields it needs (see ``extender.app``), because per-request pydantic validation of a full
``NodeList`` costs milliseconds. Pods and nodes are modelled loosely (``extra="allow"``): the extender reads a
handful of their fields and must pass the rest through untouched.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow")


class ObjectMeta(_Loose):
    """The parts of ``metav1.ObjectMeta`` the extender reads."""

    name: str | None = None
    namespace: str | None = None
    uid: str | None = None
    annotations: dict[str, str] | None = None
    labels: dict[str, str] | None = None


class ResourceRequirements(_Loose):
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None


class Container(_Loose):
    name: str | None = None
    resources: ResourceRequirements | None = None


class PodSpec(_Loose):
    schedulerName: str | None = None
    nodeName: str | None = None
    containers: list[Container] | None = None
    initContainers: list[Container] | None = None


class Pod(_Loose):
    """``v1.Pod`` (loose)."""

    apiVersion: str | None = None
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: PodSpec | None = None
    status: dict | None = None


class NodeStatus(_Loose):
    allocatable: dict[str, str | int | float] | None = None
    capacity: dict[str, str | int | float] | None = None


class Node(_Loose):
    """``v1.Node`` (loose)."""

    apiVersion: str | None = None
    kind: str | None = None
    metadata: ObjectMeta | None = None
    spec: dict | None = None
    status: NodeStatus | None = None


class NodeList(_Loose):
    """``v1.NodeList``: the candidate nodes when ``nodeCacheCapable: false``."""

    apiVersion: str | None = None
    kind: str | None = None
    metadata: dict | None = None
    items: list[Node] = Field(default_factory=list)


class ExtenderArgs(BaseModel):
    """Body of ``filter`` and ``prioritize``: the pod and its candidate nodes (full objects or names)."""

    model_config = ConfigDict(extra="allow")

    Pod: Pod
    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None


class ExtenderFilterResult(BaseModel):
    """Reply of ``filter``. ``NodeNames`` (names mode) or ``Nodes`` (full mode) lists the nodes that pass;
    both null filters out every node. ``FailedAndUnresolvableNodes`` are skipped by preemption."""

    Nodes: NodeList | None = None
    NodeNames: list[str] | None = None
    FailedNodes: dict[str, str] = Field(default_factory=dict)
    FailedAndUnresolvableNodes: dict[str, str] = Field(default_factory=dict)
    Error: str = ""


class HostPriority(BaseModel):
    """One entry of ``HostPriorityList`` (the reply of ``prioritize``); ``Score`` is 0..10."""

    Host: str
    Score: int = Field(ge=0, le=10)


class ExtenderBindingArgs(BaseModel):
    """Body of ``bind``."""

    model_config = ConfigDict(extra="allow")

    PodName: str
    PodNamespace: str
    PodUID: str
    Node: str


class ExtenderBindingResult(BaseModel):
    """Reply of ``bind``; an empty ``Error`` means the pod is bound."""

    Error: str = ""


class ErrorReply(BaseModel):
    """Reply of ``prioritize`` (HTTP 400) when the request cannot be read; kube-scheduler logs it and
    schedules the pod without this extender's scores."""

    Error: str
