"""PyTorch's CUDA caching allocator, simulated: what a step's allocations reserve.

``torch.cuda.max_memory_reserved()`` exceeds ``max_memory_allocated()`` by what
the caching allocator holds but cannot use at the peak.  The rules of its
native implementation (``c10/cuda/CUDACachingAllocator.cpp``, defaults: no
``max_split_size_mb``, no expandable segments) are what `CachingAllocator`
replays:

- a request is rounded up to a multiple of 512 B;
- requests of at most 1 MiB come from the small pool, carved from 2 MiB
  segments; larger ones from the large pool, whose segments are 20 MiB for
  requests below 10 MiB and the request rounded up to 2 MiB otherwise;
- a request takes the smallest cached free block of its pool that is large
  enough (best fit; ties by address) and splits it when the rest is at least
  512 B (small pool) or more than 1 MiB (large pool); only when no cached
  block fits does it reserve a new segment (``cudaMalloc``);
- a freed block is cached, merged with free neighbours of its segment, and
  never returned to the driver (no ``empty_cache``).

So a large transient (eager attention's scores, the logits and loss
buffers) leaves a segment that later, smaller allocations split; pieces that
stay allocated (hidden states kept for backward) then prevent the next large
request from reusing it whole, and a new segment is reserved.  The step's
sequence of allocations comes from `ckpt_core._memory.step_trace`.  Pure Python.
"""

from __future__ import annotations

import bisect
from typing import Final

KIB: Final = 1 << 10
MIB: Final = 1 << 20
MIN_BLOCK: Final = 512  # every request is rounded up to a multiple of this
SMALL_SIZE: Final = 1 * MIB  # largest request served by the small pool
SMALL_BUFFER: Final = 2 * MIB  # small-pool segment
LARGE_BUFFER: Final = 20 * MIB  # segment for large-pool requests below MIN_LARGE_ALLOC
MIN_LARGE_ALLOC: Final = 10 * MIB
ROUND_LARGE: Final = 2 * MIB  # larger segments are the request rounded up to this


def round_size(size: int) -> int:
    """The block size a request of ``size`` bytes takes (multiple of 512 B, at least 512 B)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return -(-size // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment the allocator reserves when no cached block fits a (rounded) request."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class CachingAllocator:
    """Replays malloc / free and tracks allocated and reserved bytes and their peaks.

    Blocks are ``(segment, offset)``; each segment keeps its blocks in address
    order as ``offset -> [size, free]``.  The free blocks of each pool are a
    sorted list of ``(size, -segment, offset)``: best fit is the first at or
    after the request's size, and among blocks of one size the lowest address
    (``BlockComparatorSize`` orders by size, then pointer), taking a later
    segment to lie below the earlier ones.  That address order is the driver's,
    not PyTorch's: it is the one under which replaying the real op sequence of
    the shared T4 rows' steps (transformers + PEFT + autograd run on CPU with
    faked kernels) reproduces their reserved peaks; ascending addresses miss
    them by one score-sized segment.
    """

    __slots__ = (
        "_free",
        "_pools",
        "_segments",
        "_starts",
        "allocated",
        "peak_allocated",
        "peak_reserved",
        "reserved",
    )

    def __init__(self) -> None:
        self._free: tuple[list[tuple[int, int, int]], list[tuple[int, int, int]]] = ([], [])
        self._segments: list[dict[int, list[int]]] = []  # offset -> [size, free]
        self._starts: list[list[int]] = []  # sorted block offsets per segment
        self._pools: list[int] = []  # 0 small, 1 large, per segment
        self.allocated = self.reserved = self.peak_allocated = self.peak_reserved = 0

    def malloc(self, size: int) -> tuple[int, int]:
        """Allocate ``size`` bytes; returns the block's handle."""
        size = round_size(size)
        small = size <= SMALL_SIZE
        free = self._free[0 if small else 1]
        index = bisect.bisect_left(free, (size, -len(self._segments), -1))
        if index < len(free):
            block_size, below, offset = free.pop(index)
            segment = -below
            self._segments[segment][offset][1] = 0
        else:
            block_size, segment, offset = segment_size(size), len(self._segments), 0
            self._segments.append({0: [block_size, 0]})
            self._starts.append([0])
            self._pools.append(0 if small else 1)
            self.reserved += block_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = block_size - size
        if rest >= MIN_BLOCK if small else rest > SMALL_SIZE:
            self._segments[segment][offset][0] = size
            self._segments[segment][offset + size] = [rest, 1]
            bisect.insort(self._starts[segment], offset + size)
            bisect.insort(free, (rest, -segment, offset + size))
        self.allocated += self._segments[segment][offset][0]
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return segment, offset

    def segment_sizes(self) -> list[int]:
        """The reserved segments' sizes, in the order they were reserved."""
        return [sum(size for size, _ in blocks.values()) for blocks in self._segments]

    def free(self, handle: tuple[int, int]) -> None:
        """Free a block: cached, merged with free neighbours in its segment."""
        segment, offset = handle
        blocks, starts = self._segments[segment], self._starts[segment]
        size = blocks[offset][0]
        self.allocated -= size
        pool = self._free[self._pools[segment]]
        position = bisect.bisect_left(starts, offset)
        after = offset + size
        if after in blocks and blocks[after][1]:  # merge the next block
            next_size = blocks.pop(after)[0]
            del starts[position + 1]
            _remove(pool, (next_size, -segment, after))
            size += next_size
        if position > 0:
            before = starts[position - 1]
            if blocks[before][1]:  # merge into the previous block
                _remove(pool, (blocks[before][0], -segment, before))
                del blocks[offset]
                del starts[position]
                offset, size = before, blocks[before][0] + size
        blocks[offset] = [size, 1]
        bisect.insort(pool, (size, -segment, offset))


def _remove(pool: list[tuple[int, int, int]], item: tuple[int, int, int]) -> None:
    index = bisect.bisect_left(pool, item)
    del pool[index]
