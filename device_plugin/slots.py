"""Slots: what the device plugin advertises, and how it picks slots. Pure functions, no gRPC, no threads.

Each GPU is advertised as N devices of ``gnnsched.io/gpu-share`` ("slots", one per MPS client it may host). A slot
ID encodes its GPU: ``<gpu uuid>-slot-<k>`` (e.g. ``GPU-8f6c…-slot-07``), at most 63 characters as kubelet
requires. Slots are only a *count* for kube-scheduler and kubelet: which GPU a process really runs on is decided by
the node agent at the gate. Kubelet's slot choice still matters for health (a slot on an unhealthy GPU is not
handed out) and for tidy accounting, so :func:`preferred_allocation` packs a request's slots onto one GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gnnsched.gpu.backend import GPUInfo

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
SLOT_SEPARATOR = "-slot-"
MAX_DEVICE_ID_LENGTH = 63


class AllocationError(ValueError):
    """A request the plugin cannot serve; ``unknown`` lists device IDs it never advertised."""

    def __init__(self, message: str, unknown: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.unknown = tuple(unknown)


@dataclass(frozen=True)
class MPSHealth:
    """MPS health as the node agent reports it: node-wide, plus per GPU (by uuid) when the agent says."""

    healthy: bool
    message: str = ""
    per_gpu: Mapping[str, bool] | None = None
    #: GPUs an admin returned to service, by uuid: the request's time (Unix). This plugin's own driver view drops a
    #: hardware Xid mark from before it (the agent dropped its own), else the slots would stay Unhealthy for good.
    returned: Mapping[str, float] | None = None

    def gpu_healthy(self, uuid: str) -> bool:
        if not self.healthy:
            return False
        if self.per_gpu is None:
            return True
        return self.per_gpu.get(uuid, True)


@dataclass(frozen=True)
class Slot:
    id: str
    gpu_index: int
    gpu_uuid: str
    number: int
    healthy: bool


def slot_id(gpu_uuid: str, number: int) -> str:
    sid = f"{gpu_uuid}{SLOT_SEPARATOR}{number:02d}"
    if len(sid) > MAX_DEVICE_ID_LENGTH:
        raise ValueError(f"device ID {sid!r} is longer than {MAX_DEVICE_ID_LENGTH} characters")
    return sid


def parse_slot_id(sid: str) -> tuple[str, int]:
    """``(gpu uuid, slot number)`` of a slot ID; ``ValueError`` if it is not one."""
    uuid, sep, num = sid.rpartition(SLOT_SEPARATOR)
    if not sep or not uuid or not num.isdigit():
        raise ValueError(f"{sid!r} is not a gnnsched slot ID")
    return uuid, int(num)


def build_slots(gpus: Iterable[GPUInfo], slots_per_gpu: int, mps: MPSHealth) -> tuple[Slot, ...]:
    """All slots, GPU by GPU; a slot is healthy only when its GPU and MPS on that GPU are."""
    out: list[Slot] = []
    for g in gpus:
        healthy = g.healthy and mps.gpu_healthy(g.uuid)
        out.extend(Slot(slot_id(g.uuid, k), g.index, g.uuid, k, healthy) for k in range(slots_per_gpu))
    return tuple(out)


def preferred_allocation(
    slots: Mapping[str, Slot], available: Sequence[str], must_include: Sequence[str], size: int
) -> list[str]:
    """Choose ``size`` slot IDs from ``available`` (always keeping ``must_include``), on as few GPUs as possible.

    Best fit: the GPU with the fewest free slots that still holds the whole request, so partly used GPUs fill up
    before an empty one is touched (the GPU that already holds ``must_include`` wins if it fits). If no single GPU
    fits, slots come from the GPUs with the most free slots first, which spans the fewest GPUs.
    """
    unknown = [d for d in (*available, *must_include) if d not in slots]
    if unknown:
        raise AllocationError(f"unknown device IDs: {', '.join(sorted(set(unknown)))}", unknown)
    avail = list(dict.fromkeys(available))
    must = list(dict.fromkeys(must_include))
    pool = set(avail) | set(must)
    if size < 1:
        raise AllocationError(f"allocation_size must be positive, got {size}")
    if size < len(must):
        raise AllocationError(f"allocation_size {size} is smaller than must_include_deviceIDs ({len(must)})")
    if size > len(pool):
        raise AllocationError(f"allocation_size {size} exceeds the {len(pool)} available devices")

    chosen = list(must)
    need = size - len(chosen)
    if need == 0:
        return chosen
    by_gpu: dict[int, list[Slot]] = {}
    for d in avail:
        if d in must:
            continue
        s = slots[d]
        by_gpu.setdefault(s.gpu_index, []).append(s)
    for free in by_gpu.values():
        free.sort(key=lambda s: s.number)

    must_gpus = {slots[d].gpu_index for d in must}
    if len(must_gpus) == 1:
        (g,) = must_gpus
        if len(by_gpu.get(g, ())) >= need:
            return chosen + [s.id for s in by_gpu[g][:need]]
    fitting = [g for g, free in by_gpu.items() if len(free) >= need]
    if fitting:
        g = min(fitting, key=lambda g: (len(by_gpu[g]), g))
        return chosen + [s.id for s in by_gpu[g][:need]]
    for g in sorted(by_gpu, key=lambda g: (-len(by_gpu[g]), g)):
        take = by_gpu[g][:need]
        chosen += [s.id for s in take]
        need -= len(take)
        if need == 0:
            break
    return chosen
