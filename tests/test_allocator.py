"""The caching-allocator replay: PyTorch's rounding, pools, segment sizes, best fit, caching."""

from __future__ import annotations

import pytest

from ckpt_core._memory.allocator import MIB, CachingAllocator, round_size, segment_size


@pytest.mark.parametrize(
    ("size", "rounded"), [(1, 512), (512, 512), (513, 1024), (3 * MIB + 1, 3 * MIB + 512)]
)
def test_requests_round_up_to_512_bytes(size: int, rounded: int) -> None:
    assert round_size(size) == rounded


@pytest.mark.parametrize(
    ("size", "segment"),
    [
        (512, 2 * MIB),  # small pool
        (MIB, 2 * MIB),
        (MIB + 512, 20 * MIB),  # large pool, below 10 MiB
        (10 * MIB - 512, 20 * MIB),
        (10 * MIB, 10 * MIB),  # rounded up to 2 MiB
        (11 * MIB, 12 * MIB),
    ],
)
def test_segment_sizes(size: int, segment: int) -> None:
    assert segment_size(size) == segment


def test_small_requests_share_a_2_mib_segment() -> None:
    allocator = CachingAllocator()
    for _ in range(4096):  # 4096 x 512 B = 2 MiB
        allocator.malloc(100)
    assert allocator.reserved == 2 * MIB
    allocator.malloc(100)
    assert allocator.reserved == 4 * MIB


def test_freed_blocks_are_cached_and_split_for_smaller_requests() -> None:
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(100 * MIB))
    assert allocator.allocated == 0 and allocator.reserved == 100 * MIB
    allocator.malloc(30 * MIB)
    allocator.malloc(60 * MIB)  # both carved from the cached 100 MiB segment
    assert allocator.reserved == 100 * MIB
    assert allocator.allocated == 90 * MIB


def test_a_remainder_of_at_most_1_mib_is_not_split_off() -> None:
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(100 * MIB))
    allocator.malloc(100 * MIB - MIB)
    assert allocator.allocated == 100 * MIB  # the whole block: 1 MiB is too small to split


def test_best_fit_takes_the_smallest_cached_block_that_fits() -> None:
    allocator = CachingAllocator()
    large, small = allocator.malloc(100 * MIB), allocator.malloc(40 * MIB)
    allocator.free(large)
    allocator.free(small)
    allocator.malloc(30 * MIB)  # from the 40 MiB block
    allocator.malloc(100 * MIB)  # the 100 MiB block is still whole
    assert allocator.reserved == 140 * MIB


def test_a_kept_piece_of_a_freed_transient_strands_its_segment() -> None:
    """The mechanism behind reserved >> allocated: a large transient, then a small kept piece."""
    allocator = CachingAllocator()
    scores = allocator.malloc(100 * MIB)
    allocator.free(scores)
    allocator.malloc(12 * MIB)  # a hidden state kept for backward, carved from the cache
    allocator.malloc(100 * MIB)  # the next scores buffer no longer fits: a new segment
    assert allocator.allocated == 112 * MIB
    assert allocator.reserved == 200 * MIB
    assert allocator.peak_reserved == 200 * MIB


def test_freed_neighbours_merge() -> None:
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(90 * MIB))
    first, second, third = (allocator.malloc(30 * MIB) for _ in range(3))
    allocator.free(first)
    allocator.free(third)
    allocator.free(second)  # merges with both neighbours
    allocator.malloc(90 * MIB)
    assert allocator.reserved == 90 * MIB
