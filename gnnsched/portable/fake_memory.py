"""A fake GPU's device-memory counter, enforcing the MPS per-client limit as a real GPU does
(``gnnsched.gpu.fake_memory`` says why and how; the variable's grammar is parsed there).

Here because both the built-in worker and the portable step runner (``runner.py``, in a user's image where gnnsched
is not installed) count under a fake GPU: standard library and torch only.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .storage_booking import storage_booking_mode

ENV_FAKE_GPU_MEMORY = "GNNSCHED_FAKE_GPU_MEMORY"
"""``gnnsched.contract.ENV_FAKE_GPU_MEMORY``, spelled out (this module runs where gnnsched is not importable)."""

MAX_FOOTPRINT = 10.0
REPORT_STEP = 1 << 20  # the peak is reported once it grew by 1 MiB or 2 %, whichever is more (a few dozen writes)


def parse_footprint(value: str) -> float:
    """The footprint factor of a ``GNNSCHED_FAKE_GPU_MEMORY`` value (``enforce`` or ``enforce:FACTOR``, 1 <= FACTOR
    <= 10); ``ValueError`` saying what is wrong otherwise."""
    text = value.strip()
    head, _, factor = text.partition(":")
    if head != "enforce":
        raise ValueError(f"expected 'enforce' or 'enforce:FACTOR', got {value!r}")
    if not factor:
        return 1.0
    try:
        number = float(factor)
    except ValueError:
        raise ValueError(f"footprint factor {factor!r} is not a number") from None
    if not (math.isfinite(number) and 1.0 <= number <= MAX_FOOTPRINT):
        raise ValueError(f"footprint factor must be between 1 and {MAX_FOOTPRINT:g}, got {factor}")
    return number


def out_of_memory_error() -> type[Exception]:
    """torch's out-of-memory exception: ``torch.OutOfMemoryError`` where torch has the top-level name (2.5 on),
    ``torch.cuda.OutOfMemoryError`` (the same class) on older releases."""
    import torch

    found = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return found


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
    # process (the caching allocator keeps its segments, so NVML sees the peak, not the live bytes);
    # gnnsched.gpu.fake_memory.write_usage.
    on_peak: Callable[[int], None] | None = field(default=None, repr=False)
    _reported: int = field(default=0, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _known: set[int] = field(default_factory=set, repr=False)

    def device_bytes(self, nbytes: int) -> int:
        return math.ceil(nbytes * self.footprint)

    def _book(self, key: int, nbytes: int) -> int | None:
        """Book one new storage's device bytes (None: already booked, or empty); raises ``torch.OutOfMemoryError``
        (booking nothing) when it would pass the limit."""
        device = self.device_bytes(nbytes)
        with self._lock:
            if key in self._known or device == 0:
                return None
            if self.limit_bytes is not None and self.held + device > self.limit_bytes:
                self.failed_request, self.held_at_failure = device, self.held
                free = max(0, self.limit_bytes - self.held)
                raise out_of_memory_error()(
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
