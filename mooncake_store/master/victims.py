"""The eviction policy's view of the object table: which objects may be evicted, and
evicting them to make room.

A block may be evicted when it is committed, not leased, not held for a copy, not pinned and
not being moved; soft-pinned blocks go only when nothing else can.  The policy itself (LRU,
prefix-aware ghosts) is in `eviction.py`.

`EvictionVictims` is a base of `ObjectTable` (object_table.py) on top of `ExtentFrees`.
"""

from __future__ import annotations

import logging

from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.eviction import LOST_PARENT, NO_PARENT
from mooncake_store.master.frees import ExtentFrees
from mooncake_store.master.segments import Segment

log = logging.getLogger("mooncake.master")


class EvictionVictims(ExtentFrees):
    """Eviction glue (see the module docstring)."""

    def _parent_slot(self, slot: int) -> int:
        """The slot of this block's prefix parent, for the eviction policy."""
        parent_key = self._parent[slot]
        if not parent_key:
            return NO_PARENT
        parent = self._slot.get(parent_key)
        return LOST_PARENT if parent is None else parent

    def _cache(self, slot: int, segment_id: int) -> None:
        """Tell the eviction policy about a committed replica of `slot` in `segment_id`."""
        key = self._key[slot]
        assert key is not None
        self.policy.insert(slot, segment_id, parent=self._parent_slot(slot), key=key)

    def _evict_for(self, candidates: list[Segment], extent: int) -> list[Segment]:
        """Evict from the segment with most free space until `extent` fits; [] if impossible."""
        for seg in sorted(candidates, key=lambda s: -s.free_bytes):
            if self.make_room(seg, extent):
                return [seg]
        return []

    def make_room(self, seg: Segment, extent: int) -> bool:
        """Evict victims from `seg` until an extent of `extent` bytes fits.  A persistent
        segment holding that much for Releases not answered yet evicts nothing more: the room
        comes back at the next tick (frees.py `releasing_bytes`)."""
        while seg.allocator.largest_free() < extent:
            if seg.persistent and self.releasing_bytes(seg) >= extent:  # type: ignore[attr-defined]
                return False
            # Soft-pinned objects go only when nothing else can (issue 13).
            victim = self.policy.pick(seg.segment_id, self._evictable_unpinned)
            if victim is None:
                victim = self.policy.pick(seg.segment_id, self._evictable)
            if victim is None:
                return False
            self._evict(victim, seg)
        return True

    def _evictable_unpinned(self, slot: int) -> bool:
        return self._evictable(slot) and self._cold_get(slot, "soft_pin_until_s") <= self._clock()

    def victim(self, seg: Segment) -> str | None:
        """The key the eviction policy would evict from `seg` next (nothing is removed)."""
        slot = self.policy.pick(seg.segment_id, self._evictable)
        return None if slot is None else self._key[slot]

    def evictable(self, key: str) -> bool:
        slot = self._slot.get(key)
        return slot is not None and self._evictable(slot)

    def _evictable(self, slot: int) -> bool:
        if self._state[slot] != COMPLETE:
            return False
        now = self._clock()
        cold = self._cold.get(slot)
        if cold is None:
            return self._lease[slot] <= now
        return (
            not cold.moving
            and max(self._lease[slot], cold.hold_until_s) <= now
            and cold.pin_until_s <= now
        )

    def evict(self, key: str, seg: Segment) -> None:
        """Drop `key`'s replica in `seg` (the object goes when it was the last one)."""
        self._evict(self._slot[key], seg)

    def _evict(self, slot: int, seg: Segment) -> None:
        replica = next(r for r in self._replicas(slot) if r.segment_id == seg.segment_id)
        self.counters["evictions"] += 1
        self._lose_replica(slot, replica, ghost=True)
