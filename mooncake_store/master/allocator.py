"""Extent allocator for one mounted segment (pure: no I/O, no clock).

The master owns allocation inside every store node's segment, as Mooncake's master does: a
node mounts its pool, and the master hands out extents of it to puts.  Extents are multiples of
`alignment` bytes and start on an `alignment` boundary.  Free space is kept twice: by offset
(to merge neighbours on free) and by (length, offset) (to find the best fit in O(log n)).

Only free space is recorded: an allocated extent is known by its owner (the object table keeps
every replica's offset and size), who names both when freeing it.  That saves ~65 bytes per
block on a master with 10M of them.  A free that overlaps free space (a double free, a wrong
offset or size) is refused.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable


class ExtentAllocator:
    """Best-fit allocator over `[0, capacity_bytes)` with coalescing frees.

    Example:
        >>> a = ExtentAllocator(1 << 20, alignment=4096)
        >>> off = a.allocate(5000)        # 8192 bytes reserved
        >>> a.free(off, 5000)
        8192
    """

    def __init__(self, capacity_bytes: int, *, alignment: int = 4096) -> None:
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        self.alignment = alignment
        self.capacity_bytes = capacity_bytes - capacity_bytes % alignment
        self.used_bytes = 0
        self._count = 0
        self._lengths: dict[int, int] = {}
        self._free_len: dict[int, int] = {}
        self._free_offsets: list[int] = []
        self._free_by_size: list[tuple[int, int]] = []
        if self.capacity_bytes > 0:
            self._add_free(0, self.capacity_bytes)

    def aligned(self, size_bytes: int) -> int:
        """The extent length `size_bytes` occupies (at least one alignment unit)."""
        need = self._lengths.get(size_bytes)
        if need is None:
            a = self.alignment
            need = max(a, (size_bytes + a - 1) // a * a)
            if len(self._lengths) < 4096:
                # One int object per block size, shared by every extent of that size (blocks
                # come in a few sizes; a fresh int per allocation is 32 bytes each).
                self._lengths[size_bytes] = need
        return need

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - self.used_bytes

    def largest_free(self) -> int:
        return self._free_by_size[-1][0] if self._free_by_size else 0

    def allocations(self) -> int:
        return self._count

    def fragments(self) -> int:
        return len(self._free_offsets)

    def allocate(self, size_bytes: int) -> int | None:
        """Reserve an extent for `size_bytes` and return its offset, or None if nothing fits."""
        need = self.aligned(size_bytes)
        i = bisect_left(self._free_by_size, (need, -1))
        if i == len(self._free_by_size):
            return None
        length, offset = self._free_by_size[i]
        self._remove_free(offset)
        if length > need:
            self._add_free(offset + need, length - need)
        self._count += 1
        self.used_bytes += need
        return offset

    def reserve(self, offset: int, size_bytes: int) -> None:
        """Mark the extent at `offset` as allocated (rebuilding state after a master restart).

        Raises:
            ValueError: the extent is misaligned or not entirely free.
        """
        need = self.aligned(size_bytes)
        if offset % self.alignment:
            raise ValueError(f"offset {offset} is not aligned to {self.alignment}")
        i = bisect_left(self._free_offsets, offset + 1) - 1
        if i < 0:
            raise ValueError(f"extent at {offset} (+{need}) is not free")
        start = self._free_offsets[i]
        length = self._free_len[start]
        if offset + need > start + length:
            raise ValueError(f"extent at {offset} (+{need}) is not free")
        self._remove_free(start)
        if offset > start:
            self._add_free(start, offset - start)
        if start + length > offset + need:
            self._add_free(offset + need, start + length - offset - need)
        self._count += 1
        self.used_bytes += need

    def free(self, offset: int, size_bytes: int) -> int:
        """Release the extent at `offset` allocated for `size_bytes`; return its length.

        Raises:
            KeyError: the extent is not allocated: misaligned, outside the segment, or
                overlapping free space (a double free, or a wrong offset or size).
        """
        length = self.aligned(size_bytes)
        start, end = offset, offset + length
        if not self.holds(offset, size_bytes):
            raise KeyError(f"no extent of {length} bytes is allocated at offset {offset}")
        i = bisect_left(self._free_offsets, offset)
        self._count -= 1
        self.used_bytes -= length
        if i < len(self._free_offsets) and self._free_offsets[i] == end:
            end += self._free_len[end]
            self._remove_free(self._free_offsets[i])
        if i > 0:
            prev = self._free_offsets[i - 1]
            if prev + self._free_len[prev] == start:
                start = prev
                self._remove_free(prev)
        self._add_free(start, end - start)
        return length

    def holds(self, offset: int, size_bytes: int) -> bool:
        """Whether `free(offset, size_bytes)` would be taken: aligned, inside the segment and
        overlapping no free space."""
        end = offset + self.aligned(size_bytes)
        i = bisect_left(self._free_offsets, offset)
        return not (
            offset % self.alignment
            or offset < 0
            or end > self.capacity_bytes
            or (i < len(self._free_offsets) and self._free_offsets[i] < end)
            or (
                i > 0
                and self._free_offsets[i - 1] + self._free_len[self._free_offsets[i - 1]] > offset
            )
        )

    def validate(self, allocated: Iterable[tuple[int, int]]) -> None:
        """Check the invariants (used by tests): the free extents and the `allocated` ones
        (offset, length), which their owner knows, tile the segment exactly once."""
        assert sorted(self._free_offsets) == self._free_offsets
        assert sorted(self._free_by_size) == self._free_by_size
        assert len(self._free_by_size) == len(self._free_offsets) == len(self._free_len)
        used = list(allocated)
        assert len(used) == self._count, f"{len(used)} extents named, {self._count} allocated"
        extents = [(o, n, "free") for o, n in self._free_len.items()]
        extents += [(o, n, "used") for o, n in used]
        extents.sort()
        cursor = 0
        for i, (offset, length, kind) in enumerate(extents):
            assert offset == cursor, f"gap or overlap at {offset} (expected {cursor})"
            assert length > 0 and length % self.alignment == 0
            if kind == "free" and i > 0:
                assert extents[i - 1][2] == "used", f"unmerged free neighbours at {offset}"
            cursor += length
        assert cursor == self.capacity_bytes
        assert self.used_bytes == sum(n for _, n in used)

    def _add_free(self, offset: int, length: int) -> None:
        self._free_len[offset] = length
        insort(self._free_offsets, offset)
        insort(self._free_by_size, (length, offset))

    def _remove_free(self, offset: int) -> None:
        length = self._free_len.pop(offset)
        del self._free_offsets[bisect_left(self._free_offsets, offset)]
        del self._free_by_size[bisect_left(self._free_by_size, (length, offset))]
