"""The CUDA caching-allocator model, under its historical name: it lives in ``gnnsched.portable.cuda_allocator``
(standard library only) so that the probe, which runs in a user's image without gnnsched, replays with the same code."""

from gnnsched.portable.cuda_allocator import (
    AllocatorPeak,
    Block,
    CachingAllocatorModel,
    allocation_size,
    is_small,
    replay,
    round_size,
    should_split,
)

__all__ = [
    "AllocatorPeak", "Block", "CachingAllocatorModel", "allocation_size", "is_small", "replay", "round_size",
    "should_split",
]
