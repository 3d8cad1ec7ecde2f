"""Speculative same-host reads: the copy out of a mapped pool runs while the master looks up.

A same-host `get_into` of 4 MiB is a master lookup (~200 us here) and a copy with its checksum
(~300 us); one after the other they cost ~1.6x a cold memcpy.  The client remembers where the
keys it put or read live (`LocationCache`: key -> segment, offset, put generation, size,
checksum of a same-host DRAM replica), and a read of keys it remembers copies from there into
the caller's buffer while the lookup is on its way (an `Overlapped` step, steps.py).

**The acceptance rule** (`accepted`).  The speculative bytes are returned only if the master's
reply for the key has the size and checksum of the cache entry, lists a replica at the entry's
(segment, offset) whose READ grant names the entry's put generation (nonzero), and the bytes
copied hash to that checksum.  Why that suffices: a generation is unique to one put in the
master's lifetime (each master starts past the last one's, objects restored or adopted have
none: 0), and an extent holds one put's object from its allocation to its free.  The entry was
learnt from that put (its WRITE grant) or a read of its object, so the extent was allocated to
it before the copy began; the reply shows it still there when the master answered; so through
the copy the extent held that object, whose bytes were complete before it was committed.  The
checksum of the bytes as they landed in the caller's buffer then checks them as every read
does (a same-host writer outside the grants, a torn copy; and the one case the generation
cannot rule out, a replica of the object moved away and copied back into the same extent
during the lookup, whose copy may have read another object's bytes meanwhile).  A removed
key (not found), a key put again (another generation, wherever it landed), an extent given to
another key (another generation, or not listed), an object moved (another extent) all miss.

A miss, or a copy that failed (`meanwhile` raised), falls through to the normal read with the
reply already in hand (no second lookup), and the entry is dropped (a local read learns it
again).  The caller's buffer may then hold other bytes until that read overwrites them; a read
that fails leaves its buffer's contents unspecified, as any failed read does.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mooncake_store.client.master_client import get_replica_list_call
from mooncake_store.client.steps import (
    Flow,
    LocalPools,
    Overlapped,
    copy_out_checksum,
    trim_parts,
)
from mooncake_store.client.types import ReplicaList, ReplicaLocation
from mooncake_store.common.errors import MooncakeError
from mooncake_store.common.grant import grant_generation

DEFAULT_CAPACITY = 65536  # entries (~200 bytes each with the key)


@dataclass(frozen=True, slots=True)
class CachedLocation:
    """Where a key's object was seen: a same-host DRAM replica and the put that stored it."""

    segment_id: int
    offset: int
    generation: int  # the put's (its WRITE grant, or a READ grant of its object); never 0
    size_bytes: int
    checksum: int


def location_of(loc: ReplicaLocation, size_bytes: int, checksum: int) -> CachedLocation | None:
    """The entry for `loc`, a DRAM replica whose grant names a put generation; else None."""
    generation = grant_generation(loc.grant)
    if loc.tier != "DRAM" or not generation:
        return None
    return CachedLocation(loc.segment_id, loc.offset, generation, size_bytes, checksum)


def accepted(entry: CachedLocation, info: ReplicaList, digest: int | None) -> bool:
    """The acceptance rule (module docstring): the reply `info` confirms `entry`, and the
    bytes copied from it hashed to `digest` (None: the copy failed)."""
    return (
        digest is not None
        and entry.generation != 0
        and digest == entry.checksum
        and info.size_bytes == entry.size_bytes
        and info.checksum == entry.checksum
        and any(
            loc.segment_id == entry.segment_id
            and loc.offset == entry.offset
            and grant_generation(loc.grant) == entry.generation
            for loc in info.replicas
        )
    )


class LocationCache:
    """Key -> CachedLocation, least recently used dropped past `capacity`; thread-safe (the
    sync Client's threads share one)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.capacity = capacity
        self._entries: OrderedDict[str, CachedLocation] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> CachedLocation | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, key: str, entry: CachedLocation) -> None:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            if len(self._entries) > self.capacity:
                self._entries.popitem(last=False)

    def drop(self, keys: Sequence[str]) -> None:
        with self._lock:
            for key in keys:
                self._entries.pop(key, None)


# One key of a speculative read: its entry, the pool bytes it names, the caller's parts.
_Planned = tuple[CachedLocation, memoryview, list[memoryview]]


class LocationMemory(LocalPools):
    """The location cache as the read and write flows fill it (a mixin of ClientFlows)."""

    _locations: LocationCache

    def _remember(self, key: str, loc: ReplicaLocation, size_bytes: int, checksum: int) -> bool:
        """Remember `loc` for `key` if it is a DRAM replica in a pool mapped here and its
        grant names a put generation; True when remembered."""
        entry = location_of(loc, size_bytes, checksum)
        if entry is None or self._mapped(loc) is None:
            return False
        self._locations.put(key, entry)
        return True


class SpeculativeReads(LocationMemory):
    """The speculative read (module docstring); a base of ReadFlows (reads.py)."""

    counters: dict[str, int]

    if TYPE_CHECKING:  # ReadFlows' (reads.py)

        def _checked(
            self, keys: Sequence[str], results: Sequence[ReplicaList | MooncakeError]
        ) -> list[ReplicaList]: ...

        def _read_all(
            self,
            keys: Sequence[str],
            infos: Sequence[ReplicaList],
            dests: Sequence[list[memoryview]],
            fingerprint: bytes = b"",
            *,
            outcomes: bool = False,
        ) -> Flow[list[MooncakeError | None]]: ...

    def _speculation(
        self, keys: Sequence[str], dests: Sequence[list[memoryview]]
    ) -> list[_Planned] | None:
        """What to copy for each key, or None unless every key is remembered in a pool mapped
        here and fits its buffer (then the read takes the plain path)."""
        if not self.local_shm:
            return None
        plan: list[_Planned] = []
        for key, parts in zip(keys, dests, strict=True):
            entry = self._locations.get(key)
            if entry is None:
                return None
            pool = self.shm.segment(entry.segment_id)
            if pool is None or sum(len(p) for p in parts) < entry.size_bytes:
                return None
            src = pool[entry.offset : entry.offset + entry.size_bytes]
            if len(src) != entry.size_bytes:
                return None
            plan.append((entry, src, [p for p in trim_parts(parts, entry.size_bytes) if len(p)]))
        return plan

    @staticmethod
    def _copy_planned(plan: Sequence[_Planned]) -> list[int | None]:
        """Copy each planned object into its parts; the checksum of each as it landed (None:
        its copy failed)."""
        digests: list[int | None] = []
        for _, src, dest in plan:
            try:
                digests.append(copy_out_checksum(src, dest))
            except Exception:
                digests.append(None)
        return digests

    def _speculate(
        self, keys: Sequence[str], plan: list[_Planned], fingerprint: bytes
    ) -> Flow[tuple[list[ReplicaList | MooncakeError], set[int]]]:
        """The lookup of `keys` with the planned copies run while it is on its way: the
        replies, and the indices of the keys whose copy the acceptance rule kept (their
        buffers hold their bytes).  The others are to be read the normal way, from the
        replies in hand."""
        results, copied = yield Overlapped(
            get_replica_list_call(keys, fingerprint), lambda: self._copy_planned(plan)
        )
        digests = copied if isinstance(copied, list) else [None] * len(keys)
        hits: set[int] = set()
        for n, (result, (entry, _, _), digest) in enumerate(zip(results, plan, digests,
                                                                 strict=True)):  # fmt: skip
            if not isinstance(result, MooncakeError) and accepted(entry, result, digest):
                hits.add(n)
        counters = self.counters
        counters["speculative_reads"] += len(hits)
        counters["shm_reads"] += len(hits)
        counters["dram_reads"] = counters.get("dram_reads", 0) + len(hits)
        if len(hits) < len(keys):
            counters["speculative_misses"] += len(keys) - len(hits)
            # Forgotten; a local read of the key learns it again.
            self._locations.drop([k for n, k in enumerate(keys) if n not in hits])
        return results, hits

    def _read_speculative(
        self,
        keys: Sequence[str],
        dests: Sequence[list[memoryview]],
        plan: list[_Planned],
        fingerprint: bytes = b"",
    ) -> Flow[list[ReplicaList]]:
        """`_speculate`, then the keys it did not keep read the normal way; raises the first
        failure as a plain read would."""
        results, hits = yield from self._speculate(keys, plan, fingerprint)
        infos = self._checked(keys, results)
        rest = [n for n in range(len(keys)) if n not in hits]
        if rest:
            yield from self._read_all([keys[n] for n in rest], [infos[n] for n in rest],
                                      [dests[n] for n in rest], fingerprint)  # fmt: skip
        return infos
