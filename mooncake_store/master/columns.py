"""The object table's storage: every object's fields in flat columns indexed by a slot.

A big master holds ~10M blocks, and a Python object costs ~50-150 bytes before its fields
(each float or large int is an object of its own, too).  So an object is a slot number
(`_slot[key]`), and its fields live in `array` columns indexed by it: ~100 bytes a block
instead of ~500.  Fields that almost every block leaves at their defaults (tag, pin, a move in
progress, ...) live in a `ColdFields` sidecar made on demand, and an object with other than one
replica keeps its replicas in `_more`.  Callers outside the table get `ObjectMeta` snapshots;
they never hold a slot.  `ObjectColumns` is the storage only; `ObjectTable` (its subclass)
holds the rules.
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from mooncake_store.master.objects import (
    COLD_DEFAULTS,
    ColdFields,
    ObjectMeta,
    ObjectState,
    Replica,
)

NO_SEGMENT = 0  # segment ids are never 0 (SegmentInfo refuses it)
FREE, PROCESSING, COMMITTING, COMPLETE = 0, 1, 2, 3
STATE_OF = (None, ObjectState.PROCESSING, ObjectState.COMMITTING, ObjectState.COMPLETE)
MAX_U32 = 0xFFFFFFFF


class ObjectColumns:
    """Slots and the columns of their fields (see the module docstring)."""

    def __init__(self) -> None:
        # One slot per object; a freed slot is reused.
        self._slot: dict[str, int] = {}
        self._free_slots: list[int] = []
        self._key: list[str | None] = []
        self._state = array("B")
        self._size = array("Q")
        self._checksum = array("Q")
        self._created = array("d")
        self._lease = array("d")
        self._reads = array("I")  # access_count (saturates)
        self._last_read = array("d")
        self._window_start = array("d")  # hot-block detection: reads since then
        self._window_reads = array("I")
        self._wanted = array("B")  # replicas the put asked for: re-replication restores it
        self._segment = array("Q")  # the one replica's segment; NO_SEGMENT: see _more
        self._offset = array("Q")
        self._gen = array("Q")  # the put's generation (its write grants'; 0: restored/adopted)
        self._fingerprint: list[bytes] = []  # interned: a cluster has a handful
        self._parent: list[str] = []  # the parent's own key string when it is stored
        self._more: dict[int, tuple[Replica, ...]] = {}  # slot -> replicas, when not one
        self._cold: dict[int, ColdFields] = {}
        self._attempt: dict[int, tuple[int, int]] = {}  # pending put's slot -> (attempt, retry)
        self._numeric = (
            self._state, self._size, self._checksum, self._created, self._lease, self._reads,
            self._last_read, self._window_start, self._window_reads, self._wanted,
            self._segment, self._offset, self._gen,
        )  # fmt: skip

    def _new_slot(
        self,
        key: str,
        size_bytes: int,
        state: int,
        replicas: tuple[Replica, ...],
        *,
        checksum: int = 0,
        created_s: float = 0.0,
        fingerprint: bytes = b"",
        parent_key: str = "",
        wanted_replicas: int = 1,
        generation: int = 0,
    ) -> int:
        if self._free_slots:
            slot = self._free_slots.pop()
        else:  # a new slot at the end of every column, filled in below
            slot = len(self._key)
            self._key.append(None)
            self._fingerprint.append(b"")
            self._parent.append("")
            for column in self._numeric:
                column.append(0)
        self._key[slot] = key
        self._state[slot] = state
        self._size[slot] = size_bytes
        self._checksum[slot] = checksum
        self._created[slot] = created_s
        self._lease[slot] = 0.0
        self._reads[slot] = 0
        self._last_read[slot] = 0.0
        self._window_start[slot] = 0.0
        self._window_reads[slot] = 0
        self._wanted[slot] = min(wanted_replicas, 255)
        self._gen[slot] = generation
        self._fingerprint[slot] = fingerprint
        self._parent[slot] = parent_key
        self._slot[key] = slot
        self._set_replicas(slot, replicas)
        return slot

    def _release_slot(self, slot: int) -> None:
        """Forget the object in `slot` (its extents and policy entries are already gone)."""
        key = self._key[slot]
        assert key is not None
        del self._slot[key]
        self._key[slot] = None
        self._state[slot] = FREE
        self._segment[slot] = NO_SEGMENT
        self._fingerprint[slot] = b""
        self._parent[slot] = ""
        self._more.pop(slot, None)
        self._cold.pop(slot, None)
        self._attempt.pop(slot, None)
        self._free_slots.append(slot)

    def _replicas(self, slot: int) -> tuple[Replica, ...]:
        segment_id = self._segment[slot]
        if segment_id == NO_SEGMENT:
            return self._more.get(slot, ())
        return (Replica(segment_id, self._offset[slot]),)

    def _set_replicas(self, slot: int, replicas: tuple[Replica, ...]) -> None:
        if len(replicas) == 1:
            self._segment[slot] = replicas[0].segment_id
            self._offset[slot] = replicas[0].offset
            self._more.pop(slot, None)
        else:
            self._segment[slot] = NO_SEGMENT
            self._more[slot] = tuple(replicas)

    def _cold_get(self, slot: int, name: str) -> Any:
        cold = self._cold.get(slot)
        return COLD_DEFAULTS[name] if cold is None else getattr(cold, name)

    def _cold_set(self, slot: int, name: str, value: object) -> None:
        cold = self._cold.get(slot)
        if cold is None:
            if value == COLD_DEFAULTS[name]:
                return
            cold = self._cold[slot] = ColdFields()
        setattr(cold, name, value)

    def _protected_until(self, slot: int) -> float:
        cold = self._cold.get(slot)
        lease = self._lease[slot]
        return lease if cold is None else max(lease, cold.hold_until_s)

    def _snapshot(self, slot: int) -> ObjectMeta:
        key = self._key[slot]
        assert key is not None
        meta = ObjectMeta(
            key, self._size[slot], STATE_OF[self._state[slot]], self._replicas(slot),  # type: ignore[arg-type]
            checksum=self._checksum[slot], created_s=self._created[slot],
            lease_until_s=self._lease[slot], access_count=self._reads[slot],
            last_access_s=self._last_read[slot], fingerprint=self._fingerprint[slot],
            parent_key=self._parent[slot], wanted_replicas=self._wanted[slot],
            window_start_s=self._window_start[slot], window_reads=self._window_reads[slot],
        )  # fmt: skip
        cold = self._cold.get(slot)
        if cold is not None:
            for name in COLD_DEFAULTS:
                if name != "wanted_replicas":
                    setattr(meta, name, getattr(cold, name))
        return meta

    def _slots_in(self, segment_id: int) -> list[int]:
        """Every slot with a replica in `segment_id` (one pass over the column)."""
        found: list[int] = []
        if len(self._segment):
            column = np.frombuffer(self._segment, dtype=np.uint64)
            found = np.flatnonzero(column == np.uint64(segment_id)).tolist()
            del column  # release the buffer: the array may grow again
        found += [
            slot
            for slot, replicas in self._more.items()
            if any(r.segment_id == segment_id for r in replicas)
        ]
        return found

    def scan_keys(
        self, start: int, limit: int, prefix: str = "", budget: int = 65536
    ) -> tuple[list[tuple[str, int, int]], int]:
        """Committed keys from slot `start` on: up to `limit` (key, size, replicas) rows, looking
        at no more than `budget` slots, and the slot to continue from (-1: the end).  Bounded,
        so a listing of millions of keys never holds the master's loop for long."""
        rows: list[tuple[str, int, int]] = []
        end = min(len(self._key), start + budget)
        slot = start
        while slot < end and len(rows) < limit:
            key = self._key[slot]
            if key is not None and self._state[slot] == COMPLETE and key.startswith(prefix):
                rows.append((key, self._size[slot], len(self._replicas(slot))))
            slot += 1
        return rows, (slot if slot < len(self._key) else -1)

    def keys_in(self, segment_id: int) -> list[str]:
        """The keys of every object with a replica in `segment_id`."""
        return [k for slot in self._slots_in(segment_id) if (k := self._key[slot]) is not None]

    def _states(self) -> np.ndarray:
        return np.frombuffer(self._state, dtype=np.uint8) if len(self._state) else np.zeros(0)

    def object_count(self) -> int:
        return int(np.count_nonzero(self._states() == COMPLETE))

    def pending_count(self) -> int:
        return len(self._slot) - self.object_count()

    def bytes_stored(self) -> int:
        if not len(self._size):
            return 0
        sizes = np.frombuffer(self._size, dtype=np.uint64)
        return int(sizes[self._states() == COMPLETE].sum())
