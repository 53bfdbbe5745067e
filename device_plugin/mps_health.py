"""Where the device plugin learns MPS health: any zero-argument callable returning :class:`MPSHealth`.

The node agent owns the MPS daemon; the plugin only reads what the agent reports, through the agent's status file
(``gnnsched.node_status_file``). A missing, unreadable or stale file means "MPS not known to be healthy": every
slot turns Unhealthy, so kubelet stops admitting new gated pods on a node whose gate cannot admit them anyway.
Tests and embedders can pass their own callable instead.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from gnnsched.node_status_file import StatusFileError, read_status_file, status_age_seconds

from .slots import MPSHealth

MPSHealthSource = Callable[[], MPSHealth]


def assume_mps_healthy() -> MPSHealth:
    """For nodes without a node agent (or tests of GPU health alone): MPS is never the reason a slot is down."""
    return MPSHealth(True, "MPS health not watched")


class StatusFileMPSHealth:
    """Reads ``mps.healthy``, ``gpus[].mpsHealthy``, ``gpus[].healthy`` and ``updatedAt`` from the agent's status file
    on every call.

    A GPU the agent reports unhealthy (a hardware Xid keeps it so until an admin acts, docs/faults.md) is unhealthy
    here too, whatever this plugin's own driver view says: the agent's Xid mark lives in the agent, and a plugin
    that restarted, or missed the event, would otherwise offer the GPU's slots to kubelet again."""

    def __init__(self, path: str | Path, max_age_s: float = 60.0) -> None:
        self.path = Path(path)
        self.max_age_s = max_age_s

    def __call__(self) -> MPSHealth:
        try:
            status = read_status_file(self.path)
        except StatusFileError as exc:
            return MPSHealth(False, str(exc))
        age = status_age_seconds(status)
        if age is not None and age > self.max_age_s:
            return MPSHealth(False, f"node agent status is {age:.0f} s old (limit {self.max_age_s:g} s)")
        per_gpu = {g.uuid: g.mps_healthy and g.healthy for g in status.gpus}
        returned = {g.uuid: g.returned_to_service_at.timestamp() for g in status.gpus
                    if g.returned_to_service_at is not None}
        return MPSHealth(status.mps.healthy, status.mps.message, per_gpu, returned)
