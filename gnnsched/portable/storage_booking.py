"""One dispatch mode that books every tensor storage an operator creates, for the two counters that need it.

Why: ``gnnsched.worker.ConcurrentMeter`` (the peak of parallel inference threads, which ``torch.profiler`` does not
see) and ``gnnsched.gpu.fake_memory.FakeGPUMemory`` (a fake GPU's device bytes, limited like MPS limits a client)
count the same thing: a CPU storage from the operator that creates it until its last reference dies. Only what each
books for a storage differs, so the walk over an operator's outputs and the release on the storage's death live here.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

Book = Callable[[int, int], "int | None"]
"""``book(key, nbytes)``: the amount booked for a new storage (``key`` is its ``id``), or None to leave it uncounted;
it may raise to fail the operator (the fake GPU's out-of-memory error)."""
Release = Callable[[int, int], None]
"""``release(key, amount)``: called once when a booked storage dies, with what ``book`` returned for it."""


def storage_booking_mode(book: Book, release: Release) -> Any:
    """A ``TorchDispatchMode`` (enter one per thread) calling ``book`` for each CPU storage in an operator's outputs
    and ``release`` when a booked one is freed. ``book`` sees a storage again whenever an output is a view of it, so it
    must skip keys it already holds."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class _BookingMode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: tuple[Any, ...] = (),
                               kwargs: dict[str, Any] | None = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                    storage = t.untyped_storage()
                    key = id(storage)
                    amount = book(key, storage.nbytes())
                    if amount is not None:
                        weakref.finalize(storage, release, key, amount)
            return out

    return _BookingMode()
