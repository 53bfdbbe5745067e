"""A model of PyTorch's CUDA caching allocator: the *reserved* memory an allocation/free sequence costs on a GPU.

Why. An MPS memory limit and NVML count what the process took from the driver, not the bytes its tensors hold. In
PyTorch that is the caching allocator's reserved memory (``torch.cuda.max_memory_reserved``): whole segments
obtained with ``cudaMalloc``, which stay cached after their tensors die and are carved into blocks that can only
merge with neighbours inside the same segment. The estimator traces the order in which a job step creates and frees
its tensors (``gnnsched.estimator.Trace``); replaying that order through this model predicts the peak reserved bytes
instead of the peak live bytes.

Scope. The allocator's defaults only: no ``expandable_segments``, no ``max_split_size_mb`` (its default is
``SIZE_MAX``, so every "oversize" branch is dead), no ``roundup_power2_divisions`` (default 0: plain 512-byte
rounding), no ``garbage_collection_threshold``, no CUDA graph pools, one device and one stream (what the traced job
step uses: PyTorch keys cached blocks by stream, so a job on one stream has one small and one large pool).

The rules, as ``c10/cuda/CUDACachingAllocator.cpp`` and ``c10/cuda/CUDAAllocatorConfig.cpp`` state them at PyTorch
v2.6.0 (the Debian ``pytorch_2.6.0+dfsg`` source of tag v2.6.0, inside the 2.4-2.14 range ``pyproject.toml``
allows; the size constants and the allocator's header comment are unchanged in the newest upstream snapshot stored
here, commit 001074d2, whose function bodies were not re-read). Line numbers are at v2.6.0:

1. Zero-byte requests never reach the allocator (``allocate``: ``if (size != 0) malloc(...)``, lines 3637-3638).
2. Size rounding: a request is rounded up to a multiple of ``kMinBlockSize`` = 512 bytes, at least 512
   (``round_size``, lines 2063-2071; ``kMinBlockSize`` line 121; ``roundup_power2_divisions`` defaults to 0,
   CUDAAllocatorConfig.cpp line 23, so the power-of-two branch at 2067-2069 is not taken).
3. Pools: a rounded size <= ``kSmallSize`` = 1 MiB goes to the small pool, anything larger to the large pool
   (``get_pool``, lines 2525-2529; ``kSmallSize`` line 123).
4. Segment sizes, when no cached block fits: 2 MiB (``kSmallBuffer``) for a small request, 20 MiB
   (``kLargeBuffer``) for a request under 10 MiB (``kMinLargeAlloc``), else the request rounded up to a multiple of
   2 MiB (``kRoundLarge``) (``get_allocation_size``, lines 2550-2557; constants lines 51-52 and 124-128). The new
   segment's bytes are added to ``reserved_bytes`` (``alloc_block``, lines 2780-2785).
5. Best fit: the free block chosen is the first in (stream, size, address) order whose size is at least the
   rounded request: the smallest that fits, the lowest address among equal sizes (``get_free_block``:
   ``pool.blocks.lower_bound``, lines 2569-2571; ``BlockComparatorSize``, lines 723-731). The cached blocks are
   searched before any new segment is requested (``malloc``, lines 1215-1219 then 1234).
6. Splitting: the chosen block is split and its remainder returned to the pool when the remainder is at least 512
   bytes in the small pool, or more than 1 MiB in the large pool (``should_split``, lines 2540-2548;
   ``alloc_found_block``, lines 1366 and 1388-1403). An unsplit block is handed out whole and counts whole in
   ``allocated_bytes`` (line 1445).
7. Merging: a freed block merges with its previous and next neighbours when they are free (``free_block``,
   lines 2419-2425; ``try_merge_blocks``, lines 2474-2505). Neighbours exist only inside one segment (a block's
   ``prev``/``next`` are set only by splitting), so blocks of different segments never merge.
8. Release: freeing never returns a segment to the driver (``free`` -> ``free_block`` re-inserts the block in its
   pool, lines 1469-1514 and 2433). Segments are released only when ``cudaMalloc`` fails: ``malloc`` then frees the
   cached *unsplit* segments (``release_cached_blocks`` -> ``release_blocks``, lines 1236-1242 and 3045-3061) and
   retries. Not modelled: with unlimited memory it never runs, and a segment it frees is one no live block uses, so
   it can only lower what a limited run needs; the unlimited-memory peak reserved is therefore the amount with
   which the sequence is sure to run without an out-of-memory retry.

What is not modelled (and so not predicted): allocations outside the traced tensors (cuDNN/cuBLASLt workspaces other
than the cuBLAS one the estimator adds, NCCL, kernels' own scratch through the allocator), blocks held back by
``record_stream`` events on other streams, and the ``cudaMalloc`` addresses themselves: the model places segments at
increasing addresses, while the address order among equal-size free blocks on a GPU follows what the driver returned.
None of this is measured here: no GPU was available; ``bench/pmc_accuracy.py --device cuda`` compares the model with
``torch.cuda.max_memory_reserved()`` where one is.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable, Iterable
from dataclasses import dataclass

MiB = 1 << 20

MIN_BLOCK_SIZE = 512
"""``kMinBlockSize`` (CUDACachingAllocator.cpp v2.6.0 line 121): every block is a multiple of it."""
SMALL_SIZE = 1 * MiB
"""``kSmallSize`` (line 123): the largest request served from the small pool."""
SMALL_BUFFER = 2 * MiB
"""``kSmallBuffer`` (line 124): the segment size of the small pool."""
MIN_LARGE_ALLOC = 10 * MiB
"""``kMinLargeAlloc`` (line 126): requests below it (and above 1 MiB) get a ``kLargeBuffer`` segment."""
LARGE_BUFFER = 20 * MiB
"""``kLargeBuffer`` (line 51): the shared segment size for 1-10 MiB requests."""
ROUND_LARGE = 2 * MiB
"""``kRoundLarge`` (line 128): larger requests get a segment of their size rounded up to this."""


def round_size(nbytes: int) -> int:
    """The block size PyTorch carves for a request (``round_size``, lines 2063-2071, default configuration)."""
    if nbytes < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-nbytes // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def is_small(size: int) -> bool:
    """Whether a rounded size is served from the small pool (``get_pool``, lines 2525-2529)."""
    return size <= SMALL_SIZE


def allocation_size(size: int) -> int:
    """The ``cudaMalloc`` size of the segment a rounded request gets when no cached block fits
    (``get_allocation_size``, lines 2550-2557)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def should_split(block_size: int, size: int, small: bool) -> bool:
    """Whether a cached block of ``block_size`` handed out for ``size`` is split (``should_split``, lines
    2540-2548, with ``max_split_size`` at its default ``SIZE_MAX``)."""
    remaining = block_size - size
    if small:
        return remaining >= MIN_BLOCK_SIZE
    return remaining > SMALL_SIZE


class Block:
    """A block of a segment: a range of addresses, free or handed out, linked to its neighbours in the segment."""

    __slots__ = ("addr", "allocated", "next", "prev", "size", "small")

    def __init__(self, addr: int, size: int, small: bool) -> None:
        self.addr = addr
        self.size = size
        self.small = small
        self.allocated = False
        self.prev: Block | None = None
        self.next: Block | None = None


@dataclass(frozen=True)
class AllocatorPeak:
    """What a replay measured: the counterparts of ``torch.cuda.max_memory_reserved`` / ``max_memory_allocated``."""

    reserved_bytes: int
    """Peak bytes of all segments (PyTorch's ``reserved_bytes`` peak): a whole number of 2 MiB units."""
    allocated_bytes: int
    """Peak bytes of handed-out blocks (PyTorch's ``allocated_bytes`` peak: rounded, unsplit blocks whole)."""
    segments: int
    """Segments at the end of the replay (never released, rule 8)."""


class CachingAllocatorModel:
    """One device's caching allocator on one stream, defaults only (see the module docstring for the rules).

    ``malloc`` returns the block handed out (``None`` for a zero-byte request), ``free`` gives it back. The model
    keeps PyTorch's statistics: ``reserved``/``allocated`` now and their peaks."""

    def __init__(self) -> None:
        # Free blocks per pool (True: small), sorted by (size, address): BlockComparatorSize on one stream.
        self._free: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._free_at: dict[int, Block] = {}  # address -> free block
        self._next_segment = 0
        self.reserved = 0
        self.allocated = 0
        self.peak_reserved = 0
        self.peak_allocated = 0
        self.segments = 0

    def _cache(self, block: Block) -> None:
        bisect.insort(self._free[block.small], (block.size, block.addr))
        self._free_at[block.addr] = block

    def _uncache(self, block: Block) -> None:
        pool = self._free[block.small]
        del pool[bisect.bisect_left(pool, (block.size, block.addr))]
        del self._free_at[block.addr]

    def _new_segment(self, size: int, small: bool) -> Block:
        """``alloc_block``: a ``cudaMalloc`` of ``allocation_size`` bytes, counted in ``reserved`` (rule 4)."""
        seg = allocation_size(size)
        block = Block(self._next_segment, seg, small)
        # Segments sit at increasing addresses, one unused MiB apart: adjacency is only through prev/next (rule 7).
        self._next_segment += seg + MiB
        self.reserved += seg
        self.segments += 1
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        return block

    def malloc(self, nbytes: int) -> Block | None:
        """Hand out a block for a request of ``nbytes`` (rules 1-6)."""
        if nbytes < 0:
            raise ValueError(f"allocation of {nbytes} bytes")
        if nbytes == 0:
            return None
        size = round_size(nbytes)
        small = is_small(size)
        pool = self._free[small]
        at = bisect.bisect_left(pool, (size, -1))
        if at < len(pool):
            _, addr = pool.pop(at)
            block = self._free_at.pop(addr)
        else:
            block = self._new_segment(size, small)
        if should_split(block.size, size, small):
            remaining = block
            block = Block(remaining.addr, size, small)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            self._cache(remaining)
        block.allocated = True
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def free(self, block: Block) -> None:
        """Return a block to its pool, merged with free neighbours of its segment (rules 7 and 8)."""
        if not block.allocated:
            raise ValueError("block freed twice")
        block.allocated = False
        self.allocated -= block.size
        prev = block.prev
        if prev is not None and not prev.allocated:  # [prev block] -> one block at prev's address
            self._uncache(prev)
            block.addr = prev.addr
            block.size += prev.size
            block.prev = prev.prev
            if block.prev is not None:
                block.prev.next = block
        nxt = block.next
        if nxt is not None and not nxt.allocated:  # [block next]
            self._uncache(nxt)
            block.size += nxt.size
            block.next = nxt.next
            if block.next is not None:
                block.next.prev = block
        self._cache(block)

    def peak(self) -> AllocatorPeak:
        return AllocatorPeak(
            reserved_bytes=self.peak_reserved, allocated_bytes=self.peak_allocated, segments=self.segments
        )


def replay(events: Iterable[tuple[int, Hashable, int]]) -> AllocatorPeak:
    """Peak reserved and allocated bytes of an allocation/free sequence on a fresh allocator.

    ``events`` are ``(+1, key, nbytes)`` for an allocation of ``nbytes`` (the size as requested, before any rounding)
    and ``(-1, key, _)`` for the free of the allocation named ``key``; keys are any hashable, unique among live
    allocations. A free of a key that is not live raises ``ValueError``."""
    model = CachingAllocatorModel()
    live: dict[Hashable, Block | None] = {}
    for sign, key, nbytes in events:
        if sign > 0:
            if key in live:
                raise ValueError(f"allocation {key!r} made twice while live")
            live[key] = model.malloc(nbytes)
        else:
            try:
                block = live.pop(key)
            except KeyError:
                raise ValueError(f"free of {key!r}, which is not allocated") from None
            if block is not None:
                model.free(block)
    return model.peak()


__all__ = [
    "LARGE_BUFFER",
    "MIN_BLOCK_SIZE",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "SMALL_BUFFER",
    "SMALL_SIZE",
    "AllocatorPeak",
    "CachingAllocatorModel",
    "allocation_size",
    "is_small",
    "replay",
    "round_size",
    "should_split",
]
