"""ExtentAllocator: best fit, coalescing, fragmentation, reserve, invariants under random use."""

import itertools
import random

import pytest

from mooncake_store.master.allocator import ExtentAllocator

A = 4096


def test_allocations_are_aligned_and_do_not_overlap():
    alloc = ExtentAllocator(64 * A, alignment=A)
    sizes = (1, A, A + 1, 3 * A - 5)
    offsets = [alloc.allocate(size) for size in sizes]
    assert offsets == [0, A, 2 * A, 4 * A]
    assert alloc.used_bytes == (1 + 1 + 2 + 3) * A
    alloc.validate([(o, alloc.aligned(n)) for o, n in zip(offsets, sizes, strict=True)])


def test_free_coalesces_back_to_one_extent():
    alloc = ExtentAllocator(16 * A, alignment=A)
    offsets = [alloc.allocate(A) for _ in range(16)]
    assert alloc.allocate(1) is None
    live = set(offsets)
    for off in offsets[::2] + offsets[1::2]:
        alloc.free(off, A)
        live.discard(off)
        alloc.validate([(o, A) for o in live])
    assert alloc.fragments() == 1 and alloc.largest_free() == 16 * A and alloc.used_bytes == 0


def test_fragmentation_blocks_a_large_allocation_until_neighbours_free():
    alloc = ExtentAllocator(8 * A, alignment=A)
    offsets = [alloc.allocate(A) for _ in range(8)]
    for off in offsets[::2]:
        alloc.free(off, A)
    assert alloc.free_bytes == 4 * A
    assert alloc.allocate(2 * A) is None  # 4 free units, none adjacent
    alloc.free(offsets[1], A)
    assert alloc.allocate(2 * A) is not None


def test_best_fit_takes_the_smallest_hole():
    alloc = ExtentAllocator(16 * A, alignment=A)
    a, _b, c, _d = (alloc.allocate(n * A) for n in (3, 1, 1, 1))
    alloc.free(a, 3 * A)  # hole of 3 units at 0
    alloc.free(c, A)  # hole of 1 unit between b and d
    assert alloc.allocate(A) == c


def test_double_free_and_unknown_extents_raise():
    alloc = ExtentAllocator(8 * A, alignment=A)
    off = alloc.allocate(10)
    kept = alloc.allocate(2 * A)
    alloc.free(off, 10)
    with pytest.raises(KeyError):
        alloc.free(off, 10)  # double free
    with pytest.raises(KeyError):
        alloc.free(4 * A, A)  # never allocated
    with pytest.raises(KeyError):
        alloc.free(kept, 3 * A)  # runs into free space: the wrong size
    with pytest.raises(KeyError):
        alloc.free(kept + 1, A)  # misaligned
    with pytest.raises(KeyError):
        alloc.free(7 * A, 2 * A)  # past the end
    assert alloc.used_bytes == 2 * A and alloc.allocations() == 1
    alloc.validate([(kept, 2 * A)])


def test_reserve_rebuilds_state_and_rejects_overlaps():
    alloc = ExtentAllocator(16 * A, alignment=A)
    alloc.reserve(4 * A, 2 * A)
    alloc.reserve(0, 1)
    alloc.validate([(0, A), (4 * A, 2 * A)])
    assert alloc.used_bytes == 3 * A
    with pytest.raises(ValueError):
        alloc.reserve(5 * A, A)  # inside the first reservation
    with pytest.raises(ValueError):
        alloc.reserve(100, A)  # misaligned
    assert alloc.allocate(A) == A


def test_rejects_bad_alignment():
    with pytest.raises(ValueError):
        ExtentAllocator(1 << 20, alignment=3000)


@pytest.mark.parametrize("seed", range(5))
def test_random_alloc_free_sequences_keep_invariants(seed):
    rng = random.Random(seed)
    alloc = ExtentAllocator(256 * A, alignment=A)
    live: dict[int, int] = {}
    for _ in range(2000):
        if live and rng.random() < 0.45:
            off = rng.choice(list(live))
            size = live.pop(off)
            assert alloc.free(off, size) == alloc.aligned(size)
        else:
            size = rng.choice([1, A, 3 * A + 7, 16 * A, rng.randrange(1, 40 * A)])
            off = alloc.allocate(size)
            if off is None:
                assert alloc.largest_free() < alloc.aligned(size)
                continue
            assert off % A == 0
            live[off] = size
        alloc.validate([(o, alloc.aligned(n)) for o, n in live.items()])
    spans = sorted((off, off + alloc.aligned(n)) for off, n in live.items())
    assert all(end <= nxt for (_, end), (nxt, _) in itertools.pairwise(spans))
