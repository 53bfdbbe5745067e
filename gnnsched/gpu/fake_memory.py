"""A fake GPU's memory for the worker: it enforces the MPS per-client limit the gate set, the way a real GPU does.

Why: the closed loop (a job that overruns its ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` fails alone with CUDA OOM, reports
what it needed, and is retried larger) must be tested end to end on machines without a GPU. On a real GPU the limit is
enforced by the MPS server and the caching allocator raises ``torch.OutOfMemoryError``; here the worker runs on the
CPU, so nothing would stop it. With ``GNNSCHED_FAKE_GPU_MEMORY`` set (only the fake GPU backend's side of a test or a
development node sets it: it is the hardware boundary, never a production code path), the worker counts the device
bytes its tensors would hold and raises the same ``torch.OutOfMemoryError`` with PyTorch's message shape once an
allocation would pass the limit.

The count: every tensor storage an operator creates, from its creation until its last reference dies (a dispatch
mode, ``gnnsched.storage_booking``, shared with ``gnnsched.worker.ConcurrentMeter``), times the value's *footprint*
factor: what the device holds per byte of live tensors. ``enforce`` is 1.0; ``enforce:1.3`` models a job whose real
device footprint is 1.3× what the CPU counts (the caching allocator's reserved segments over allocated bytes, or a
user script's extra buffers), so a test can make a job overrun an estimate that is byte-exact on the CPU.

Value grammar: ``enforce`` or ``enforce:FACTOR`` with 1.0 <= FACTOR <= 10.

The driver's side of the same stand-in: NVML lists each process on a GPU with its used memory, whatever the process
did with its limit, and the node agent stops one that holds more than it was admitted with (``node_agent.overrun``).
:func:`write_usage` is how a process on a fake GPU shows its held bytes there: a file named after its pid in the usage
directory (``FakeGPUBackend(usage_dir=...)``), read by ``FakeGPUBackend.processes`` and ``devices``.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnnsched.contract import ENV_FAKE_GPU_MEMORY
from gnnsched.errors import FieldError
from gnnsched.storage_booking import storage_booking_mode

MAX_FOOTPRINT = 10.0
REPORT_STEP = 1 << 20  # the peak is reported once it grew by 1 MiB or 2 %, whichever is more (a few dozen writes)


def parse_fake_gpu_memory(value: str) -> float:
    """The footprint factor ``GNNSCHED_FAKE_GPU_MEMORY`` asks for; :class:`FieldError` naming the variable otherwise."""
    text = value.strip()
    head, _, factor = text.partition(":")
    if head != "enforce":
        raise FieldError(ENV_FAKE_GPU_MEMORY, f"expected 'enforce' or 'enforce:FACTOR', got {value!r}")
    if not factor:
        return 1.0
    try:
        number = float(factor)
    except ValueError:
        raise FieldError(ENV_FAKE_GPU_MEMORY, f"footprint factor {factor!r} is not a number") from None
    if not (math.isfinite(number) and 1.0 <= number <= MAX_FOOTPRINT):
        raise FieldError(ENV_FAKE_GPU_MEMORY, f"footprint factor must be between 1 and {MAX_FOOTPRINT:g}, got {factor}")
    return number


def format_size(nbytes: int) -> str:
    """Bytes the way PyTorch's allocator messages print them (``20.00 MiB``), so log parsers see the same text."""
    value = float(nbytes)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.2f} {unit}" if unit != "bytes" else f"{int(value)} bytes"
        value /= 1024
    raise AssertionError("unreachable")


class FakeOutOfMemoryError(Exception):
    """Carries the exact bytes of the failed request into ``torch.OutOfMemoryError`` (whose message rounds them)."""


@dataclass
class FakeGPUMemory:
    """The device-memory counter of one worker process under a fake GPU (thread-safe: parallel inference threads
    each enter :meth:`mode` and share the count)."""

    limit_bytes: int | None
    footprint: float = 1.0
    held: int = 0
    peak: int = 0
    failed_request: int | None = None
    held_at_failure: int | None = None
    # Called with the peak whenever it grew by REPORT_STEP since the last call: what the driver would list for this
    # process (the caching allocator keeps its segments, so NVML sees the peak, not the live bytes); write_usage.
    on_peak: Callable[[int], None] | None = field(default=None, repr=False)
    _reported: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _known: set[int] = field(default_factory=set, repr=False)

    def device_bytes(self, nbytes: int) -> int:
        return math.ceil(nbytes * self.footprint)

    def _book(self, key: int, nbytes: int) -> int | None:
        """Book one new storage's device bytes (None: already booked, or empty); raises ``torch.OutOfMemoryError``
        (booking nothing) when it would pass the limit."""
        import torch

        device = self.device_bytes(nbytes)
        with self._lock:
            if key in self._known or device == 0:
                return None
            if self.limit_bytes is not None and self.held + device > self.limit_bytes:
                self.failed_request, self.held_at_failure = device, self.held
                free = max(0, self.limit_bytes - self.held)
                raise torch.OutOfMemoryError(
                    f"CUDA out of memory. Tried to allocate {format_size(device)}. GPU 0 has a total capacity of "
                    f"{format_size(self.limit_bytes)} of which {format_size(free)} is free. Of the allocated memory "
                    f"{format_size(self.held)} is held by this process (fake GPU: {ENV_FAKE_GPU_MEMORY} enforces "
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)"
                )
            self._known.add(key)
            self.held += device
            self.peak = max(self.peak, self.held)
            report = self.on_peak is not None and self.peak - self._reported >= max(REPORT_STEP, self._reported // 50)
            if report:
                self._reported = self.peak
        if report and self.on_peak is not None:
            self.on_peak(self._reported)
        return device

    def _drop(self, key: int, device: int) -> None:
        with self._lock:
            if key in self._known:
                self._known.discard(key)
                self.held -= device

    def mode(self) -> Any:
        """A ``TorchDispatchMode`` that books every CPU storage an operator creates (enter one per thread)."""
        return storage_booking_mode(self._book, self._drop)


def write_usage(usage_dir: str | Path, gpu_uuid: str, used_bytes: int, pid: int | None = None) -> None:
    """Record that process ``pid`` (default: this one) holds ``used_bytes`` on fake GPU ``gpu_uuid`` (atomic
    replace: the backend never reads half a file)."""
    pid = os.getpid() if pid is None else pid
    path = Path(usage_dir) / str(pid)
    tmp = path.with_name(f".{pid}.tmp")
    tmp.write_text(f"{gpu_uuid} {max(0, int(used_bytes))}\n", encoding="utf-8")
    os.replace(tmp, path)
