"""Eviction policies (pure): which block of a segment goes first when room is needed.

One interface, two policies:

- `LruPolicy`: plain least-recently-read first.
- `WeightedPolicy` (default): GreedyDual-Size-Frequency, chain-aware.  A block's priority is
  `L + cost(depth) * (1 + reads + readmissions)`, where `L` is the segment's inflation clock
  (the priority of the last block evicted from it, so idle blocks age), `reads` counts reads
  (never probes: `exists` and `prefix_match` do not keep a block alive), `readmissions` counts
  puts of the key after it had been evicted (remembered in a bounded ghost table: a block that
  comes back has proven it is reused), and `cost(depth) = 1 + depth_cost * depth` is the prefill
  a hit saves (attention over the prefix makes deep blocks dearer to recompute; the default
  0.02 ~ tokens_per_block / (6 * hidden size) for 512-token blocks of a 4096-wide model).
  Chain-aware: a block whose parent was not cached when it was put, or whose parent has gone
  since, is worth nothing (nobody can reach it by prefix) and goes first; otherwise only leaves
  (blocks with no cached child) are evicted, so a chain is cut from its tail and never orphans
  its own suffix.

Policies know blocks by the object table's slot numbers: small dense ints, one per object, so
the weighted policy keeps its per-block state in flat arrays indexed by slot rather than in a
Python object per block (a big master holds 10M blocks).  The table tells a policy about
inserts, reads and removals, and asks `pick(segment_id, evictable)` for the next victim.
"""

from __future__ import annotations

import heapq
import struct
from abc import ABC, abstractmethod
from array import array
from collections import OrderedDict
from collections.abc import Callable

NO_PARENT = -1  # the first block of a chain (or a block that is not part of one)
LOST_PARENT = -2  # the block names a parent that is not cached: unreachable by prefix


class EvictionPolicy(ABC):
    name: str

    @abstractmethod
    def insert(self, slot: int, segment_id: int, *, parent: int = NO_PARENT, key: str = "") -> None:
        """A replica of block `slot` now lives in `segment_id`.

        `parent` is the slot of its prefix parent when the table holds one (NO_PARENT for none,
        LOST_PARENT when the named parent is not stored); `key` names the block for the ghost
        table, which outlives its slot.
        """

    @abstractmethod
    def access(self, slot: int) -> None:
        """Block `slot` was read."""

    @abstractmethod
    def discard(self, slot: int, segment_id: int, key: str = "") -> None:
        """The replica of `slot` in `segment_id` is gone (the block may live on elsewhere)."""

    @abstractmethod
    def pick(self, segment_id: int, evictable: Callable[[int], bool]) -> int | None:
        """The lowest-value evictable slot in `segment_id`, or None.  Does not remove it."""


class LruPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._order: dict[int, OrderedDict[int, None]] = {}
        self._where: dict[int, set[int]] = {}

    def insert(self, slot: int, segment_id: int, *, parent: int = NO_PARENT, key: str = "") -> None:
        self._order.setdefault(segment_id, OrderedDict())[slot] = None
        self._where.setdefault(slot, set()).add(segment_id)

    def access(self, slot: int) -> None:
        for segment_id in self._where.get(slot, ()):
            self._order[segment_id].move_to_end(slot)

    def discard(self, slot: int, segment_id: int, key: str = "") -> None:
        order = self._order.get(segment_id)
        if order is not None:
            order.pop(slot, None)
        where = self._where.get(slot)
        if where is not None:
            where.discard(segment_id)
            if not where:
                del self._where[slot]

    def pick(self, segment_id: int, evictable: Callable[[int], bool]) -> int | None:
        for slot in self._order.get(segment_id, ()):
            if evictable(slot):
                return slot
        return None


# A heap entry is one int: (priority bits << 80) | (version << 32) | slot.  The bits of a
# non-negative double order as the double does, so ints compare as (priority, version) tuples
# would, at ~44 bytes an entry instead of ~116 for a tuple with a float and an int in it.
# Versions are unique and increasing, so they break priority ties in insertion order; an entry
# whose version is not its slot's current one is stale.
_SLOT_MASK = (1 << 32) - 1
_VERSION_MASK = (1 << 48) - 1
_NONE = 0  # no segment (segment ids are never 0): the slot is not in the policy
_NO_CHILD = -1
_MANY = -2  # more than one cached child: see _children
_DOUBLE = struct.Struct("<d")
_UINT64 = struct.Struct("<Q")
_NAN = float("nan")


def _bits(priority: float) -> int:
    return _UINT64.unpack(_DOUBLE.pack(priority + 0.0))[0]  # +0.0: never -0.0  # type: ignore[no-any-return]


def _priority(entry: int) -> float:
    return _DOUBLE.unpack(_UINT64.pack(entry >> 80))[0]  # type: ignore[no-any-return]


class WeightedPolicy(EvictionPolicy):
    name = "weighted"

    def __init__(self, *, depth_cost: float = 0.02, ghost_entries: int = 1_000_000) -> None:
        if depth_cost < 0:
            raise ValueError(f"depth_cost must be >= 0, got {depth_cost}")
        self.depth_cost = depth_cost
        self.ghost_entries = ghost_entries
        # Per slot, ~34 bytes in arrays (plus ~44 bytes for its heap entry).
        self._segment = array("Q")  # its first segment; _NONE when not in the policy
        self._reads = array("I")
        self._readmissions = array("I")
        self._depth = array("I")
        self._parent = array("i")  # parent slot, NO_PARENT or LOST_PARENT
        self._child = array("i")  # its one cached child, _NO_CHILD or _MANY
        self._version = array("Q")
        # Read since its heap entries were pushed: the segment's clock at the last read (NaN:
        # not read).  The entries are re-pushed when they reach the top of a heap, with the
        # priority an eager re-push at read time would have given (reads only raise
        # priorities, so the heap order stays right), which keeps a read O(1).
        self._touched = array("d")
        # The rare cases, kept aside: blocks in several segments, forks.
        self._segments: dict[int, tuple[int, ...]] = {}  # slot -> every segment, when > 1
        self._touched_all: dict[int, tuple[float, ...]] = {}  # clocks per segment, when > 1
        self._children: dict[int, set[int]] = {}  # slot -> children, when > 1
        self._in_heap: dict[int, int] = {}  # segment -> blocks in it (live heap entries)
        self._ghost: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> reads, readmits
        self._heaps: dict[int, list[int]] = {}
        self._clock: dict[int, float] = {}
        self._seq = 0

    # ---- per-slot state ----------------------------------------------------------------------

    def _grow(self, slot: int) -> None:
        n = slot + 1 - len(self._segment)
        if n <= 0:
            return
        n = max(n, len(self._segment) // 16, 256)  # in steps: one extend per column per step
        self._segment.frombytes(bytes(8 * n))
        zeros = bytes(4 * n)
        self._reads.frombytes(zeros)
        self._readmissions.frombytes(zeros)
        self._depth.frombytes(zeros)
        self._parent.extend(array("i", [NO_PARENT]) * n)
        self._child.extend(array("i", [_NO_CHILD]) * n)
        self._version.frombytes(bytes(8 * n))
        self._touched.extend(array("d", [_NAN]) * n)

    def _known(self, slot: int) -> bool:
        return slot < len(self._segment) and self._segment[slot] != _NONE

    def _segments_of(self, slot: int) -> tuple[int, ...]:
        first = self._segment[slot]
        if first == _NONE:
            return ()
        return self._segments.get(slot) or (first,)

    def _set_segments(self, slot: int, segments: tuple[int, ...]) -> None:
        counts = self._in_heap
        for segment_id in self._segments_of(slot):
            counts[segment_id] -= 1
        for segment_id in segments:
            counts[segment_id] = counts.get(segment_id, 0) + 1
        self._segment[slot] = segments[0] if segments else _NONE
        if len(segments) > 1:
            self._segments[slot] = segments
        else:
            self._segments.pop(slot, None)

    def _in_segment(self, slot: int, segment_id: int) -> bool:
        if self._segment[slot] == segment_id:
            return True
        more = self._segments.get(slot)
        return more is not None and segment_id in more

    def _children_of(self, slot: int) -> tuple[int, ...] | set[int]:
        child = self._child[slot]
        if child == _NO_CHILD:
            return ()
        return self._children[slot] if child == _MANY else (child,)

    def _add_child(self, slot: int, child: int) -> None:
        known = self._child[slot]
        if known == _NO_CHILD:
            self._child[slot] = child
        elif known == _MANY:
            self._children[slot].add(child)
        elif known != child:
            self._children[slot] = {known, child}
            self._child[slot] = _MANY

    def _remove_child(self, slot: int, child: int) -> None:
        known = self._child[slot]
        if known == _MANY:
            children = self._children[slot]
            children.discard(child)
            if len(children) == 1:
                self._child[slot] = children.pop()
                del self._children[slot]
        elif known == child:
            self._child[slot] = _NO_CHILD

    def _value(self, slot: int) -> float:
        reuse = 1 + self._reads[slot] + self._readmissions[slot]
        return (1.0 + self.depth_cost * self._depth[slot]) * reuse

    # ---- heaps -------------------------------------------------------------------------------

    def _push(self, slot: int, segment_id: int, clock: float, value: float) -> None:
        priority = clock if self._parent[slot] == LOST_PARENT else clock + value
        heap = self._heaps.setdefault(segment_id, [])
        heapq.heappush(heap, (_bits(priority) << 80) | (self._version[slot] << 32) | slot)
        if len(heap) > 2 * self._in_heap.get(segment_id, 0) + 1024:
            self._compact(segment_id)  # stale entries (refreshed or removed blocks) at most half

    def _renew(self, slot: int) -> None:
        self._seq += 1  # unique across re-inserts: old entries stay stale
        self._version[slot] = self._seq & _VERSION_MASK
        self._touched[slot] = _NAN
        self._touched_all.pop(slot, None)

    def _refresh(self, slot: int) -> None:
        self._renew(slot)
        value = self._value(slot)
        for segment_id in self._segments_of(slot):
            self._push(slot, segment_id, self._clock.setdefault(segment_id, 0.0), value)

    def _catch_up(self, slot: int) -> None:
        """Push the entries a read deferred, priced at the clocks of that read."""
        clocks = self._touched_all.get(slot) or (self._touched[slot],)
        self._renew(slot)
        value = self._value(slot)
        for segment_id, clock in zip(self._segments_of(slot), clocks, strict=True):
            self._push(slot, segment_id, clock, value)

    def _current(self, entry: int, segment_id: int) -> bool:
        slot = entry & _SLOT_MASK
        return (entry >> 32) & _VERSION_MASK == self._version[slot] and self._in_segment(
            slot, segment_id
        )

    def _compact(self, segment_id: int) -> None:
        """Drop stale entries (refreshes leave old ones behind)."""
        heap = self._heaps[segment_id]
        heap[:] = [entry for entry in heap if self._current(entry, segment_id)]  # in place: a
        heapq.heapify(heap)  # pick() in progress keeps its reference

    # ---- the interface -----------------------------------------------------------------------

    def insert(self, slot: int, segment_id: int, *, parent: int = NO_PARENT, key: str = "") -> None:
        if not 0 < segment_id < 1 << 64:
            raise ValueError(f"segment id {segment_id} is out of range")
        self._grow(slot)
        segments = self._segments_of(slot)
        if not segments:  # new to the policy
            reads = readmissions = 0
            remembered = self._ghost.pop(key, None) if key else None
            if remembered is not None:
                reads, readmissions = remembered[0], remembered[1] + 1
            self._reads[slot] = reads
            self._readmissions[slot] = readmissions
            if parent >= 0 and self._known(parent):
                self._depth[slot] = self._depth[parent] + 1
                self._parent[slot] = parent
                self._add_child(parent, slot)
            else:
                self._depth[slot] = 0
                self._parent[slot] = NO_PARENT if parent == NO_PARENT else LOST_PARENT
        if segment_id not in segments:
            self._set_segments(slot, (*segments, segment_id))
        self._refresh(slot)

    def access(self, slot: int) -> None:
        segments = self._segment
        if slot >= len(segments):
            return
        first = segments[slot]
        if first == _NONE:
            return
        reads = self._reads[slot]
        if reads < 0xFFFFFFFF:
            self._reads[slot] = reads + 1
        if slot not in self._segments:
            self._touched[slot] = self._clock.get(first, 0.0)
        else:
            clocks = tuple(self._clock.get(s, 0.0) for s in self._segments[slot])
            self._touched_all[slot] = clocks
            self._touched[slot] = clocks[0]

    def discard(self, slot: int, segment_id: int, key: str = "") -> None:
        if not self._known(slot):
            return
        remaining = tuple(s for s in self._segments_of(slot) if s != segment_id)
        self._set_segments(slot, remaining)
        if remaining:
            self._refresh(slot)
            return
        self._renew(slot)  # every entry of it is stale now
        parent = self._parent[slot]
        if parent >= 0:
            # The parent may now be a leaf; its heap entry stays valid and keeps its priority
            # (becoming a leaf is not an access).
            self._remove_child(parent, slot)
        for child in list(self._children_of(slot)):  # now unreachable by prefix: worth nothing
            self._parent[child] = LOST_PARENT
            self._refresh(child)
        self._child[slot] = _NO_CHILD
        self._children.pop(slot, None)
        self._parent[slot] = NO_PARENT
        if key:
            self._ghost[key] = (self._reads[slot], self._readmissions[slot])
            self._ghost.move_to_end(key)
            while len(self._ghost) > self.ghost_entries:
                self._ghost.popitem(last=False)

    def pick(self, segment_id: int, evictable: Callable[[int], bool]) -> int | None:
        heap = self._heaps.get(segment_id)
        if not heap:
            return None
        stash: list[int] = []
        fallback: int | None = None
        chosen: int | None = None
        while heap:
            entry = heapq.heappop(heap)
            if not self._current(entry, segment_id):
                continue  # stale
            slot = entry & _SLOT_MASK
            touched = self._touched[slot]
            if touched == touched:  # not NaN: read since its entries were pushed
                self._catch_up(slot)
                continue  # its new entry is further down this heap
            stash.append(entry)
            if not evictable(slot):
                continue
            if self._child[slot] != _NO_CHILD and self._parent[slot] != LOST_PARENT:
                if fallback is None:
                    fallback = entry  # only if no leaf can go
                continue
            chosen = entry
            break
        if chosen is None:
            chosen = fallback
        for entry in stash:
            heapq.heappush(heap, entry)
        if chosen is None:
            return None
        self._clock[segment_id] = max(self._clock.get(segment_id, 0.0), _priority(chosen))
        return chosen & _SLOT_MASK

    def ghost_size(self) -> int:
        return len(self._ghost)


def make_policy(name: str, **options: float) -> EvictionPolicy:
    if name == "lru":
        return LruPolicy()
    if name == "weighted":
        return WeightedPolicy(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown eviction policy {name!r}: use 'weighted' or 'lru'")
