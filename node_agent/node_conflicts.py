"""Another device plugin handing out the GPUs gnnsched shares on this node.

Why it matters: NVIDIA's own device plugin advertises ``nvidia.com/gpu``. Where it runs next to gnnsched's plugin,
kubelet hands whole GPUs to pods that never pass the gate: their memory is in no book, they are no MPS client with a
limit (or they are an MPS client of another UID, which stalls every gated job behind their server). Nothing in the
device plugin API lets one plugin see another, but the Node object does: a non-zero ``nvidia.com/gpu`` in the node's
capacity or allocatable means some plugin registered it with this node's kubelet. The agent reads its Node, and
reports a ``True`` condition ``OtherGPUDevicePlugin`` on its GPUNode, a metric and a log line. It does not stop the
other plugin (that is the admin's call: keep NVIDIA's plugin off gnnsched nodes with a node selector or affinity).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Gauge

from gnnsched.contract import OTHER_GPU_RESOURCE, NodeCondition
from gnnsched.node_agent.identity import REQUEST_TIMEOUT
from gnnsched.quantity import QuantityError, parse_bytes

log = logging.getLogger("gnnsched.node_agent.conflicts")

CONDITION_TYPE = "OtherGPUDevicePlugin"


class NodeReader(Protocol):
    """Reads this node's ``Node`` object (API shape, as a dict); ``None`` when it does not exist."""

    def node(self, name: str) -> dict[str, Any] | None: ...


class KubeNodeReader:
    """The in-cluster reader (needs ``get`` on ``nodes``, which the agent's ClusterRole grants)."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        from gnnsched.kubeclient import api_client as _default_api_client

        self._core = client.CoreV1Api(api_client or _default_api_client())

    def node(self, name: str) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            obj = self._core.read_node(name, _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        out = self._core.api_client.sanitize_for_serialization(obj)
        return out if isinstance(out, dict) else None


class FileNodeReader:
    """Nodes from the development pods file (``{"nodes": [...]}`` beside ``pods`` and ``gnnjobs``)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def node(self, name: str) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return None
        for n in (data.get("nodes") or []) if isinstance(data, dict) else []:
            if isinstance(n, dict) and (n.get("metadata") or {}).get("name") == name:
                return n
        return None


def _count(value: Any) -> int:
    """A resource quantity as an integer count; malformed values count as 0 (reported elsewhere by kubelet)."""
    try:
        return parse_bytes(str(value))
    except QuantityError:
        return 0


def other_plugin_condition(node_name: str, node: dict[str, Any] | None,
                           resource: str = OTHER_GPU_RESOURCE) -> NodeCondition:
    """The ``OtherGPUDevicePlugin`` condition for one Node object (``None``: the node could not be found)."""
    if node is None:
        return NodeCondition(type=CONDITION_TYPE, status="Unknown", reason="NodeNotFound",
                             message=f"node {node_name} was not found, so its GPU resources cannot be checked")
    status = node.get("status") or {}
    capacity = _count((status.get("capacity") or {}).get(resource, 0))
    allocatable = _count((status.get("allocatable") or {}).get(resource, 0))
    if capacity > 0 or allocatable > 0:
        return NodeCondition(
            type=CONDITION_TYPE, status="True", reason="OtherPluginAdvertisesGPUs",
            message=(f"node {node_name} advertises {resource} (capacity {capacity}, allocatable {allocatable}): "
                     "another device plugin hands out the GPUs gnnsched shares, and pods it serves bypass the gate "
                     "and its MPS limits; keep that plugin off gnnsched GPU nodes"),
        )
    return NodeCondition(type=CONDITION_TYPE, status="False", reason="NoOtherPlugin",
                         message=f"node {node_name} advertises no {resource}")


@dataclass(slots=True)
class OtherPluginWatch:
    """Checks the Node now and then; keeps the condition (with its transition time), the metric and the log."""

    node_name: str
    reader: NodeReader
    registry: CollectorRegistry
    resource: str = OTHER_GPU_RESOURCE
    condition: NodeCondition | None = None
    _gauge: Gauge = field(init=False)

    def __post_init__(self) -> None:
        self._gauge = Gauge("gnnsched_other_gpu_device_plugin",
                            "1 if the node also advertises this resource (another device plugin hands out the GPUs)",
                            ("resource",), registry=self.registry)

    def check(self) -> NodeCondition:
        """Read the node and update; a failed read gives status Unknown (the reason says why), never an exception."""
        try:
            new = other_plugin_condition(self.node_name, self.reader.node(self.node_name), self.resource)
        except Exception as exc:
            new = NodeCondition(type=CONDITION_TYPE, status="Unknown", reason="NodeUnreadable",
                                message=f"cannot read node {self.node_name}: {str(exc).splitlines()[0][:300]}")
        old = self.condition
        if old is not None and old.status == new.status:
            new.last_transition_time = old.last_transition_time
        else:
            new.last_transition_time = datetime.now(timezone.utc)
            if new.status == "True":
                log.error("%s", new.message)
            elif old is not None and old.status == "True":
                log.info("%s: no longer advertised", self.resource)
            elif new.status == "Unknown":
                log.warning("%s", new.message)
        self._gauge.labels(self.resource).set(1 if new.status == "True" else 0)
        self.condition = new
        return new
