"""Reads in the object table: lookups, read leases and access statistics.

read / get_replicas grant a read lease: until it expires, the object's extents are not freed,
evicted or reused, even if the object is removed meanwhile (the free is deferred).  A read
counts an access (eviction policy, hot and slow keys); `exists` and `prefix_match` are probes
that grant no lease and count nothing.

`ObjectReads` is a base of `ObjectTable` (object_table.py) on top of `PutLifecycle`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import NamedTuple

from mooncake_store.common.errors import (
    IdentityMismatchError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.master.columns import COMPLETE, MAX_U32, NO_SEGMENT
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.puts import PutLifecycle
from mooncake_store.master.segments import Segment

log = logging.getLogger("mooncake.master")


class ReadResult(NamedTuple):
    """What a read needs of an object: its fields the reply carries and its live replicas."""

    size_bytes: int
    checksum: int
    lease_until_s: float
    tag: bytes
    parent_key: str
    live: list[tuple[Segment, Replica]]
    generation: int  # the put that stored it (its READ grants name it; 0: restored/adopted)


class ObjectReads(PutLifecycle):
    """Reads and read leases (see the module docstring)."""

    # The object table's state these rules use (set by ObjectTable.__init__).
    _lease_ttl_s: float
    _hot_window_s: float
    _hot_reads: int
    slow_keys: set[str]  # read from a persistent tier only: promotion candidates
    read_keys: set[str]  # read since the last plan: GPU promotion candidates
    hot_keys: set[str]  # read hot_reads times within a window

    def read(self, key: str, fingerprint: bytes = b"") -> ReadResult:
        """Return what a reader needs of the object, granting a read lease on its replicas.

        Raises:
            ObjectNotFoundError: no committed object under `key`.
            IdentityMismatchError: `fingerprint` is given and differs from the stored one.
            ReplicaUnavailableError: the object's nodes are not mounted (yet).
        """
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != COMPLETE:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if fingerprint and self._fingerprint[slot] != fingerprint:
            stored = self._fingerprint[slot].hex() or "none"
            raise IdentityMismatchError(
                f"{key!r} was stored under another identity (fingerprint {stored}, this read "
                f"presents {fingerprint.hex()}): a different model, dtype, layout or TP rank; "
                "it is not served"
            )
        segment_id = self._segment[slot]
        if segment_id != NO_SEGMENT:  # almost every block: one replica, no comprehension
            seg = self._offered.get(segment_id)
            live = [(seg, Replica(segment_id, self._offset[slot]))] if seg is not None else []
            slow = seg is not None and seg.persistent
        else:
            live = [(s, r) for r in self._more[slot] if (s := self._offered.get(r.segment_id))]
            slow = all(s.persistent for s, _ in live)
        if not live:
            raise ReplicaUnavailableError(
                f"{key!r} is committed but none of its nodes is mounted and answering "
                "heartbeats; retry shortly"
            )
        now = self._clock()
        leases = self._lease
        lease = now + self._lease_ttl_s
        if lease > leases[slot]:
            leases[slot] = lease
        else:
            lease = leases[slot]
        reads = self._reads[slot]
        if reads < MAX_U32:
            self._reads[slot] = reads + 1
        self._last_read[slot] = now
        window_reads = self._window_reads[slot] + 1
        if now - self._window_start[slot] > self._hot_window_s:
            self._window_start[slot], window_reads = now, 1
        self._window_reads[slot] = min(window_reads, MAX_U32)
        if self._hot_reads and window_reads >= self._hot_reads:
            self.hot_keys.add(key)
        if slow:  # served only from a persistent tier
            self._cold_set(slot, "slow_reads", self._cold_get(slot, "slow_reads") + 1)
            self.slow_keys.add(key)
        self.policy.access(slot)
        self.read_keys.add(key)
        self.counters["gets"] += 1
        cold = self._cold.get(slot)
        tag = b"" if cold is None else cold.tag
        return ReadResult(
            self._size[slot], self._checksum[slot], lease, tag, self._parent[slot], live,
            self._gen[slot],
        )  # fmt: skip

    def get_replicas(
        self, key: str, fingerprint: bytes = b""
    ) -> tuple[ObjectMeta, list[tuple[Segment, Replica]]]:
        """`read`, returning a snapshot of the object (after the read) with the replicas."""
        result = self.read(key, fingerprint)
        return self._snapshot(self._slot[key]), result.live

    def exists(self, key: str) -> bool:
        """True when `key` is committed and readable.  Does not count as an access."""
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != COMPLETE:
            return False
        segment_id = self._segment[slot]
        if segment_id != NO_SEGMENT:
            return segment_id in self._offered
        return any(r.segment_id in self._offered for r in self._more[slot])

    def prefix_match(self, keys: Iterable[str], fingerprint: bytes = b"") -> int:
        """How many leading `keys` are readable (and of `fingerprint`, when given).

        A probe like `exists`: it grants no lease and counts no access.
        """
        matched = 0
        for key in keys:
            if not self.exists(key):
                break
            if fingerprint and self._fingerprint[self._slot[key]] != fingerprint:
                break
            matched += 1
        return matched

    def get(self, key: str) -> ObjectMeta | None:
        """A snapshot of the object under `key` (any state), or None."""
        slot = self._slot.get(key)
        return None if slot is None else self._snapshot(slot)

    def leased(self, key: str) -> bool:
        """True while a read lease or a copy in flight protects `key`'s bytes (remove without
        force refuses it: ObjectHasLeaseError)."""
        slot = self._slot.get(key)
        if slot is None:
            return False
        return self._protected_until(slot) > self._clock() or bool(self._cold_get(slot, "moving"))
