"""The ``GPUNode`` status the agent publishes (the extender's only view of this node).

Built from the gate's books (committed bytes, running and queued pods) and the driver (used bytes, health), written
every few seconds and soon after every change. In a cluster it goes to the cluster-scoped ``GPUNode`` object named
after the node (created on first write); without one (development, tests) to a JSON file, atomically.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from gnnsched.contract import (
    API_VERSION,
    GPUNODE_KIND,
    GPUNODE_PLURAL,
    GROUP,
    VERSION,
    GPUJob,
    GPUMeasurement,
    GPUNodeStatus,
    GPUStatus,
    MPSStatus,
)
from gnnsched.gpu.backend import GPUInfo
from gnnsched.gpu.catalogue import match_device_name
from gnnsched.node_agent.books import Books, Entry
from gnnsched.node_agent.identity import REQUEST_TIMEOUT
from gnnsched.node_agent.quarantine import Drain

log = logging.getLogger("gnnsched.node_agent.status")


def _job(books: Books, e: Entry, now: float) -> GPUJob:
    """One pod as the extender sees it (with the fault peers the gate keeps it apart from, so that the extender keeps
    the same rule). A running pod's seconds left are the gate's own (``Books.seconds_left``: its
    measured pace once it reports steps, else its prediction); a queued pod's, its whole predicted runtime."""
    remaining = None
    if e.key in books.running and (e.qt_seconds is not None or e.progress is not None):
        remaining = books.seconds_left(e, now)
    elif e.qt_seconds is not None:
        remaining = max(0.0, e.qt_seconds)
    intensity = e.intensity if e.intensity in ("memory", "compute") else None
    bytes = books.booked_bytes(e) if e.key in books.running else e.bytes  # a held probation client: the whole GPU
    return GPUJob(pod_uid=e.pod_uid, namespace=e.namespace, name=e.name, job=e.job, bytes=bytes,
                  predicted_remaining_seconds=remaining, intensity=intensity, fault_peers=sorted(e.apart))


def build_status(
    node_name: str, books: Books, devices: list[GPUInfo], mps: MPSStatus, now: float,
    drains: Mapping[str, Drain] | None = None, returned: Mapping[str, float] | None = None,
    measured: Mapping[str, GPUMeasurement] | None = None,
) -> GPUNodeStatus:
    """One snapshot. Queued pods are listed under GPU index 0: the gate decides their GPU only at admission.

    A draining GPU (``drains``, after a fatal MPS fault) shows ``draining`` with its reason and ``mpsHealthy: false``:
    MPS refuses new clients there until every client has exited, so the device plugin and the extender must not
    count on it; and a restarted agent reads the fields back from the node status file to keep draining it. An
    unhealthy GPU (a hardware Xid: out of service until an admin acts) shows why, its Xid and since when; a GPU an
    admin returned to service (``returned``: uuid -> the request's time) shows when, for the device plugin.

    ``model`` is the catalogue's name of a catalogued GPU (``catalogued: true``), else NVML's raw name
    (``catalogued: false``); ``measured`` (NVML name -> the node's measurement of that model,
    ``gnnsched.node_agent.constants``) fills each GPU's ``measured``, null while there is none."""
    drains = drains or {}
    measured = measured or {}
    returned = returned or {}
    by_index = {d.index: d for d in devices}
    queue = books.queue_order()
    gpus: list[GPUStatus] = []
    for g in sorted(books.gpus.values(), key=lambda g: g.index):
        d = by_index.get(g.index)
        raw_name = d.name if d else g.model
        model = match_device_name(raw_name, g.total_bytes)
        running = sorted((e for e in books.running.values() if e.gpu_index == g.index), key=lambda e: e.seq)
        gpus.append(GPUStatus(
            index=g.index, uuid=g.uuid, model=model.name if model else raw_name, catalogued=model is not None,
            measured=measured.get(raw_name),
            total_bytes=g.total_bytes, reserve_bytes=g.reserve_bytes, committed_bytes=books.committed_bytes(g.index),
            used_bytes=d.used_bytes if d else 0, healthy=bool(d.healthy) if d else False,
            mps_healthy=mps.healthy and g.uuid not in drains,
            max_clients=g.max_clients, running=[_job(books, e, now) for e in running],
            draining=g.uuid in drains,
            draining_reason=drains[g.uuid].reason if g.uuid in drains else None,
            draining_xid=drains[g.uuid].xid if g.uuid in drains else None,
            draining_since=(datetime.fromtimestamp(drains[g.uuid].since, tz=timezone.utc) if g.uuid in drains
                            else None),
            unhealthy_reason=(d.health_reason or None) if d and not d.healthy else None,
            unhealthy_xid=d.unhealthy_xid if d and not d.healthy else None,
            unhealthy_since=(datetime.fromtimestamp(d.unhealthy_since, tz=timezone.utc)
                             if d and not d.healthy and d.unhealthy_since is not None else None),
            returned_to_service_at=(datetime.fromtimestamp(returned[g.uuid], tz=timezone.utc) if g.uuid in returned
                                    else None),
            queued=[_job(books, e, now) for e in queue] if g.index == min(books.gpus) else [],
        ))
    return GPUNodeStatus(
        node_name=node_name, updated_at=datetime.fromtimestamp(now, tz=timezone.utc), mps=mps, gpus=gpus,
        learned_slowdowns=books.learned_slowdown_entries(),
    )


class StatusSink(Protocol):
    def publish(self, status: GPUNodeStatus) -> None: ...


class FileStatusSink:
    """Writes the status JSON (``{"apiVersion", "kind", "metadata", "status"}``) to a file, atomically."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def publish(self, status: GPUNodeStatus) -> None:
        obj = {"apiVersion": API_VERSION, "kind": GPUNODE_KIND, "metadata": {"name": status.node_name},
               "status": status.wire()}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(obj))
        tmp.replace(self.path)


class KubeStatusSink:
    """Writes ``GPUNode/<node>`` status through the API server (status subresource), creating the object first if it
    does not exist yet. Tested against kmock's in-memory API server."""

    def __init__(self, api_client: Any = None) -> None:
        from kubernetes import client

        from gnnsched.kubeclient import api_client as _default_api_client

        if api_client is None:
            api_client = _default_api_client()
        self._api = client.CustomObjectsApi(api_client)

    def publish(self, status: GPUNodeStatus) -> None:
        from kubernetes.client.rest import ApiException

        name = status.node_name
        body = {"status": status.wire()}
        try:
            self._api.patch_cluster_custom_object_status(GROUP, VERSION, GPUNODE_PLURAL, name, body,
                                                         _request_timeout=REQUEST_TIMEOUT)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._api.create_cluster_custom_object(
                GROUP, VERSION, GPUNODE_PLURAL,
                {"apiVersion": API_VERSION, "kind": GPUNODE_KIND, "metadata": {"name": name}},
                _request_timeout=REQUEST_TIMEOUT,
            )
            self._api.patch_cluster_custom_object_status(GROUP, VERSION, GPUNODE_PLURAL, name, body,
                                                         _request_timeout=REQUEST_TIMEOUT)
