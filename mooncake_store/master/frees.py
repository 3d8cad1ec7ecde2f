"""Frees in the object table: giving a replica's extent back to its segment.

An extent is freed at once, later (`_deferred`: a read lease or a copy protects it until
then), or only once its node took a write fence that ends the put's write grants
(`fences.py`: the held frees of puts that end without a commit).  A free the allocator refuses
(a stale one: the mount is gone, or the extent is not allocated as named) is a logged no-op.
A persistent-tier block that leaves the master's records is owed a release to its node
(releases.py: recorded at once, sent once its extent is free, `take_released`).  Losing a
replica (eviction, a dropped segment) and deleting an object end here.

`ExtentFrees` is a base of `ObjectTable` (object_table.py) on top of `ReplicaRelocation`.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.detached import DetachedBlocks
from mooncake_store.master.fences import HeldFree, WriteFences
from mooncake_store.master.objects import Replica
from mooncake_store.master.releases import BlockName, OwedReleases
from mooncake_store.master.relocation import ReplicaRelocation
from mooncake_store.master.segments import Segment, Tier

log = logging.getLogger("mooncake.master")

FENCE_SLACK_S = 2.0  # past a write grant's expiry, a held free happens without a fence


class ExtentFrees(ReplicaRelocation):
    """Frees of extents, deferred and held ones, and losing replicas (see the module
    docstring)."""

    # The object table's state these rules use (set by ObjectTable.__init__).
    config: MasterConfig
    fences: WriteFences
    _fence_writes: bool
    _next_generation: int
    # (free at, segment generation, segment, offset, size): frees that wait for a lease
    _deferred: list[tuple[float, int, int, int, int]]
    releases: OwedReleases  # persistent-tier blocks their nodes must forget (releases.py)
    detached: DetachedBlocks  # blocks of dropped persistent segments (detached.py)

    if TYPE_CHECKING:  # provided by PutLifecycle (puts.py)

        def _unpend(self, slot: int, replicas: Iterable[Replica]) -> None: ...

    def _note_release(
        self, seg: Segment, offset: int, name: BlockName | None = None, held_bytes: int = 0
    ) -> None:
        """Tell the node (persistent tiers only) to forget the block at `offset` (`name`: the
        block, unless a release is owed there already), which the master does not use;
        `held_bytes`: its extent, given back once the node took the release (releases.py)."""
        if seg.persistent:
            self.releases.queue(seg.segment_id, offset, name, held_bytes)

    def _free_extent(
        self, seg: Segment, offset: int, size_bytes: int, name: BlockName | None = None
    ) -> None:
        """Give an allocated extent back now and tell its node (`name`: the block there, where
        no release is owed for it yet).  A persistent tier's extent is given back only once its
        node took the release (`release_done`): until then the node may still index the block
        there, and a new block at that offset would meet a late release.

        A free the allocator refuses (the extent is not allocated as named: a double free or a
        wrong size) is a logged no-op, never a release of someone else's space nor a failure
        of the caller (the master's tick).
        """
        if seg.persistent:
            if not seg.allocator.holds(offset, size_bytes):
                self._stale("free", seg, offset, size_bytes)
                return
            self._note_release(seg, offset, name, seg.allocator.aligned(size_bytes))
            return
        try:
            seg.allocator.free(offset, size_bytes)
        except KeyError:
            self._stale("free", seg, offset, size_bytes)

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
        name = BlockName(key, self._checksum[slot])
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is None:  # a restored replica whose segment is not back: nothing held, but
                self.releases.owe(r.segment_id, r.offset, name)  # its mount must not adopt it
                continue
            if seg.persistent:
                self.releases.owe(seg.segment_id, r.offset, name)  # sent once the extent is free
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
                # put when a write failed or timed out), or its grant never wrote and so is not
                # sealed (node/write_gate.py): nobody else gets the extent until the node has
                # taken a fence that ends the put's grants.  A committed put's bytes were
                # written, so sealed against its grant: freed as usual (fences.py).
                # Its grants were signed when its extents were allocated: at `created`, or, for
                # a lease (renamed since, leases.py), at most a put timeout before.
                created, timeout = self._created[slot], self.config.put_timeout_s
                until = created + timeout + FENCE_SLACK_S
                self.fences.hold(seg, HeldFree(generation, seg.generation, r.offset, size_bytes,
                                               free_at_s, until, created - timeout))  # fmt: skip
            elif free_at_s > now:
                heapq.heappush(
                    self._deferred, (free_at_s, seg.generation, r.segment_id, r.offset, size_bytes)
                )
            else:
                self._free_extent(seg, r.offset, size_bytes)

    def take_released(self) -> dict[int, list[tuple[int, BlockName]]]:
        """Releases to send now, per mounted segment (releases.py `take`): send each to its
        node, then `release_done` or `release_again`.  Those of a segment not mounted now wait
        for its next mount, whose inventory still lists them (`pending_releases`)."""
        return self.releases.take(lambda segment_id: self.mounted_segment(segment_id) is not None)  # type: ignore[attr-defined]

    def _answers_this_mount(self, segment_id: int, generation: int | None) -> bool:
        """Whether an answer to releases sent to the mount `generation` (None: not known) is
        for the segment's mount now; one for an earlier mount is ignored (that mount's
        releases were checked again against the new mount's inventory)."""
        seg = self._segments.get(segment_id)
        return generation is None or (seg is not None and seg.generation == generation)

    def release_done(
        self, segment_id: int, offsets: list[int], generation: int | None = None
    ) -> None:
        """The node took these releases (sent to the mount `generation`): the extents they
        held are free now."""
        if not self._answers_this_mount(segment_id, generation):
            return
        freed = self.releases.done(segment_id, offsets)
        seg = self._segments.get(segment_id)
        for offset, size_bytes in freed if seg is not None else ():
            try:
                seg.allocator.free(offset, size_bytes)  # type: ignore[union-attr]
            except KeyError:
                self._stale("held free", seg, offset, size_bytes)  # type: ignore[arg-type]

    def release_again(
        self, segment_id: int, offsets: list[int], generation: int | None = None
    ) -> None:
        """A release its node did not take (refused as another master run's while a mount reply
        is on its way or lost, or not delivered): sent again with the next ones, unless a Move
        down took the offset since (`claim_release`).  Dropped, a removed key would come back
        with the node's next inventory (membership.py adopts what a node holds)."""
        if self._answers_this_mount(segment_id, generation):
            self.releases.again(segment_id, offsets)

    def claim_release(self, segment_id: int, offset: int) -> None:
        """An extent starting at `offset` was allocated: a release owed there from before this
        mount ends (releases.py `claim`).  A release of an offset that a new extent only covers
        still goes: no block of the node starts there but the removed one."""
        self.releases.claim(segment_id, offset)

    def pending_releases(self, segment_id: int) -> dict[int, BlockName]:
        """The releases owed in `segment_id`, which is being mounted again (its node's
        inventory may still list those blocks): the caller queues or drops each
        (releases.py `at_mount`).  Frees deferred for a read lease are an earlier mount's,
        which would be skipped as stale: their releases are among those returned."""
        if any(d[2] == segment_id for d in self._deferred):
            self._deferred = [d for d in self._deferred if d[2] != segment_id]
            heapq.heapify(self._deferred)
        return self.releases.at_mount(segment_id)

    def releasing_bytes(self, seg: Segment) -> int:
        """Bytes of persistent `seg` held until its node answers their Release: free at the
        next tick, as far as making room goes (nothing more is evicted for them)."""
        return self.releases.held_bytes(seg.segment_id)

    def room_after_fence(self) -> int:
        """Bytes that the nodes' next write fence frees in the segments offered to puts (the
        extents of puts that ended without a commit, held until then)."""
        return sum(self.fences.held_bytes_in(segment_id) for segment_id in self._offered)

    def take_fences(self) -> list[tuple[Segment, int, frozenset[int]]]:
        """The write fence of every DRAM segment, when a put ended since the last call: (the
        segment, floor, open generations).  Send each to its node, then `fence_acked`."""
        if not self.fences.dirty:
            return []
        self.fences.dirty = False
        # suspect nodes too: they may be writable
        return self._fences_of([s for s in self._segments.values() if s.tier is Tier.DRAM])

    def first_fences(self, node_ids: Iterable[str]) -> list[tuple[Segment, int, frozenset[int]]]:
        """The write fence of each segment of `node_ids` awaiting its first one of this run
        (membership.py `awaiting_first_fence`), as `take_fences` makes them, for a push of its
        own: the node may take puts as soon as it is acknowledged."""
        wanted = set(node_ids)
        return self._fences_of([
            seg for segment_id in self._awaiting
            if (seg := self._segments.get(segment_id)) is not None and seg.node_id in wanted
        ])  # fmt: skip

    def mount_fences(self, segment_ids: Iterable[int]) -> list[tuple[int, int, frozenset[int]]]:
        """(segment id, floor, open generations): the fence a mount reply gives each mounted
        DRAM segment among `segment_ids`.  A fresh mount has no puts yet, so every grant issued
        before it is ended; a repeated mount of the same incarnation keeps its puts open."""
        segs = [
            seg for segment_id in segment_ids
            if (seg := self._segments.get(segment_id)) is not None and seg.tier is Tier.DRAM
        ]  # fmt: skip
        return [(seg.segment_id, floor, open_) for seg, floor, open_ in self._fences_of(segs)]

    def _fences_of(self, segs: list[Segment]) -> list[tuple[Segment, int, frozenset[int]]]:
        """The write fence of each of `segs` now: the next put generation as its floor, and
        the generations of the pending puts with a replica there open."""
        if not segs:
            return []
        open_ = self._open_generations()
        floor = self._next_generation
        return [(seg, floor, frozenset(open_.get(seg.segment_id, ()))) for seg in segs]

    def _open_generations(self) -> dict[int, set[int]]:
        """Segment id -> generations of the pending puts with a replica there."""
        open_: dict[int, set[int]] = {}
        for key in self._pending:
            slot = self._slot[key]
            for r in self._replicas(slot):
                open_.setdefault(r.segment_id, set()).add(self._gen[slot])
        return open_

    def fence_acked(self, seg: Segment, floor: int, open_: frozenset[int]) -> None:
        """`seg`'s node took this fence: the frees it held can happen now."""
        if self._segments.get(seg.segment_id) is not seg:
            return  # mounted again meanwhile: the new mount gets its own fence
        self._awaiting.discard(seg.segment_id)  # puts may go there
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
            self._owe_elsewhere(key)
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

    def _owe_elsewhere(self, key: str) -> None:
        """`key` goes: its blocks no record names are owed releases too (detached.py: copies
        on their way into persistent segments, sent when they end; blocks of dropped
        persistent segments, sent when those mount again)."""
        for segment_id, offset, name in self.detached.take(key):
            self.releases.owe(segment_id, offset, name)

    def _delete(self, slot: int, free_at_s: float) -> None:
        key = self._key[slot]
        assert key is not None
        self._owe_elsewhere(key)
        committed = self._state[slot] == COMPLETE
        if not committed:
            self._unpend(slot, self._replicas(slot))
        self._free(slot, self._replicas(slot), free_at_s)
        self._release_slot(slot)
        self._pending.pop(key, None)
        if committed:  # deleted again: a write of its record may have landed after the caller's
            self._dirty[key] = False  # delete (a move or adoption ended while it was written)
        else:
            self._dirty.pop(key, None)
