"""The master's object table (pure core: no I/O, time from an injected clock).

It holds every object's metadata (size, checksum, replicas, state, lease, pin, access
statistics, identity) and the rules about objects.  The rules about nodes and their mounted
segments (mounts, reconciliation, liveness) live in `membership.py`, a base of the table.

- put_start -> PROCESSING (invisible) -> put_end -> COMMITTING (being made durable) ->
  commit_put_end -> COMPLETE (visible).  put_revoke, a failed commit, a put that outlives
  `put_timeout_s` (zombie), or the death of every replica's node, remove a pending put.
- read / get_replicas grant a read lease: until it expires, the object's extents are not freed,
  evicted or reused, even if the object is removed meanwhile (the free is deferred).
- New objects go to the fastest volatile tier (DRAM).  When no node has room, the eviction
  policy picks victims synchronously (never leased, pinned or pending objects), so a put fails
  with NoSpaceError only when nothing is evictable.  Tier movement (demotion, promotion) is
  planned by `tiering.py` on top of this table.
- Nodes, segments and what their loss costs: see `membership.py`.

Methods raise MooncakeError subclasses for per-key failures; the service turns them into
per-key statuses.  Mutations that must reach RocksDB outside the put path (evictions, moves,
adopted blocks, dead nodes) accumulate and are drained with `take_dirty()`.
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from mooncake_store.common.errors import (
    IdentityMismatchError,
    InvalidArgumentError,
    InvalidValueError,
    NoSpaceError,
    ObjectBusyError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.master.columns import (
    COMMITTING,
    COMPLETE,
    FREE,
    MAX_U32,
    NO_SEGMENT,
    PROCESSING,
)
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.eviction import LOST_PARENT, NO_PARENT, EvictionPolicy, LruPolicy
from mooncake_store.master.fences import HeldFree, WriteFences
from mooncake_store.master.leases import leases_pending
from mooncake_store.master.membership import TickResult
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.placement import choose_segments
from mooncake_store.master.relocation import ReplicaRelocation
from mooncake_store.master.segments import Segment, Tier

log = logging.getLogger("mooncake.master")

MAX_FINGERPRINT_BYTES = 64
FENCE_SLACK_S = 2.0  # past a write grant's expiry, a held free happens without a fence
MAX_TAG_BYTES = 256


# The table reads its settings from the master's one config object (master/config.py).
TableConfig = MasterConfig


class Candidates(set[str]):
    """A set of keys that also lists the keys added since the last `take_added`, so a planner
    schedules newcomers without rescanning every member each tick."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[str] = []

    def add(self, key: str) -> None:
        super().add(key)
        self.added.append(key)

    def take_added(self) -> list[str]:
        out, self.added = self.added, []
        return out


@dataclass(slots=True)
class PutStartOutcome:
    already_exists: bool
    placements: list[tuple[Segment, Replica]]
    deadline_s: float
    generation: int = 0  # the put's, named by its write grants


@dataclass(slots=True)
class Dirty:
    """Mutations to persist: objects to (re)write and keys to delete."""

    puts: list[ObjectMeta] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)


class ReadResult(NamedTuple):
    """What a read needs of an object: its fields the reply carries and its live replicas."""

    size_bytes: int
    checksum: int
    lease_until_s: float
    tag: bytes
    parent_key: str
    live: list[tuple[Segment, Replica]]


class ObjectTable(ReplicaRelocation):
    """Every object of the master and the rules about objects (see the module docstring); the
    rules about nodes and segments are in `Membership` (membership.py), moves and copies of
    replicas in `ReplicaRelocation` (relocation.py), the objects' fields are stored in columns
    (`ObjectColumns`)."""

    def __init__(
        self,
        config: TableConfig,
        *,
        clock: Callable[[], float],
        policy: EvictionPolicy | None = None,
        first_generation: int = 1,
        fence_writes: bool = False,
    ) -> None:
        """`first_generation`: of puts (named by their write grants); the daemon starts it at
        the wall clock in microseconds, past any earlier master's.  `fence_writes`: hold the
        frees of puts that end without a commit until their node fenced the put's write
        grants (fences.py); the daemon always does, a table with no nodes to fence (a unit
        test of other rules, a tool) frees at once."""
        self.config = config
        self.policy = policy or LruPolicy()
        self._lease_ttl_s = config.lease_ttl_s  # read on every lookup: no attribute chains
        self._hot_window_s = config.hot_window_s
        self._hot_reads = config.hot_reads
        super().__init__(
            clock=clock,
            heartbeat_ttl_s=config.heartbeat_ttl_s,
            suspect_grace_s=config.suspect_grace_s,
            restore_grace_s=config.restore_grace_s,
            alignment=config.alignment_bytes,
        )
        self._pending: dict[str, float] = {}  # PROCESSING key -> put deadline
        self._owner_of: dict[str, int] = {}  # PROCESSING key -> the connection that started it
        self._owned: dict[int, set[str]] = {}  # connection -> its PROCESSING keys
        self._next_generation = first_generation
        self._fence_writes = fence_writes
        self.fences = WriteFences()
        self._lease_keys: set[str] = set()  # pending puts that are allocation leases (leases.py)
        self._fingerprints: dict[bytes, bytes] = {}
        # (free at, segment generation, segment, offset, size): frees that wait for a lease
        self._deferred: list[tuple[float, int, int, int, int]] = []
        self._dirty: dict[str, bool] = {}  # key -> True: write it, False: delete it
        self._released: dict[int, list[int]] = {}  # persistent segment -> freed offsets
        self.slow_keys: set[str] = set()  # read from a persistent tier only: promotion candidates
        self.read_keys: set[str] = set()  # read since the last plan: GPU promotion candidates
        self.under_replicated: Candidates = Candidates()  # lost a replica: repair candidates
        self.hot_keys: set[str] = set()  # read hot_reads times within a window
        #: Nodes being drained (drain.py): no new put is placed on them.
        self.draining: Collection[str] = ()
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "puts_started", "puts_committed", "puts_deduplicated", "puts_revoked",
                "puts_reclaimed", "gets", "removes", "nodes_expired", "nodes_suspected",
                "replicas_dropped",
                "evictions", "objects_adopted", "stale_frees", "put_ends_repeated",
                "objects_corrupt", "replicas_corrupt", "corrupt_reports_refuted", "objects_lost",
            ),
            0,
        )  # fmt: skip

    # ---- the eviction policy's view ---------------------------------------------------------

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

    # ---- puts -------------------------------------------------------------------------------

    def put_start(
        self,
        key: str,
        size_bytes: int,
        replicas: int = 0,
        *,
        fingerprint: bytes = b"",
        parent_key: str = "",
        tag: bytes = b"",
        pin_ttl_s: float | None = None,
        owner: int = 0,
        soft_pin_ttl_s: float = 0.0,
        preferred_nodes: Sequence[str] = (),
    ) -> PutStartOutcome:
        """Allocate replicas of a new object on distinct nodes (best effort on the count).

        `fingerprint` names the writer's identity (reads presenting another are refused),
        `parent_key` the previous block of its prefix chain, `tag` small application metadata,
        `pin_ttl_s` protects it from eviction (0 or inf: until removed; None: not pinned);
        `soft_pin_ttl_s` (> 0) keeps it for that long unless nothing else can be evicted.
        `preferred_nodes` (node ids or data endpoints) receive the replicas when they have
        room.  `owner` names the client connection (0: none): `revoke_owner` ends its pending
        puts.  When no node has room, victims are evicted synchronously, for at most
        `max_pending_share` of a segment held by pending puts.

        Raises:
            InvalidKeyError / InvalidValueError / InvalidArgumentError: bad key, size or metadata.
            ObjectBusyError: a put of this key is in progress.
            IdentityMismatchError: the key is stored under another identity.
            NoSpaceError: no node has room and nothing can be evicted.
        """
        validate_key(key, stored=True)
        if parent_key:
            validate_key(parent_key, stored=True)
            parent = self._slot.get(parent_key)
            if parent is not None:
                parent_key = self._key[parent]  # type: ignore[assignment]  # shared: ~110 B a block
        if len(fingerprint) > MAX_FINGERPRINT_BYTES:
            raise InvalidArgumentError(
                f"fingerprint is {len(fingerprint)} bytes; the limit is {MAX_FINGERPRINT_BYTES}"
            )
        if fingerprint:
            fingerprint = self._intern_fingerprint(fingerprint)
        if len(tag) > MAX_TAG_BYTES:
            raise InvalidArgumentError(f"tag is {len(tag)} bytes; the limit is {MAX_TAG_BYTES}")
        if size_bytes <= 0:
            raise InvalidValueError(f"object size must be > 0 bytes, got {size_bytes}")
        if replicas < 0:
            raise InvalidValueError(f"replicas must be >= 1 (or 0 for the default), got {replicas}")
        now = self._clock()
        pin_until = 0.0 if pin_ttl_s is None else (
            math.inf if pin_ttl_s <= 0 or math.isinf(pin_ttl_s) else now + pin_ttl_s
        )  # fmt: skip
        slot = self._slot.get(key)
        if slot is not None:
            if self._state[slot] != COMPLETE:
                raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
            if any(r.segment_id in self._segments for r in self._replicas(slot)):
                stored = self._fingerprint[slot]
                if stored != fingerprint:
                    raise IdentityMismatchError(
                        f"{key!r} is already stored under another identity "
                        f"({stored.hex() or 'none'}, not {fingerprint.hex() or 'none'})"
                    )
                if pin_until > self._cold_get(slot, "pin_until_s"):
                    self._cold_set(slot, "pin_until_s", pin_until)
                    self._dirty[key] = True
                self.counters["puts_deduplicated"] += 1
                return PutStartOutcome(True, [], 0.0)
            # Restored after a master restart but none of its nodes is back: write it again
            # rather than report a put that nobody could read.
            self._delete(slot, 0.0)
        fast = [
            s for s in self._offered.values()
            if s.tier is Tier.DRAM and s.node_id not in self.draining
        ]  # fmt: skip
        if not fast:
            raise NoSpaceError(
                "no store node is mounted (or every one is draining to stop): "
                "start a mooncake-store node first"
            )
        largest = max(s.allocator.capacity_bytes for s in fast)
        if size_bytes > largest:
            raise InvalidValueError(
                f"object of {size_bytes} bytes is larger than any node's pool ({largest} bytes): "
                "split it into smaller blocks or start nodes with more --dram"
            )
        extent = fast[0].allocator.aligned(size_bytes)
        wanted = replicas or self.config.default_replicas
        share = self.config.max_pending_share
        preferred = {
            s.node_id for s in fast
            if s.node_id in preferred_nodes or s.info.node.endpoint in preferred_nodes
        } if preferred_nodes else set()  # fmt: skip
        # Free space is anyone's; only eviction of committed blocks is bounded: pending puts
        # may hold (and evict for) at most max_pending_share of a pool.
        chosen = choose_segments(fast, extent, wanted, preferred)
        if not chosen:
            open_ = [
                s for s in fast
                if not s.pending_bytes
                or s.pending_bytes + extent <= share * s.allocator.capacity_bytes
            ]  # fmt: skip
            if not open_:
                raise NoSpaceError(
                    f"puts started and not yet ended hold {share:.0%} of every node's pool (the "
                    f"master's max_pending_share), so no committed block is evicted for more: "
                    f"end or revoke them, or retry shortly"
                )
            chosen = self._evict_for(open_, extent)
        if not chosen:
            leased = sum(
                self._segments[sid].allocator.aligned(size)
                for _, _, sid, _, size in self._deferred
                if sid in self._segments
            )
            held = f"; {leased} bytes are freed when their read leases end" if leased else ""
            raise NoSpaceError(
                f"no store node has {extent} contiguous free bytes for {key!r} and nothing "
                f"can be evicted (every block is pinned, leased or being written; "
                f"{len(fast)} DRAM segments{held})"
            )
        placements = []
        for seg in chosen:
            offset = seg.allocator.allocate(size_bytes)
            assert offset is not None, "placement chose a segment without room"
            seg.objects += 1
            seg.pending_bytes += extent
            placements.append((seg, Replica(seg.segment_id, offset)))
        generation = self._next_generation
        self._next_generation += 1
        slot = self._new_slot(
            key, size_bytes, PROCESSING, tuple(r for _, r in placements), created_s=now,
            fingerprint=fingerprint, parent_key=parent_key, wanted_replicas=wanted,
            generation=generation,
        )  # fmt: skip
        self._cold_set(slot, "tag", tag)
        self._cold_set(slot, "pin_until_s", pin_until)
        if soft_pin_ttl_s > 0:
            self._cold_set(slot, "soft_pin_until_s", now + soft_pin_ttl_s)
        deadline = now + self.config.put_timeout_s
        self._pending[key] = deadline
        if owner:
            self._owner_of[key] = owner
            self._owned.setdefault(owner, set()).add(key)
        else:
            self._owner_of.pop(key, None)
        self.counters["puts_started"] += 1
        return PutStartOutcome(False, placements, deadline, generation)

    def _evict_for(self, candidates: list[Segment], extent: int) -> list[Segment]:
        """Evict from the segment with most free space until `extent` fits; [] if impossible."""
        for seg in sorted(candidates, key=lambda s: -s.free_bytes):
            if self.make_room(seg, extent):
                return [seg]
        return []

    def make_room(self, seg: Segment, extent: int) -> bool:
        """Evict victims from `seg` until an extent of `extent` bytes fits."""
        while seg.allocator.largest_free() < extent:
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

    def _intern_fingerprint(self, fingerprint: bytes) -> bytes:
        """One bytes object per engine identity, shared by all its blocks (a cluster has a
        handful of identities and millions of blocks)."""
        known = self._fingerprints.get(fingerprint)
        if known is not None:
            return known
        if len(self._fingerprints) < 4096:
            self._fingerprints[fingerprint] = fingerprint
        return fingerprint

    def put_end(self, key: str, checksum: int, failed_segments: Iterable[int] = ()) -> ObjectMeta:
        """Seal a pending put with its checksum, dropping replicas the client failed to write.

        The object moves to COMMITTING: still invisible, and no longer reclaimable as a
        zombie.  The caller persists the returned snapshot, then calls `commit_put_end` (or
        `put_revoke`).

        Raises:
            ObjectNotFoundError: no put of `key` is pending (revoked, timed out, never started).
            ReplicaUnavailableError: no replica survived; the put is revoked.
            InvalidValueError: the checksum is not a 64-bit unsigned value.
        """
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != PROCESSING:
            raise ObjectNotFoundError(
                f"no put of {key!r} is pending: it was revoked, timed out or never started"
            )
        if not 0 <= checksum <= 0xFFFFFFFFFFFFFFFF:
            raise InvalidValueError(f"checksum {checksum} is not a 64-bit unsigned value")
        failed = set(failed_segments)
        if failed:
            replicas = self._replicas(slot)
            self._unpend(slot, [r for r in replicas if r.segment_id in failed])
            self._set_replicas(slot, tuple(r for r in replicas if r.segment_id not in failed))
            self._free(slot, [r for r in replicas if r.segment_id in failed], 0.0)
        if not self._replicas(slot):
            self._delete(slot, 0.0)
            self.counters["puts_revoked"] += 1
            raise ReplicaUnavailableError(f"no replica of {key!r} was written; the put is revoked")
        self._checksum[slot] = checksum
        self._state[slot] = COMMITTING
        self._pending.pop(key, None)
        return self._snapshot(slot)

    def committed_as(self, key: str, checksum: int) -> tuple[int, int] | None:
        """(state, replica count) of `key` when its put was sealed with `checksum` (COMMITTING
        or COMPLETE), else None: a repeated PutEnd whose first reply was lost finds it here."""
        slot = self._slot.get(key)
        if slot is None or self._state[slot] == PROCESSING or self._checksum[slot] != checksum:
            return None
        return self._state[slot], len(self._replicas(slot))

    def puts_in_flight(self) -> int:
        """Puts started and not yet sealed (their PutEnd is still to come); unused allocation
        leases (leases.py) are not puts in flight."""
        return len(self._pending) - (leases_pending(self) if self._lease_keys else 0)

    def commit_put_end(self, key: str) -> int:
        """Make a COMMITTING object visible (after it is durable); return its replica count.

        Raises:
            ReplicaUnavailableError: every replica's node died while it was being persisted.
        """
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != COMMITTING:
            raise ReplicaUnavailableError(f"every replica of {key!r} was lost while committing")
        self._state[slot] = COMPLETE
        replicas = self._replicas(slot)
        self._unpend(slot, replicas)
        for r in replicas:
            self._cache(slot, r.segment_id)
        if len(replicas) < self._wanted[slot]:  # best effort now, more when nodes allow
            self.under_replicated.add(key)
        self.counters["puts_committed"] += 1
        return len(replicas)

    def put_revoke(self, key: str) -> None:
        """Abort a pending put and free its extents.

        Raises:
            ObjectNotFoundError: nothing pending under `key`.
            ObjectBusyError: the object is already committed (use remove).
        """
        slot = self._slot.get(key)
        if slot is None:
            raise ObjectNotFoundError(f"no put of {key!r} is pending")
        if self._state[slot] == COMPLETE:
            raise ObjectBusyError(f"{key!r} is already committed; remove it instead of revoking")
        self._delete(slot, 0.0)
        self.counters["puts_revoked"] += 1

    # ---- reads ------------------------------------------------------------------------------

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
            self._size[slot], self._checksum[slot], lease, tag, self._parent[slot], live
        )

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

    def check_removable(self, key: str) -> ObjectMeta:
        """What `remove` would delete (the service persists the delete first, then removes).

        Raises:
            ObjectNotFoundError / ObjectBusyError: as `remove`.
        """
        slot = self._slot.get(key)
        if slot is None:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if self._state[slot] != COMPLETE:
            raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
        return self._snapshot(slot)

    def same_object(self, meta: ObjectMeta) -> bool:
        """True while the object `meta` was taken from is stored (not one put again since)."""
        slot = self._slot.get(meta.key)
        return (
            slot is not None
            and self._state[slot] == COMPLETE
            and self._created[slot] == meta.created_s
            and self._checksum[slot] == meta.checksum
        )

    def drop_corrupt(self, meta: ObjectMeta, replicas: Iterable[Replica]) -> bool:
        """Drop `replicas` of the object `meta` was taken from, their nodes having found them
        failing its checksum (master/corruption.py), when it is still stored (not put again
        since).  Returns True when that deleted the object (no replica left)."""
        slot = self._slot.get(meta.key)
        if slot is None or not self.same_object(meta):
            return False
        for replica in replicas:
            if replica in self._replicas(slot):
                self.counters["replicas_corrupt"] += 1
                self._lose_replica(slot, replica)
            if self._slot.get(meta.key) != slot:
                self.counters["objects_corrupt"] += 1
                return True
        if len(self._replicas(slot)) < self._wanted[slot]:
            self.under_replicated.add(meta.key)
        return False

    def mark_dirty(self, keys: Iterable[str]) -> None:
        """Persist these keys' current state again (after a failed metadata write)."""
        for key in keys:
            self._dirty[key] = key in self._slot

    def leased(self, key: str) -> bool:
        """True while a read lease or a copy in flight protects `key`'s bytes (remove without
        force refuses it: ObjectHasLeaseError)."""
        slot = self._slot.get(key)
        if slot is None:
            return False
        return self._protected_until(slot) > self._clock() or bool(self._cold_get(slot, "moving"))

    def remove(self, key: str) -> None:
        """Delete a committed object (pinned or not).  Leased extents are freed later.

        Raises:
            ObjectNotFoundError: no committed object under `key`.
            ObjectBusyError: a put of `key` is in progress.
        """
        slot = self._slot.get(key)
        if slot is None:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if self._state[slot] != COMPLETE:
            raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
        self._delete(slot, self._protected_until(slot))
        self.counters["removes"] += 1

    # ---- time -------------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Expire dead nodes, reclaim zombie puts, run deferred frees, end restore grace."""
        now = self._clock()
        result = TickResult()
        self._expire(now, result)
        for key, deadline in list(self._pending.items()):
            if deadline <= now:
                self._delete(self._slot[key], 0.0)
                result.reclaimed_puts.append(key)
                self.counters["puts_reclaimed"] += 1
        for segment_id, held in self.fences.expired(now):
            self._release_held(segment_id, held, now)
        while self._deferred and self._deferred[0][0] <= now:
            _, generation, segment_id, offset, size_bytes = heapq.heappop(self._deferred)
            owner = self._segments.get(segment_id)
            if owner is not None and owner.generation == generation:
                self._free_extent(owner, offset, size_bytes)
            elif owner is not None:  # the segment was mounted again: that space is not ours
                self._stale("deferred free", owner, offset, size_bytes)
        for key in result.deleted_keys:
            self._dirty.pop(key, None)  # reported in the result, persisted by the caller
        return result

    def take_dirty(self) -> Dirty:
        """Objects to (re)write and keys to delete since the last call (drained)."""
        out = Dirty()
        for key, alive in self._dirty.items():
            slot = self._slot.get(key)
            if slot is None:
                out.deletes.append(key)
            elif alive and self._state[slot] == COMPLETE:
                out.puts.append(self._snapshot(slot))
        self._dirty.clear()
        return out

    def take_released(self) -> dict[int, list[int]]:
        """Persistent-tier extents freed since the last call, per segment (drained)."""
        out, self._released = self._released, {}
        return out

    # ---- restore and stats ------------------------------------------------------------------

    def restore(self, metas: Iterable[ObjectMeta]) -> int:
        """Load committed objects after a master restart; their segments must mount again."""
        count = 0
        restored: list[int] = []
        for meta in metas:
            old = self._slot.get(meta.key)
            if old is not None:
                self._release_slot(old)
            slot = self._new_slot(
                meta.key, meta.size_bytes, COMPLETE, meta.replicas, checksum=meta.checksum,
                created_s=meta.created_s, fingerprint=self._intern_fingerprint(meta.fingerprint),
                parent_key=meta.parent_key, wanted_replicas=meta.wanted_replicas,
            )  # fmt: skip
            self._cold_set(slot, "tag", meta.tag)
            self._cold_set(slot, "pin_until_s", meta.pin_until_s)
            for replica in meta.replicas:
                if replica.segment_id not in self._segments:
                    self._orphans.add(replica.segment_id)
            if len(meta.replicas) < meta.wanted_replicas:
                self.under_replicated.add(meta.key)
            if meta.parent_key:
                restored.append(slot)
            count += 1
        for slot in restored:  # share the parent's key string, as put_start does
            parent = self._slot.get(self._parent[slot])
            if parent is not None:
                self._parent[slot] = self._key[parent]  # type: ignore[assignment]
        return count

    def validate(self) -> None:
        """Check cross-structure invariants (used by tests)."""
        per_segment: dict[int, list[tuple[int, int]]] = {}  # extents held by replicas
        pending: dict[int, int] = {}  # bytes held by puts not committed yet
        for key, slot in self._slot.items():
            assert self._key[slot] == key
            replicas = self._replicas(slot)
            assert replicas, f"{key!r} has no replicas"
            assert (key in self._pending) == (self._state[slot] == PROCESSING)
            assert len({r.segment_id for r in replicas}) == len(replicas)
            assert (slot in self._more) == (len(replicas) != 1)
            for r in replicas:
                seg = self._segments.get(r.segment_id)
                if seg is None:
                    assert r.segment_id in self._orphans, f"{key!r}: lost replica"
                else:
                    extent = (r.offset, seg.allocator.aligned(self._size[slot]))
                    per_segment.setdefault(r.segment_id, []).append(extent)
                    if self._state[slot] != COMPLETE:
                        pending[r.segment_id] = pending.get(r.segment_id, 0) + extent[1]
        assert sorted(self._free_slots) == [s for s, key in enumerate(self._key) if key is None], (
            "free slots out of step with the key column"
        )
        for slot in self._free_slots:
            assert self._state[slot] == FREE and slot not in self._more
        moves = self._move_extents()
        held: dict[int, list[tuple[int, int]]] = {}  # extents freed when read leases end
        for _, generation, segment_id, offset, size_bytes in self._deferred:
            seg = self._segments.get(segment_id)
            if seg is not None and seg.generation == generation:
                held.setdefault(segment_id, []).append((offset, seg.allocator.aligned(size_bytes)))
        for seg in self._segments.values():
            extents = per_segment.get(seg.segment_id, [])
            assert seg.objects == len(extents), "segment object count"
            assert seg.pending_bytes == pending.get(seg.segment_id, 0), "pending bytes"
            fenced = [(o, seg.allocator.aligned(n)) for o, n in self.fences.held_extents(seg)]
            seg.allocator.validate(
                extents + held.get(seg.segment_id, []) + moves.get(seg.segment_id, []) + fenced
            )
            node = self._nodes[seg.node_id]
            assert node.info == seg.info.node
            assert (seg.segment_id in self._offered) != node.suspect, "offered iff not suspect"
        assert all(self._segments.get(i) is s for i, s in self._offered.items())

    # ---- internals --------------------------------------------------------------------------

    def _note_release(self, seg: Segment, offset: int) -> None:
        """Tell the node (persistent tiers only) to forget an extent the master does not use."""
        if seg.tier.persistent:
            self._released.setdefault(seg.segment_id, []).append(offset)

    def _free_extent(self, seg: Segment, offset: int, size_bytes: int) -> None:
        """Give an allocated extent back now and tell its node.

        A free the allocator refuses (the extent is not allocated as named: a double free or a
        wrong size) is a logged no-op, never a release of someone else's space nor a failure
        of the caller (the master's tick).
        """
        try:
            seg.allocator.free(offset, size_bytes)
        except KeyError:
            self._stale("free", seg, offset, size_bytes)
            return
        self._note_release(seg, offset)

    def _stale(self, what: str, seg: Segment, offset: int, size_bytes: int) -> None:
        self.counters["stale_frees"] += 1
        log.warning(
            "ignored a stale %s of %d bytes at offset %d of segment %x (generation %d): "
            "that allocation no longer exists", what, size_bytes, offset, seg.segment_id,
            seg.generation,
        )  # fmt: skip

    def _free(
        self, slot: int, replicas: Iterable[Replica], free_at_s: float, *, ghost: bool = False
    ) -> None:
        """Free replicas already taken out of the object in `slot`.  `ghost`: an eviction,
        which the policy remembers (a removed key leaves nothing behind)."""
        key = self._key[slot]
        assert key is not None
        now = self._clock()
        size_bytes = self._size[slot]
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is None:  # a restored replica whose segment is not back: nothing held
                continue
            seg.objects -= 1
            self.policy.discard(slot, r.segment_id, key if ghost else "")
            generation = self._gen[slot]
            if (
                generation
                and self._fence_writes
                and self._state[slot] != COMPLETE  # a put that ends without a commit
                and seg.tier is Tier.DRAM  # clients write only DRAM
                and not self.fences.ended(seg, generation)
            ):
                # A write of the put may still be on its way to the node (a client revokes a
                # put when a write failed or timed out): nobody else gets the extent until the
                # node has taken a fence that ends the put's grants.
                until = self._created[slot] + self.config.put_timeout_s + FENCE_SLACK_S
                self.fences.hold(seg, HeldFree(generation, seg.generation, r.offset,
                                               size_bytes, free_at_s, until))  # fmt: skip
            elif free_at_s > now:
                heapq.heappush(
                    self._deferred, (free_at_s, seg.generation, r.segment_id, r.offset, size_bytes)
                )
            else:
                self._free_extent(seg, r.offset, size_bytes)

    def _unpend(self, slot: int, replicas: Iterable[Replica]) -> None:
        """These replicas of a pending put no longer count against their segment's share;
        the put no longer belongs to a connection."""
        extent = 0
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is not None:
                extent = extent or seg.allocator.aligned(self._size[slot])
                seg.pending_bytes -= extent
        self.fences.dirty = True  # its write grants end: tell the nodes
        key = self._key[slot]
        owner = self._owner_of.pop(key, 0) if key is not None else 0
        if owner:
            keys = self._owned.get(owner)
            if keys is not None:
                keys.discard(key)  # type: ignore[arg-type]
                if not keys:
                    del self._owned[owner]

    def take_fences(self) -> list[tuple[Segment, int, frozenset[int]]]:
        """The write fence of every DRAM segment, when a put ended since the last call: (the
        segment, floor, open generations).  Send each to its node, then `fence_acked`."""
        if not self.fences.dirty:
            return []
        self.fences.dirty = False
        open_: dict[int, set[int]] = {}
        for key in self._pending:
            slot = self._slot[key]
            for r in self._replicas(slot):
                open_.setdefault(r.segment_id, set()).add(self._gen[slot])
        floor = self._next_generation
        return [
            (seg, floor, frozenset(open_.get(seg.segment_id, ())))
            for seg in self._segments.values()  # suspect nodes too: they may be writable
            if seg.tier is Tier.DRAM
        ]

    def fence_acked(self, seg: Segment, floor: int, open_: frozenset[int]) -> None:
        """`seg`'s node took this fence: the frees it held can happen now."""
        if self._segments.get(seg.segment_id) is not seg:
            return  # mounted again meanwhile: the new mount gets its own fence
        now = self._clock()
        for held in self.fences.acknowledged(seg, floor, open_):
            self._release_held(seg.segment_id, held, now)

    def fence_failed(self) -> None:
        """A fence did not reach its node: send them all again next time."""
        self.fences.dirty = True

    def _release_held(self, segment_id: int, held: HeldFree, now: float) -> None:
        seg = self._segments.get(segment_id)
        if seg is None or seg.generation != held.segment_generation:
            return  # that mount is gone, and its allocator with it
        if held.free_at_s > now:
            heapq.heappush(self._deferred, (held.free_at_s, seg.generation, segment_id,
                                            held.offset, held.size_bytes))  # fmt: skip
        else:
            self._free_extent(seg, held.offset, held.size_bytes)

    def revoke_owner(self, owner: int) -> list[str]:
        """Revoke the pending puts of a client connection that closed; return their keys.
        Puts it already ended (being committed) are left to finish."""
        revoked: list[str] = []
        for key in self._owned.pop(owner, ()):
            if self._owner_of.get(key) != owner:
                continue
            del self._owner_of[key]
            slot = self._slot.get(key)
            if slot is not None and self._state[slot] == PROCESSING:
                self._delete(slot, 0.0)
                self.counters["puts_revoked"] += 1
                revoked.append(key)
        return revoked

    def _lose_replica(self, slot: int, replica: Replica, *, ghost: bool = False) -> None:
        """Drop one replica of a committed object; delete the object if it was the last."""
        key = self._key[slot]
        assert key is not None
        replicas = tuple(r for r in self._replicas(slot) if r != replica)
        self._set_replicas(slot, replicas)
        self._free(slot, [replica], self._protected_until(slot), ghost=ghost)
        self.counters["replicas_dropped"] += 1
        if replicas:
            self._dirty[key] = True
        else:
            self._release_slot(slot)
            self._dirty[key] = False

    def _forget_replica(self, slot: int, replica: Replica) -> None:
        """Drop a restored replica its segment does not vouch for (it was never reserved)."""
        key = self._key[slot]
        assert key is not None
        replicas = tuple(r for r in self._replicas(slot) if r != replica)
        self._set_replicas(slot, replicas)
        self.counters["replicas_dropped"] += 1
        if replicas:
            self._dirty[key] = True
            if len(replicas) < self._wanted[slot]:
                self.under_replicated.add(key)
            return
        self._release_slot(slot)
        self._dirty[key] = False

    def _delete(self, slot: int, free_at_s: float) -> None:
        key = self._key[slot]
        assert key is not None
        if self._state[slot] != COMPLETE:
            self._unpend(slot, self._replicas(slot))
        self._free(slot, self._replicas(slot), free_at_s)
        self._release_slot(slot)
        self._pending.pop(key, None)
        self._dirty.pop(key, None)
