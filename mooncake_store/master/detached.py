"""Detached blocks: what a dropped persistent segment still holds, by key (pure core: no I/O).

A node dropped as dead (silent past its grace, or an orphan past the restore grace) takes its
replicas out of the master's records, but its persistent (NVMe) tier keeps the blocks, and
when it mounts again the master adopts those its inventory reports (membership.py).  That is
wanted for a block whose key lives on or was lost with the node; but a key *removed* while the
node was away must not come back.  So the master keeps, per key, the blocks that dropped
segments held (`detach`), and likewise each copy on its way into a persistent segment (from
before the Move or Fetch is sent until it ends: relocation.py), which a node may index though
no record names it yet.  Removing or evicting the key makes them owed releases (`take`,
releases.py), and a mount of the segment ends its detached blocks (`forget_segment`): from
then on its inventory speaks for them.

They are persisted (persistence.py `d/` records, in the batch of the drop), since the object
records no longer name them.  Those of a segment that never mounts again stay recorded.
"""

from __future__ import annotations

from collections.abc import Iterable

from mooncake_store.master.releases import BlockName, RecordChanges


class DetachedBlocks(RecordChanges):
    """Blocks of dropped persistent segments, by key and by segment."""

    def __init__(self) -> None:
        super().__init__()
        self._by_key: dict[str, set[tuple[int, int]]] = {}
        self._by_segment: dict[int, dict[int, BlockName]] = {}

    def __len__(self) -> int:
        return sum(len(blocks) for blocks in self._by_segment.values())

    def detach(self, segment_id: int, offset: int, name: BlockName) -> None:
        """`segment_id` was dropped holding the block `name` at `offset`."""
        blocks = self._by_segment.setdefault(segment_id, {})
        if offset in blocks:
            self._unlink(blocks[offset].key, segment_id, offset)
        blocks[offset] = name
        self._by_key.setdefault(name.key, set()).add((segment_id, offset))
        self._dirty[segment_id, offset] = name

    def named(self, segment_id: int, offset: int) -> BlockName | None:
        """The detached block at `offset` of `segment_id`, if any."""
        return self._by_segment.get(segment_id, {}).get(offset)

    _current = named

    def of_key(self, key: str) -> list[tuple[int, int, BlockName]]:
        """The detached blocks of `key`: (segment, offset, block)."""
        return [(s, o, self._by_segment[s][o]) for s, o in sorted(self._by_key.get(key, ()))]

    def take(self, key: str) -> list[tuple[int, int, BlockName]]:
        """The detached blocks of `key`, which is removed or evicted: the caller owes their
        releases (drained)."""
        out = self.of_key(key)
        for segment_id, offset, _ in out:
            self._end(segment_id, offset)
        return out

    def discard(self, segment_id: int, offset: int) -> None:
        """The records name the block at `offset` now, or its release is owed: not detached."""
        if offset in self._by_segment.get(segment_id, {}):
            self._end(segment_id, offset)

    def forget_segment(self, segment_id: int) -> None:
        """`segment_id` mounts again: its inventory speaks for its blocks now."""
        for offset in list(self._by_segment.get(segment_id, ())):
            self._end(segment_id, offset)

    def _end(self, segment_id: int, offset: int) -> None:
        blocks = self._by_segment[segment_id]
        name = blocks.pop(offset)
        if not blocks:
            del self._by_segment[segment_id]
        self._unlink(name.key, segment_id, offset)
        self._dirty[segment_id, offset] = None

    def _unlink(self, key: str, segment_id: int, offset: int) -> None:
        places = self._by_key.get(key)
        if places is not None:
            places.discard((segment_id, offset))
            if not places:
                del self._by_key[key]

    # ---- persistence (persistence.py `d/` records; take_dirty, mark_dirty: RecordChanges) --

    def restore(self, records: Iterable[tuple[int, int, BlockName]]) -> int:
        """Load the detached blocks stored by an earlier run (at start-up)."""
        count = 0
        for segment_id, offset, name in records:
            self._by_segment.setdefault(segment_id, {})[offset] = name
            self._by_key.setdefault(name.key, set()).add((segment_id, offset))
            count += 1
        return count
