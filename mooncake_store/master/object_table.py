"""The master's object table (pure core: no I/O, time from an injected clock).

It holds every object's metadata (size, checksum, replicas, state, lease, pin, access
statistics, identity) and the rules about objects.  Each rule lives in a module of its own,
a base of the table (from the bottom of the chain up):

- `columns.py`: the objects' fields, stored in columns (`ObjectColumns`);
- `reconcile.py`: matching a mounting persistent segment's inventory with the records;
- `membership.py`: nodes and their mounted segments (mounts, liveness, drops);
- `relocation.py`: moves and copies of replicas between segments and tiers;
- `frees.py`: giving extents back, deferred frees, frees held for a write fence or for a
  node's release, losing replicas and deleting objects (with `releases.py`, the releases
  owed to nodes for persistent blocks, and `detached.py`, the blocks of dropped ones);
- `victims.py`: which objects may be evicted, and evicting them to make room;
- `puts.py`: the put lifecycle (start, end, commit, revoke, pending share, owners);
- `reads.py`: reads, read leases, existence probes;
- this module: the table's state, removal and corrupt reports, the tick, persistence
  (`take_dirty`), restore and the invariants (`validate`).

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
adopted blocks, dead nodes, owed releases, detached blocks) accumulate and are drained with
`take_dirty()`.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field

from mooncake_store.common.clock import SIGNED_OFFSETS, OffsetLog
from mooncake_store.common.errors import ObjectBusyError, ObjectNotFoundError
from mooncake_store.master.columns import COMMITTING, COMPLETE, FREE, PROCESSING
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.detached import DetachedBlocks
from mooncake_store.master.eviction import EvictionPolicy, LruPolicy
from mooncake_store.master.fences import WriteFences
from mooncake_store.master.frees import FENCE_SLACK_S as FENCE_SLACK_S
from mooncake_store.master.membership import TickResult
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.puts import MAX_FINGERPRINT_BYTES as MAX_FINGERPRINT_BYTES
from mooncake_store.master.puts import MAX_TAG_BYTES as MAX_TAG_BYTES
from mooncake_store.master.puts import PutStartOutcome as PutStartOutcome
from mooncake_store.master.reads import ObjectReads
from mooncake_store.master.reads import ReadResult as ReadResult
from mooncake_store.master.releases import BlockName, OwedReleases, ReleaseRecord

log = logging.getLogger("mooncake.master")


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
class Dirty:
    """Mutations to persist: objects to (re)write, keys to delete, owed releases to record
    or end (releases.py), persistent segments to record (`Membership.persistent_ids`)."""

    puts: list[ObjectMeta] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    releases: list[ReleaseRecord] = field(default_factory=list)
    segments: list[int] = field(default_factory=list)  # persistent segments mounted first
    detached: list[ReleaseRecord] = field(default_factory=list)  # detached.py


class ObjectTable(ObjectReads):
    """Every object of the master and the rules about objects (see the module docstring for
    which base holds which rule); the objects' fields are stored in columns (`ObjectColumns`)."""

    def __init__(
        self,
        config: TableConfig,
        *,
        clock: Callable[[], float],
        policy: EvictionPolicy | None = None,
        first_generation: int = 1,
        fence_writes: bool = False,
        signed_offsets: OffsetLog = SIGNED_OFFSETS,
    ) -> None:
        """`first_generation`: of puts (named by their write grants); the daemon starts it at
        the wall clock in microseconds, past any earlier master's.  `fence_writes`: hold the
        frees of puts that end without a commit until their node fenced the put's write
        grants (fences.py); the daemon always does, a table with no nodes to fence (a unit
        test of other rules, a tool) frees at once.  `signed_offsets`: the master's clock, with
        the offsets grant expiries were signed and its time published with (common/clock.py),
        which a held free past its grant's expiry still waits on while a node may hold a
        reading behind them."""
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
        self._signed_offsets = signed_offsets
        self._lease_keys: set[str] = set()  # pending puts that are allocation leases (leases.py)
        self._leases_refused_until = 0.0  # a put needed their room: none granted until then
        self._fingerprints: dict[bytes, bytes] = {}
        # (free at, segment generation, segment, offset, size): frees that wait for a lease
        self._deferred: list[tuple[float, int, int, int, int]] = []
        self._dirty: dict[str, bool] = {}  # key -> True: write it, False: delete it
        self.releases = OwedReleases()  # persistent-tier blocks their nodes must forget
        self.detached = DetachedBlocks()  # blocks of dropped persistent segments, by key
        self.slow_keys: set[str] = set()  # read from a persistent tier only: promotion candidates
        self.read_keys: set[str] = set()  # read since the last plan: GPU promotion candidates
        self.under_replicated: Candidates = Candidates()  # lost a replica: repair candidates
        self.hot_keys: set[str] = set()  # read hot_reads times within a window
        #: Nodes being drained (drain.py): no new put is placed on them.
        self.draining: Collection[str] = ()
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "puts_started", "puts_committed", "puts_deduplicated", "puts_revoked",
                "puts_reclaimed", "puts_superseded", "gets", "removes", "nodes_expired",
                "nodes_suspected", "replicas_dropped",
                "evictions", "objects_adopted", "stale_frees", "put_ends_repeated",
                "objects_corrupt", "replicas_corrupt", "corrupt_reports_refuted", "objects_lost",
                "leases_refused_mounting", "leased_puts_short_refused", "puts_waited_for_mounting",
            ),
            0,
        )  # fmt: skip

    # ---- put generations ---------------------------------------------------------------------

    @property
    def next_generation(self) -> int:
        """The generation the next put (or lease) is named by."""
        return self._next_generation

    def generations_from(self, generation: int) -> None:
        """Name later puts from `generation` on (never back): a node mounting reported an
        earlier master run's generations up there (generations.py `past_earlier_run`)."""
        self._next_generation = max(self._next_generation, generation)

    # ---- removal and corrupt reports --------------------------------------------------------

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

    def releases_of(self, meta: ObjectMeta) -> list[ReleaseRecord]:
        """The releases removing the object `meta` makes owed (its replicas in persistent
        segments, or in segments not mounted since a restart, its copies on their way into
        persistent segments and its blocks in dropped ones): the service persists them with the
        delete, so no later mount adopts the removed blocks back."""
        name = BlockName(meta.key, meta.checksum)
        out: list[ReleaseRecord] = [
            (r.segment_id, r.offset, name) for r in meta.replicas
            if (seg := self._segments.get(r.segment_id)) is None or seg.persistent
        ]  # fmt: skip
        out += self.detached.of_key(meta.key)
        return out

    def mark_dirty(self, keys: Iterable[str]) -> None:
        """Persist these keys' current state again (after a failed metadata write)."""
        for key in keys:
            self._dirty[key] = key in self._slot

    def removed_meanwhile(self, key: str, owed: Iterable[ReleaseRecord] = ()) -> None:
        """A remove of `key` was persisted with the releases `owed`, but the object changed
        meanwhile (lost with its node, adopted back from an inventory, put again): every block
        the remove named goes all the same, so the acknowledged remove holds when its node
        comes back.  A key put again keeps its own blocks."""
        if key not in self._slot:
            self._owe_elsewhere(key)
        for segment_id, offset, name in owed:
            if name is None or name.key != key:
                continue
            if self.detached.named(segment_id, offset) == name:
                self.detached.discard(segment_id, offset)
                self.releases.owe(segment_id, offset, name)
            slot = self._slot.get(key)
            replica = Replica(segment_id, offset)
            if (
                slot is not None and self._state[slot] == COMPLETE
                and self._checksum[slot] == name.checksum and replica in self._replicas(slot)
            ):  # fmt: skip
                self._lose_replica(slot, replica)  # adopted back while the delete was written

    def restore_persistent(self, segment_ids: set[int]) -> None:
        """Load the persistent segments ever mounted (at start-up).  A data directory written
        before they were recorded names none: the segments owed releases stand in."""
        self.persistent_ids = set(segment_ids)
        if not segment_ids:  # recorded as such, so that the next run knows them too
            self.persistent_ids = set(self.releases.segments())
            self.new_persistent += sorted(self.persistent_ids)

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
                self._reclaim(self._slot[key])
                result.reclaimed_puts.append(key)
        # A node offered to puts took a reply with the master's time within a heartbeat TTL.
        behind = self._signed_offsets.behind(self.config.heartbeat_ttl_s + 1.0)
        for segment_id, held in self.fences.expired(now, behind):
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
        """Objects to (re)write, keys to delete and owed releases changed since the last call
        (drained)."""
        if not (self._dirty or self.releases.changed or self.detached.changed
                or self.new_persistent):  # fmt: skip
            return Dirty()  # the common case (every PutStart asks): nothing to build
        out = Dirty(
            releases=self.releases.take_dirty(), segments=self.new_persistent,
            detached=self.detached.take_dirty(),
        )  # fmt: skip
        self.new_persistent = []
        for key, alive in self._dirty.items():
            slot = self._slot.get(key)
            if slot is None:
                out.deletes.append(key)
            elif alive and self._state[slot] == COMPLETE:
                out.puts.append(self._snapshot(slot))
        self._dirty.clear()
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
        leased: dict[int, list[int]] = {}  # segment -> [unused leases, their bytes]
        assert self._lease_keys <= self._pending.keys(), "a lease that is not a pending put"
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
                    if key in self._lease_keys:
                        counts = leased.setdefault(r.segment_id, [0, 0])
                        counts[0] += 1
                        counts[1] += extent[1]
        assert sorted(self._free_slots) == [s for s, key in enumerate(self._key) if key is None], (
            "free slots out of step with the key column"
        )
        for slot in self._attempt:
            assert self._state[slot] in (PROCESSING, COMMITTING), "an attempt outlived its put"
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
            assert [seg.leases, seg.leased_bytes] == leased.get(seg.segment_id, [0, 0]), "leases"
            fenced = [(o, seg.allocator.aligned(n)) for o, n in self.fences.held_extents(seg)]
            owed = [(o, seg.allocator.aligned(n)) for o, n in self.releases.held(seg.segment_id)]
            seg.allocator.validate(
                extents
                + held.get(seg.segment_id, [])
                + moves.get(seg.segment_id, [])
                + fenced
                + owed
            )
            node = self._nodes[seg.node_id]
            assert node.info == seg.info.node
            assert (seg.segment_id in self._offered) != node.suspect, "offered iff not suspect"
        assert all(self._segments.get(i) is s for i, s in self._offered.items())
