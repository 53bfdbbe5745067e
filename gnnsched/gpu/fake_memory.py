"""A fake GPU's memory for the worker: it enforces the MPS per-client limit the gate set, the way a real GPU does.

Why: the closed loop (a job that overruns its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` fails alone with CUDA OOM, reports
what it needed, and is retried larger) must be tested end to end on machines without a GPU. On a real GPU the limit is
enforced by the MPS server and the caching allocator raises ``torch.OutOfMemoryError``; here the worker runs on the
CPU, so nothing would stop it. With ``GNNSCHED_FAKE_GPU_MEMORY`` set (only the fake GPU backend's side of a test or a
development node sets it: it is the hardware boundary, never a production code path), the worker counts the device
bytes its tensors would hold and raises the same ``torch.OutOfMemoryError`` with PyTorch's message shape once an
allocation would pass the limit.

The count: every tensor storage an operator creates, from its creation until its last reference dies (a dispatch
mode, ``gnnsched.portable.storage_booking``, shared with ``gnnsched.worker.ConcurrentMeter``), times the value's
*footprint* factor: what the device holds per byte of live tensors. ``enforce`` is 1.0; ``enforce:1.3`` models a
job whose real device footprint is 1.3× what the CPU counts (the caching allocator's reserved segments over
allocated bytes, or a user script's extra buffers), so a test can make a job overrun an estimate that is byte-exact
on the CPU.

Value grammar: ``enforce`` or ``enforce:FACTOR`` with 1.0 <= FACTOR <= 10.

The driver's side of the same stand-in: NVML lists each process on a GPU with its used memory, whatever the process
did with its limit, and the node agent stops one that holds more than it was admitted with (``node_agent.overrun``).
:func:`write_usage` is how a process on a fake GPU shows its held bytes there: a file named after its pid in the usage
directory (``FakeGPUBackend(usage_dir=...)``), read by ``FakeGPUBackend.processes`` and ``devices``.
"""

from __future__ import annotations

import os
from pathlib import Path

from gnnsched.contract import ENV_FAKE_GPU_MEMORY
from gnnsched.errors import FieldError
from gnnsched.portable.fake_memory import (
    MAX_FOOTPRINT,
    FakeGPUMemory,
    FakeOutOfMemoryError,
    format_size,
    parse_footprint,
)

__all__ = [
    "MAX_FOOTPRINT", "FakeGPUMemory", "FakeOutOfMemoryError", "format_size", "parse_fake_gpu_memory", "write_usage",
]


def parse_fake_gpu_memory(value: str) -> float:
    """The footprint factor ``GNNSCHED_FAKE_GPU_MEMORY`` asks for; :class:`FieldError` naming the variable otherwise."""
    try:
        return parse_footprint(value)
    except ValueError as exc:
        raise FieldError(ENV_FAKE_GPU_MEMORY, str(exc)) from None


def write_usage(usage_dir: str | Path, gpu_uuid: str, used_bytes: int, pid: int | None = None) -> None:
    """Record that process ``pid`` (default: this one) holds ``used_bytes`` on fake GPU ``gpu_uuid`` (atomic
    replace: the backend never reads half a file)."""
    pid = os.getpid() if pid is None else pid
    path = Path(usage_dir) / str(pid)
    tmp = path.with_name(f".{pid}.tmp")
    tmp.write_text(f"{gpu_uuid} {max(0, int(used_bytes))}\n", encoding="utf-8")
    os.replace(tmp, path)
