"""Replica relocation in the object table: copies between segments and tiers.

Tier movement (demotion, promotion: `tiering.py`) and node-to-node copies (re-replication, hot
replicas: `replication.py`) follow one protocol: `begin_move` reserves an extent in the
destination and marks the object moving; the node copies the bytes; `finish_move` swaps the
source replica for the copy, `finish_copy` adds the copy as a new replica, and either gives the
extent back when the copy failed.  A copy in flight is named by its destination segment's
generation and offset, so a copy planned before the segment was mounted again is a no-op
that never touches the new mount's space.  `drop_replica` and `hold` serve the same planners.

`ReplicaRelocation` is a base of `ObjectTable` (object_table.py; frees are in frees.py, the
eviction glue in victims.py) on top of `Membership` (membership.py: nodes and segments).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.membership import Membership
from mooncake_store.master.objects import Replica
from mooncake_store.master.releases import BlockName
from mooncake_store.master.segments import Segment

log = logging.getLogger("mooncake.master")


_NO_MOVE = (0, BlockName("", 0))  # a copy not in flight (any more)


def _log_stale(key: str, dst: Segment, offset: int) -> None:
    log.info(
        "ignored the end of a copy of %r into segment %x at offset %d: that mount (generation "
        "%d) is gone, and its space with it", key, dst.segment_id, offset, dst.generation,
    )  # fmt: skip


class ReplicaRelocation(Membership):
    """Moves and copies of replicas (see the module docstring)."""

    if TYPE_CHECKING:  # provided by ExtentFrees (frees.py)

        def _free(self, slot: int, replicas: Iterable[Replica], free_at_s: float) -> None: ...
        def _free_extent(
            self, seg: Segment, offset: int, size_bytes: int, name: BlockName | None = None
        ) -> None: ...

    def __init__(self, **membership: Any) -> None:
        super().__init__(**membership)
        # (segment, generation, offset) of a copy in flight -> its size and the block it copies
        self._moves: dict[tuple[int, int, int], tuple[int, BlockName]] = {}

    def begin_move(self, key: str, src: Segment, dst: Segment) -> tuple[Replica, int] | None:
        """Reserve an extent in `dst` for a copy of `key`'s replica in `src`; mark it moving.

        Returns (source replica, destination offset), or None when `dst` has no room (or
        already holds a replica of `key`).
        """
        slot = self._slot[key]
        replicas = self._replicas(slot)
        if any(r.segment_id == dst.segment_id for r in replicas):
            return None
        if dst.writable_after > self._clock():
            return None  # mounted again a moment ago: its room is not handed out yet
        source = next((r for r in replicas if r.segment_id == src.segment_id), None)
        offset = dst.allocator.allocate(self._size[slot]) if source is not None else None
        if source is None or offset is None:
            return None
        name = BlockName(key, self._checksum[slot])
        if dst.persistent:
            self.claim_release(dst.segment_id, offset)  # type: ignore[attr-defined]
            # Durable before the copy is asked for (server.py's tick): the node may index it
            # while no record names it (a master restart, or the key removed meanwhile).
            self.detached.detach(dst.segment_id, offset, name)
        self._cold_set(slot, "moving", True)
        self._moves[dst.segment_id, dst.generation, offset] = (self._size[slot], name)
        return source, offset

    def finish_move(self, key: str, source: Replica, dst: Segment, offset: int, ok: bool) -> bool:
        """Swap the source replica for the copy (ok) or give the copy's extent back.

        Returns True when the object now lives at the destination.
        """
        slot = self._slot.get(key)
        size_bytes, name = self._moves.pop((dst.segment_id, dst.generation, offset), _NO_MOVE)
        live_dst = self._segments.get(dst.segment_id) is dst and size_bytes > 0
        if live_dst and dst.persistent:  # recorded as a replica, or released, below
            self.detached.discard(dst.segment_id, offset)
        if not live_dst:
            _log_stale(key, dst, offset)
        valid = (
            slot is not None and self._cold_get(slot, "moving") and source in self._replicas(slot)
        )
        if slot is not None:
            self._cold_set(slot, "moving", False)
        if not (ok and valid and live_dst):
            if live_dst:  # the node may have indexed the copy: it forgets it
                self._free_extent(dst, offset, size_bytes, name)
            return False
        assert slot is not None
        kept = tuple(r for r in self._replicas(slot) if r != source)
        # The copy joins the policy before the source leaves it, so the block never looks
        # gone (its children would be orphaned, its history sent to the ghost table).
        self._set_replicas(slot, (*kept, Replica(dst.segment_id, offset)))
        dst.objects += 1
        self._cache(slot, dst.segment_id)
        self._free(slot, [source], self._protected_until(slot))  # readers keep it a while
        self._cold_set(slot, "slow_reads", 0)
        self._dirty[key] = True
        return True

    def finish_copy(self, key: str, source: Replica, dst: Segment, offset: int, ok: bool) -> bool:
        """Add the copy as a new replica (ok) or give its extent back; True when added."""
        slot = self._slot.get(key)
        size_bytes, name = self._moves.pop((dst.segment_id, dst.generation, offset), _NO_MOVE)
        live_dst = self._segments.get(dst.segment_id) is dst and size_bytes > 0
        if live_dst and dst.persistent:  # recorded as a replica, or released, below
            self.detached.discard(dst.segment_id, offset)
        if not live_dst:
            _log_stale(key, dst, offset)
        valid = (
            slot is not None and self._cold_get(slot, "moving") and self._state[slot] == COMPLETE
        )
        if slot is not None:
            self._cold_set(slot, "moving", False)
            self._cold_set(slot, "hold_until_s", 0.0)
        on_node = slot is not None and any(
            (s := self._segments.get(r.segment_id)) is not None and s.node_id == dst.node_id
            for r in self._replicas(slot)
        )
        if not (ok and valid and live_dst) or on_node:
            if live_dst:  # the node may have indexed the copy: it forgets it
                self._free_extent(dst, offset, size_bytes, name)
            return False
        assert slot is not None
        self._set_replicas(slot, (*self._replicas(slot), Replica(dst.segment_id, offset)))
        dst.objects += 1
        self._cache(slot, dst.segment_id)
        self._dirty[key] = True
        return True

    def drop_replica(self, key: str, seg: Segment) -> None:
        """Remove one replica of a committed object that keeps at least one other."""
        slot = self._slot[key]
        replicas = self._replicas(slot)
        if len(replicas) < 2:
            raise ValueError(f"{key!r} has a single replica; remove the object instead")
        replica = next(r for r in replicas if r.segment_id == seg.segment_id)
        self._set_replicas(slot, tuple(r for r in replicas if r != replica))
        self._free(slot, [replica], self._protected_until(slot))
        self._dirty[key] = True

    def hold(self, key: str, until_s: float) -> None:
        """Protect `key`'s extents for a node-to-node copy (released by finish_copy)."""
        slot = self._slot.get(key)
        if slot is not None:
            self._cold_set(slot, "hold_until_s", max(self._cold_get(slot, "hold_until_s"), until_s))

    def _move_extents(self) -> dict[int, list[tuple[int, int]]]:
        """Extents reserved by copies in flight, per live segment (for `validate`)."""
        out: dict[int, list[tuple[int, int]]] = {}
        for (segment_id, generation, offset), (size_bytes, _) in self._moves.items():
            seg = self._segments.get(segment_id)
            if seg is not None and seg.generation == generation:
                out.setdefault(segment_id, []).append((offset, seg.allocator.aligned(size_bytes)))
        return out
