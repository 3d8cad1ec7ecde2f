"""Reconciliation of a persistent segment's inventory with the master's records, when it mounts.

A node reports the blocks of its persistent (NVMe) tier when it mounts.  Each is matched
against what the master knows (membership.py `mount` calls `_adopt`):

- a replica restored from RocksDB is kept where the inventory vouches for it (same key and
  checksum at its offset), else forgotten (it was never reserved);
- a block the master let go of and whose release its node has not taken yet (releases.py) is
  released again, not adopted: a removed key must not come back;
- a block nobody knew is adopted, as a new object or an extra replica of a known one; one that
  contradicts a known object (another checksum or size, a put in progress, a replica there
  already) is released.

`InventoryReconciliation` is the base of `Membership` (membership.py) on top of
`ObjectColumns`; it holds only these rules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.master.columns import COMPLETE, ObjectColumns
from mooncake_store.master.objects import Replica
from mooncake_store.master.releases import BlockName, OwedReleases
from mooncake_store.master.segments import Segment


class InventoryReconciliation(ObjectColumns):
    """Matching a mounting persistent segment's inventory (see the module docstring)."""

    # The object table's state these rules use (defined by ObjectTable and Membership).
    _clock: Callable[[], float]
    counters: dict[str, int]
    _dirty: dict[str, bool]
    releases: OwedReleases

    if TYPE_CHECKING:

        def _cache(self, slot: int, segment_id: int) -> None: ...
        def _note_release(
            self, seg: Segment, offset: int, name: BlockName | None = None, held_bytes: int = 0
        ) -> None: ...
        def _forget_replica(self, slot: int, replica: Replica) -> None: ...
        def _intern_fingerprint(self, fingerprint: bytes) -> bytes: ...

    def _adopt(
        self,
        seg: Segment,
        restored: list[int],
        inventory: Sequence[BlockRecord] | None,
        owed: dict[int, BlockName],
    ) -> None:
        """Take back the restored objects' replicas in `seg` (`restored`: their slots) that
        its inventory vouches for, and adopt the blocks it reports that nobody knew, but for
        those owed a release (`owed`: they left the master's records, and the node has not
        forgotten them yet): a removed key must not come back; they are released again.  An
        owed release the inventory no longer matches (the node does not hold that block there)
        ends; so does one where a restored object's record vouches for that very block (the
        record was written after the release was owed)."""
        reported = {item.offset: item for item in inventory or ()}
        restored_slots = set(restored) if owed else set()
        for offset, name in owed.items():
            item = reported.get(offset)
            matches = inventory is None or (
                item is not None and BlockName(item.key, item.checksum) == name
            )
            if not matches or self._restored_at(restored_slots, seg.segment_id, offset, name):
                self.releases.drop(seg.segment_id, offset)
                continue
            item = reported.pop(offset, None)
            self._release_reported(seg, offset, name, item)
        for slot in restored:
            key = self._key[slot]
            assert key is not None
            replica = next(
                (r for r in self._replicas(slot) if r.segment_id == seg.segment_id), None
            )
            if replica is None:
                continue
            item = reported.pop(replica.offset, None)
            trusted = inventory is None or (
                item is not None and item.key == key and item.checksum == self._checksum[slot]
            )
            if trusted and self._reserve(seg, replica.offset, self._size[slot]):
                seg.objects += 1
                self._cache(slot, seg.segment_id)
                continue
            if item is not None:  # something else lies there: adopt or release it below
                reported[item.offset] = item
            self._forget_replica(slot, replica)  # never reserved: nothing to free
        for item in reported.values():  # blocks the master did not know were there
            self._adopt_item(seg, item)

    def _adopt_item(self, seg: Segment, item: BlockRecord) -> None:
        slot = self._slot.get(item.key)
        if slot is not None and (
            self._state[slot] != COMPLETE
            or self._checksum[slot] != item.checksum
            or self._size[slot] != item.size_bytes
            or any(r.segment_id == seg.segment_id for r in self._replicas(slot))
        ):
            self._release_reported(seg, item.offset, BlockName(item.key, item.checksum), item)
            return
        if not self._reserve(seg, item.offset, item.size_bytes):
            return
        if slot is None:
            parent = self._slot.get(item.parent_key) if item.parent_key else None
            slot = self._new_slot(
                item.key, item.size_bytes, COMPLETE, (), checksum=item.checksum,
                created_s=self._clock(), fingerprint=self._intern_fingerprint(item.fingerprint),
                parent_key=item.parent_key if parent is None else self._key[parent],  # type: ignore[arg-type]
            )  # fmt: skip
            self._cold_set(slot, "tag", item.tag)
            self.counters["objects_adopted"] += 1
        self._set_replicas(slot, (*self._replicas(slot), Replica(seg.segment_id, item.offset)))
        seg.objects += 1
        self._cache(slot, seg.segment_id)
        self._dirty[item.key] = True

    def _release_reported(
        self, seg: Segment, offset: int, name: BlockName, item: BlockRecord | None
    ) -> None:
        """Release a block the inventory reports that the master does not keep, its extent held
        until the node took the release (no new block goes there meanwhile)."""
        held = 0
        if item is not None and self._reserve(seg, offset, item.size_bytes):
            held = seg.allocator.aligned(item.size_bytes)
        self._note_release(seg, offset, name, held)

    def _restored_at(
        self, restored: set[int], segment_id: int, offset: int, name: BlockName
    ) -> bool:
        """Whether a restored object's record names the block `name` at `offset`."""
        slot = self._slot.get(name.key)
        return (
            slot is not None
            and slot in restored
            and self._checksum[slot] == name.checksum
            and Replica(segment_id, offset) in self._replicas(slot)
        )

    def _reserve(self, seg: Segment, offset: int, size_bytes: int) -> bool:
        try:
            seg.allocator.reserve(offset, size_bytes)
            return True
        except ValueError:  # overlaps another extent or lies outside: cannot be trusted
            return False
