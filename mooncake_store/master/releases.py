"""Owed releases: persistent-tier blocks the master let go of, until their node forgets them
(pure core: no I/O, no clock).

A node indexes the blocks of its persistent (NVMe) tier and reports them when it mounts, and
the master adopts those it does not know (that is how a master that lost its RocksDB gets them
back).  So a block the master removed, evicted or moved away must leave the node's index too, or
it comes back at the node's next mount: the master owes that node a `Release`.  A release names
the block (offset, key and checksum), and a node forgets the entry at that offset only while it
still holds that block there.

The rules, all here:

- A release is *owed* from the moment the block leaves the master's records (`owe`: its extent
  may still be held by a read lease, or its segment not mounted), and *queued* for sending once
  its extent would be free (`queue`).  The extent is not given back then: it stays *held*
  (allocated) until the node acknowledged the release, so no new block goes to that offset
  while the node may still index the old one there (a late release, or a failed Move into the
  offset, would otherwise meet the wrong block).
- `take` sends the queued ones of mounted segments; an offset already in flight waits for its
  reply, so one reply never answers for two sends.
- The node's reply ends the release it answers (`done`: its held extent is freed), unless what
  is owed there changed meanwhile; a refused or failed one is queued again (`again`).
- `claim`: an extent allocated at an owed offset that holds nothing (owed before the mount, see
  `at_mount`) ends what was owed there; a reply to a release sent before ends nothing.
- A segment mounted again (`at_mount`) gets back everything owed there, to check against its
  inventory (membership.py): a block it still reports is released again (its extent held in
  the new mount), the rest ended (`drop`).
- Durable before sent, and before the change that caused it is acknowledged: owed releases are
  stored in RocksDB (persistence.py `r/` records) in the same batch as the removal, eviction or
  move (`take_dirty`), so a master that restarts before the node took the release still
  releases the block at the next mount instead of adopting it.
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


class RecordChanges:
    """Changes to persist of records named by (segment, offset), each a BlockName or gone."""

    def __init__(self) -> None:
        self._dirty: dict[tuple[int, int], BlockName | None] = {}

    def _current(self, segment_id: int, offset: int) -> BlockName | None:
        raise NotImplementedError

    @property
    def changed(self) -> bool:
        """Whether there is anything to persist."""
        return bool(self._dirty)

    def take_dirty(self) -> list[ReleaseRecord]:
        """The changes to persist since the last call (drained)."""
        out = [(segment_id, offset, name) for (segment_id, offset), name in self._dirty.items()]
        self._dirty.clear()
        return out

    def mark_dirty(self, records: Iterable[ReleaseRecord]) -> None:
        """Persist these again, as they are now (after a failed write)."""
        for segment_id, offset, _ in records:
            self._dirty[segment_id, offset] = self._current(segment_id, offset)


class OwedReleases(RecordChanges):
    """Releases owed to nodes, per segment and offset (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self._owed: dict[int, dict[int, BlockName]] = {}
        self._held: dict[int, dict[int, int]] = {}  # offset -> bytes held in the current mount
        self._held_bytes: dict[int, int] = {}  # segment -> their sum
        self._queued: dict[int, set[int]] = {}
        # offset -> the name sent (None: what was owed there changed since: ends nothing)
        self._sending: dict[int, dict[int, BlockName | None]] = {}

    def __len__(self) -> int:
        return sum(len(owed) for owed in self._owed.values())

    def owed(self, segment_id: int, offset: int) -> BlockName | None:
        return self._owed.get(segment_id, {}).get(offset)

    _current = owed

    def held(self, segment_id: int) -> list[tuple[int, int]]:
        """(offset, bytes) of the extents of `segment_id`'s current mount held until their
        release is acknowledged."""
        return list(self._held.get(segment_id, {}).items())

    def held_bytes(self, segment_id: int) -> int:
        """The bytes `held` names: room that comes back once the node answers."""
        return self._held_bytes.get(segment_id, 0)

    def owe(self, segment_id: int, offset: int, name: BlockName) -> None:
        """The block `name` at `offset` left the master's records: its node must forget it."""
        owed = self._owed.setdefault(segment_id, {})
        if owed.get(offset) != name:
            if offset in owed:
                self._changed(segment_id, offset)
            owed[offset] = name
            self._dirty[segment_id, offset] = name

    def queue(
        self, segment_id: int, offset: int, name: BlockName | None = None, held_bytes: int = 0
    ) -> None:
        """Send the release of the block at `offset` (`name`: the block, when not owed already);
        `held_bytes`: its extent, allocated in the current mount, given back only when the
        release is acknowledged."""
        if name is not None:
            self.owe(segment_id, offset, name)
        if self.owed(segment_id, offset) is None:
            return
        self._queued.setdefault(segment_id, set()).add(offset)
        if held_bytes:
            held = self._held.setdefault(segment_id, {})
            total = self._held_bytes.get(segment_id, 0) - held.get(offset, 0) + held_bytes
            held[offset] = held_bytes
            self._held_bytes[segment_id] = total

    def take(self, mounted: Callable[[int], bool]) -> dict[int, list[tuple[int, BlockName]]]:
        """The queued releases to send now, per segment, marked in flight.  Those of a segment
        not mounted stay queued; an offset still in flight waits for its reply."""
        out: dict[int, list[tuple[int, BlockName]]] = {}
        for segment_id in list(self._queued):
            if not mounted(segment_id):
                continue
            owed = self._owed.get(segment_id, {})
            sending = self._sending.setdefault(segment_id, {})
            queued = {o for o in self._queued.pop(segment_id) if o in owed}
            waiting = {o for o in queued if o in sending}
            ready = sorted(queued - waiting)
            if ready:
                out[segment_id] = [(offset, owed[offset]) for offset in ready]
                sending.update(out[segment_id])
            if waiting:
                self._queued[segment_id] = waiting
            if not sending:
                del self._sending[segment_id]
        return out

    def done(self, segment_id: int, offsets: Iterable[int]) -> list[tuple[int, int]]:
        """The node took these releases: what they named is gone from its index.  Returns
        (offset, bytes) of the held extents to give back now."""
        freed: list[tuple[int, int]] = []
        sending = self._sending.get(segment_id, {})
        for offset in offsets:
            if offset not in sending:
                continue  # its segment mounted again since it was sent
            sent = sending.pop(offset)
            if (
                sent is not None
                and self.owed(segment_id, offset) == sent
                and offset not in self._queued.get(segment_id, ())  # not to send again
            ):
                held = self._end(segment_id, offset)
                if held:
                    freed.append((offset, held))
        if not sending:
            self._sending.pop(segment_id, None)
        return freed

    def again(self, segment_id: int, offsets: Iterable[int]) -> None:
        """The node did not take these releases (refused or not delivered): send them again."""
        sending = self._sending.get(segment_id, {})
        for offset in offsets:
            if offset in sending and sending.pop(offset) is not None:
                self.queue(segment_id, offset)
        if not sending:
            self._sending.pop(segment_id, None)

    def claim(self, segment_id: int, offset: int) -> None:
        """An extent starting at `offset` was allocated: a new block goes there, which its node
        will index under that offset.  A release owed there holds no extent in this mount (it
        would not have been allocated): it was owed before the mount, whose inventory did not
        list its block there (or the extent could not be held); it ends, and a release of it in
        flight ends nothing when it is answered."""
        queued = self._queued.get(segment_id)
        if queued is not None:
            queued.discard(offset)
        if self.owed(segment_id, offset) is not None:
            self._end(segment_id, offset)

    def at_mount(self, segment_id: int) -> dict[int, BlockName]:
        """Everything owed in `segment_id`, which is being mounted again: the caller checks
        each against its inventory and `queue`s or `drop`s it.  Extents held belonged to the
        earlier mount, and replies to releases sent to it are ignored from now on."""
        self._queued.pop(segment_id, None)
        self._sending.pop(segment_id, None)
        self._held.pop(segment_id, None)
        self._held_bytes.pop(segment_id, None)
        return dict(self._owed.get(segment_id, {}))

    def drop(self, segment_id: int, offset: int) -> None:
        """Nothing is owed at `offset` any more: its node does not hold that block there."""
        queued = self._queued.get(segment_id)
        if queued is not None:
            queued.discard(offset)
        if self.owed(segment_id, offset) is not None:
            self._end(segment_id, offset)

    def segments(self) -> list[int]:
        """The segments some release is owed to."""
        return list(self._owed)

    def forget_segment(self, segment_id: int) -> None:
        """End every release owed to `segment_id`: it is not a persistent segment that may
        mount again (a restarted node's DRAM segment, whose ids are never reused)."""
        for offset in self.at_mount(segment_id):
            self._end(segment_id, offset)

    def _changed(self, segment_id: int, offset: int) -> None:
        """What is owed at `offset` changed: a reply to a release sent before ends nothing."""
        sending = self._sending.get(segment_id)
        if sending is not None and offset in sending:
            sending[offset] = None

    def _end(self, segment_id: int, offset: int) -> int:
        """End what is owed at `offset`; return the bytes it held (0: none)."""
        owed = self._owed[segment_id]
        del owed[offset]
        if not owed:
            del self._owed[segment_id]
        self._changed(segment_id, offset)
        self._dirty[segment_id, offset] = None
        held = self._held.get(segment_id)
        if held is None or offset not in held:
            return 0
        size = held.pop(offset)
        self._held_bytes[segment_id] -= size
        if not held:
            del self._held[segment_id]
            del self._held_bytes[segment_id]
        return size

    # ---- persistence (persistence.py `r/` records) ----------------------------------------

    def restore(self, records: Iterable[tuple[int, int, BlockName]]) -> int:
        """Load the owed releases stored by an earlier run (at start-up, before any mount)."""
        count = 0
        for segment_id, offset, name in records:
            self._owed.setdefault(segment_id, {})[offset] = name
            count += 1
        return count
