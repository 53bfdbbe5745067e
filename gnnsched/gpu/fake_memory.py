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
"""

from __future__ import annotations

from gnnsched.contract import ENV_FAKE_GPU_MEMORY
from gnnsched.errors import FieldError
from gnnsched.portable.fake_memory import (
    MAX_FOOTPRINT,
    FakeGPUMemory,
    FakeOutOfMemoryError,
    format_size,
    parse_footprint,
)

__all__ = ["MAX_FOOTPRINT", "FakeGPUMemory", "FakeOutOfMemoryError", "format_size", "parse_fake_gpu_memory"]

def parse_fake_gpu_memory(value: str) -> float:
    """The footprint factor ``GNNSCHED_FAKE_GPU_MEMORY`` asks for; :class:`FieldError` naming the variable otherwise."""
    try:
        return parse_footprint(value)
    except ValueError as exc:
        raise FieldError(ENV_FAKE_GPU_MEMORY, str(exc)) from None
