"""Owed releases: persistent-tier blocks the master let go of, until their node forgets them
(pure core: no I/O, no clock).

A node indexes the blocks of its persistent (NVMe) tier and reports them when it mounts, and
the master adopts those it does not know (that is how a master that lost its RocksDB gets them
back).  So a block the master removed, evicted or moved away must leave the node's index too, or
it comes back at the node's next mount: the master owes that node a `Release`.  A release names
the block (offset, key and checksum), and a node forgets the entry at that offset only while it
still holds that block there: a release that arrives late, after a new block went to the same
offset, leaves the new block alone.

The rules, all here:

- A release is *owed* from the moment the block leaves the master's records (`owe`; the
  extent may still be held by a read lease, or its segment not mounted), and *queued* for
  sending once its extent is free (`queue`).  `take` sends the queued ones of mounted segments;
  an offset already in flight waits for its reply, so one reply never answers for two sends.
- The node's reply ends it (`done`), unless the block was released again meanwhile; a refused
  or failed one is queued again (`again`).
- An extent allocated again at the same offset (`claim`) ends what was owed there: the node
  indexes the new block under that offset, and its own release, if any, is owed anew.
- A segment mounted again (`at_mount`) gets back everything owed there, to check against its
  inventory (membership.py): a block it still reports is released again, the rest ended
  (`drop`).
- Every change is durable before its release is sent and before the change that caused it is
  acknowledged: owed releases are stored in RocksDB (persistence.py `r/` records) in the same
  batch as the removal, eviction or move (`take_dirty`), so a master that restarts before the
  node took the release still releases the block at the next mount instead of adopting it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple


class BlockName(NamedTuple):
    """What a node's index must still hold at an offset for a release to forget it."""

    key: str
    checksum: int


# (segment id, offset, name): an owed release; name None in a change to persist: it ended.
ReleaseRecord = tuple[int, int, BlockName | None]


class OwedReleases:
    """Releases owed to nodes, per segment and offset (see the module docstring)."""

    def __init__(self) -> None:
        self._owed: dict[int, dict[int, BlockName]] = {}
        self._queued: dict[int, set[int]] = {}
        self._sending: dict[int, set[int]] = {}
        self._dirty: dict[tuple[int, int], BlockName | None] = {}

    def __len__(self) -> int:
        return sum(len(owed) for owed in self._owed.values())

    def owed(self, segment_id: int, offset: int) -> BlockName | None:
        return self._owed.get(segment_id, {}).get(offset)

    def owe(self, segment_id: int, offset: int, name: BlockName) -> None:
        """The block `name` at `offset` left the master's records: its node must forget it."""
        owed = self._owed.setdefault(segment_id, {})
        if owed.get(offset) != name:
            owed[offset] = name
            self._dirty[segment_id, offset] = name

    def queue(self, segment_id: int, offset: int, name: BlockName | None = None) -> None:
        """Its extent is free: send the release (`name`: the block, when not owed already)."""
        if name is not None:
            self.owe(segment_id, offset, name)
        if self.owed(segment_id, offset) is not None:
            self._queued.setdefault(segment_id, set()).add(offset)

    def take(self, mounted: Callable[[int], bool]) -> dict[int, list[tuple[int, BlockName]]]:
        """The queued releases to send now, per segment, marked in flight.  Those of a segment
        not mounted stay queued; an offset still in flight waits for its reply."""
        out: dict[int, list[tuple[int, BlockName]]] = {}
        for segment_id in list(self._queued):
            if not mounted(segment_id):
                continue
            owed = self._owed.get(segment_id, {})
            sending = self._sending.setdefault(segment_id, set())
            waiting = {o for o in self._queued[segment_id] if o in owed and o in sending}
            ready = sorted(o for o in self._queued[segment_id] if o in owed and o not in sending)
            if ready:
                out[segment_id] = [(offset, owed[offset]) for offset in ready]
                sending.update(ready)
            elif not sending:
                del self._sending[segment_id]
            if waiting:
                self._queued[segment_id] = waiting
            else:
                del self._queued[segment_id]
        return out

    def done(self, segment_id: int, offsets: Iterable[int]) -> None:
        """The node took these releases: what they named is gone from its index."""
        sending = self._sending.get(segment_id, set())
        for offset in offsets:
            if offset not in sending:
                continue  # claimed, or its segment mounted again, since it was sent
            sending.discard(offset)
            if offset not in self._queued.get(segment_id, ()):  # not released again meanwhile
                self._end(segment_id, offset)
        if not sending:
            self._sending.pop(segment_id, None)

    def again(self, segment_id: int, offsets: Iterable[int]) -> None:
        """The node did not take these releases (refused or not delivered): send them again."""
        sending = self._sending.get(segment_id, set())
        for offset in offsets:
            if offset in sending:
                sending.discard(offset)
                self.queue(segment_id, offset)
        if not sending:
            self._sending.pop(segment_id, None)

    def claim(self, segment_id: int, offset: int) -> None:
        """An extent starting at `offset` was allocated again: a new block goes there, which
        its node will index under that offset, so nothing owed there may be sent any more (a
        release in flight names the old block, and the node's check leaves the new one)."""
        queued = self._queued.get(segment_id)
        if queued is not None:
            queued.discard(offset)
        if self.owed(segment_id, offset) is not None:
            self._end(segment_id, offset)

    def at_mount(self, segment_id: int) -> dict[int, BlockName]:
        """Everything owed in `segment_id`, which is being mounted again: the caller checks
        each against its inventory and `queue`s or `drop`s it.  Replies to releases sent to
        the earlier mount are ignored from now on."""
        self._queued.pop(segment_id, None)
        self._sending.pop(segment_id, None)
        return dict(self._owed.get(segment_id, {}))

    def drop(self, segment_id: int, offset: int) -> None:
        """Nothing is owed at `offset` any more: its node does not hold that block there."""
        queued = self._queued.get(segment_id)
        if queued is not None:
            queued.discard(offset)
        if self.owed(segment_id, offset) is not None:
            self._end(segment_id, offset)

    def _end(self, segment_id: int, offset: int) -> None:
        owed = self._owed[segment_id]
        del owed[offset]
        if not owed:
            del self._owed[segment_id]
        self._dirty[segment_id, offset] = None

    # ---- persistence (persistence.py `r/` records) ----------------------------------------

    def take_dirty(self) -> list[ReleaseRecord]:
        """The changes to persist since the last call (drained)."""
        out = [(segment_id, offset, name) for (segment_id, offset), name in self._dirty.items()]
        self._dirty.clear()
        return out

    def mark_dirty(self, records: Iterable[ReleaseRecord]) -> None:
        """Persist these again, as they are now (after a failed write)."""
        for segment_id, offset, _ in records:
            self._dirty[segment_id, offset] = self.owed(segment_id, offset)

    def restore(self, records: Iterable[tuple[int, int, BlockName]]) -> int:
        """Load the owed releases stored by an earlier run (at start-up, before any mount)."""
        count = 0
        for segment_id, offset, name in records:
            self._owed.setdefault(segment_id, {})[offset] = name
            count += 1
        return count
