"""Membership: the master's nodes and their mounted segments, and the rules about them (pure
core: no I/O, time from the table's injected clock).

- A node mounts its segments with an incarnation (a number fixed for the life of one node
  process).  A repeat mount of the same incarnation is a no-op; a new incarnation of a known
  node means it restarted: its old segments are dropped first.
- Reconciliation: a persistent segment's inventory (the blocks the node reports) is matched
  against what the master knows: vouched-for replicas are kept, unknown blocks adopted, the rest
  dropped.  Replicas restored from RocksDB wait for their segment (an orphan) until it mounts.
- Liveness (heartbeats are received off the client loop, see `liveness.py`; every time here is
  monotonic): a node silent for `heartbeat_ttl_s` is *suspect*: its segments are no longer
  offered to readers or writers (`segments()`, reads, placement), but its replicas are kept.  A
  suspect node that heartbeats again (same incarnation) is offered again, its replicas valid as
  before.  Only a node silent for `heartbeat_ttl_s + suspect_grace_s` is dropped with its
  segments, and an object is deleted only when its last replica goes with them.  Orphan
  segments that do not come back within `restore_grace_s` of the master's start are dropped.
- Identity: a node id and a segment id each belong to one mounted node.  A mount that claims the
  id of a node that is still heartbeating (another process under the same --node-id), or a
  segment id another node owns, is refused with IdentityConflictError naming both; nothing of
  the existing node changes.  A node whose heartbeats stopped may be replaced by a mount of a
  new incarnation (it restarted).

`Membership` is a base of `ObjectTable`: dropping a segment drops its replicas from the objects'
columns, so both share the table's state; this module holds only the rules about nodes and
segments (the matching of an inventory is in reconcile.py, its base), `object_table.py` and
its other bases (see there) those about objects.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.errors import IdentityConflictError
from mooncake_store.master.allocator import ExtentAllocator
from mooncake_store.master.columns import COMPLETE, PROCESSING
from mooncake_store.master.detached import DetachedBlocks
from mooncake_store.master.eviction import EvictionPolicy
from mooncake_store.master.fences import WriteFences
from mooncake_store.master.liveness import Heartbeats
from mooncake_store.master.reconcile import InventoryReconciliation
from mooncake_store.master.releases import BlockName, OwedReleases
from mooncake_store.master.segments import (
    NodeCondition,
    NodeInfo,
    NodeState,
    Segment,
    SegmentInfo,
    Tier,
)


@dataclass(slots=True)
class TickResult:
    """What a tick did: objects deleted with their last replica, nodes dropped, puts reclaimed."""

    deleted_keys: list[str] = field(default_factory=list)
    dead_nodes: list[NodeInfo] = field(default_factory=list)
    suspect_nodes: list[NodeInfo] = field(default_factory=list)  # newly suspect
    revived_nodes: list[NodeInfo] = field(default_factory=list)  # suspect, heard from again
    reclaimed_puts: list[str] = field(default_factory=list)


# A node mounted again where the mount is new (the master restarted, or dropped the node) may
# still have same-host clients copying under grants of its earlier mount: it closes its fence
# page before mounting (node/master_link.py) and such a copy stops within a chunk, but one
# already under way lands first.  None of the new mount's room is handed out before then.
REMOUNT_HOLD_S = 0.5


class Membership(InventoryReconciliation):
    """Nodes, segments and liveness (see the module docstring)."""

    # The object table's state and helpers these rules use (defined by ObjectTable).
    policy: EvictionPolicy
    counters: dict[str, int]
    under_replicated: set[str]
    _dirty: dict[str, bool]
    _pending: dict[str, float]
    _lease_keys: set[str]  # pending puts that are allocation leases (leases.py)
    _moves: dict[tuple[int, int, int], tuple[int, BlockName]]  # copies in flight (relocation)
    releases: OwedReleases  # persistent-tier blocks their nodes must forget (releases.py)
    detached: DetachedBlocks  # blocks of dropped persistent segments (detached.py)
    draining: Collection[str]  # nodes being drained (drain.py)
    fences: WriteFences
    _fence_writes: bool

    if TYPE_CHECKING:

        def pending_releases(self, segment_id: int) -> dict[int, BlockName]: ...

    def __init__(
        self,
        *,
        clock: Callable[[], float],
        heartbeat_ttl_s: float,
        restore_grace_s: float,
        alignment: int,
        suspect_grace_s: float = 0.0,
        heartbeats: Heartbeats | None = None,
    ) -> None:
        super().__init__()
        self._clock = clock
        self.heartbeats = heartbeats or Heartbeats(clock)  # written by the liveness thread
        self._heartbeat_ttl_s = heartbeat_ttl_s
        self._suspect_grace_s = suspect_grace_s
        self._restore_grace_s = restore_grace_s
        self._alignment = alignment
        self._started_s = clock()
        self._nodes: dict[str, NodeState] = {}
        self._segments: dict[int, Segment] = {}  # every mounted segment
        self._offered: dict[int, Segment] = {}  # those of nodes not suspect: readers, writers
        self._held_until = 0.0  # the latest `Segment.writable_after` set (remount_hold_s)
        # Segments whose node took no fence of this run since they mounted (`fence_acked` in
        # frees.py takes them out): no put is granted room there before.
        self._awaiting: set[int] = set()
        self._orphans: set[int] = set()  # restored replicas' segments not mounted yet
        self._grace_over = False  # the restore grace ended (orphans dropped)
        #: Persistent segments ever mounted (persisted, `new_persistent`): a release owed to one
        #: not mounted waits for it, one owed to any other segment ends with the restore grace.
        self.persistent_ids: set[int] = set()
        self.new_persistent: list[int] = []  # mounted for the first time: to persist
        self._mounts = 0  # segment generations handed out (Segment.generation)

    def mount(
        self,
        node: NodeInfo,
        segments: Sequence[tuple[SegmentInfo, Sequence[BlockRecord] | None]],
        *,
        replace: bool = False,
        remount: bool = False,
    ) -> None:
        """Mount a node's segments (idempotent for the same incarnation).

        A new incarnation of a known node means it restarted: its old segments are dropped
        first.  That is taken for granted when the old one is suspect or had the same data
        endpoint (two live processes cannot listen on one address); otherwise the caller must
        have found the old endpoint dead and pass `replace=True`, or the mount is refused.  A
        persistent segment's inventory is reconciled with what the master knows: matching
        replicas are kept, unknown blocks adopted, missing ones dropped.  `remount`: the node
        was mounted before (on an earlier master, or on this one before it dropped the node);
        when the mount is new here, none of its room is handed out for `REMOUNT_HOLD_S`.

        Raises:
            IdentityConflictError: the node id belongs to another live node, or a segment id
                to another mounted node.
        """
        known = self._nodes.get(node.node_id)
        if known is not None and known.info.incarnation == node.incarnation:
            self.heartbeats.beat(node.node_id, node.incarnation)
            if known.suspect:
                self._revive(known)
            return
        self._check_identity(node, [info for info, _ in segments], known, replace)
        dropped = TickResult()
        back = {info.segment_id for info, _ in segments}  # their inventories speak for them
        if known is not None:
            self._drop_node(node.node_id, dropped, keep=back)
        for info, _ in segments:  # defensive: no other mounted node owns one (checked above)
            if info.segment_id in self._segments:
                self._drop_segment(info.segment_id, dropped, detach=False)
        state = NodeState(node)
        self._nodes[node.node_id] = state
        self.heartbeats.expect(node.node_id, node.incarnation)
        for info, inventory in segments:
            allocator = ExtentAllocator(info.size_bytes, alignment=self._alignment)
            self._mounts += 1
            seg = Segment(info, allocator, self._mounts)
            if remount:
                seg.writable_after = self._clock() + REMOUNT_HOLD_S
                self._held_until = max(self._held_until, seg.writable_after)
            if self._fence_writes and info.tier is Tier.DRAM:
                self._awaiting.add(info.segment_id)  # see `awaiting_first_fence`
                self.fences.dirty = True
            self._segments[info.segment_id] = seg
            self._offered[info.segment_id] = seg
            state.segment_ids.append(info.segment_id)
            restored: list[int] = []
            if info.segment_id in self._orphans:  # its replicas came back from RocksDB
                self._orphans.discard(info.segment_id)
                restored = self._slots_in(info.segment_id)
            owed: dict[int, BlockName] = {}
            if seg.persistent:
                if info.segment_id not in self.persistent_ids:
                    self.persistent_ids.add(info.segment_id)
                    self.new_persistent.append(info.segment_id)
                self.detached.forget_segment(info.segment_id)  # removed keys' are owed already
                owed = self.pending_releases(info.segment_id)
            else:  # owed before its tier was known (not mounted since a restart): none is
                self.releases.forget_segment(info.segment_id)
            self._adopt(seg, restored, inventory, owed)
        for key in dropped.deleted_keys:
            self._dirty.setdefault(key, False)  # unless adopted again just now

    def identity_conflict(self, node: NodeInfo) -> NodeInfo | None:
        """The live node a mount of `node` would replace without proof that it is gone: one
        under the same id, of another incarnation, heartbeating, at another data endpoint."""
        known = self._nodes.get(node.node_id)
        if (
            known is None
            or known.suspect
            or known.info.incarnation == node.incarnation
            or known.info.endpoint == node.endpoint
        ):
            return None
        return known.info

    def _check_identity(
        self, node: NodeInfo, infos: Sequence[SegmentInfo], known: NodeState | None, replace: bool
    ) -> None:
        """Refuse a mount that claims a live node's id or a segment another live node owns.

        A node id: a known node that is suspect, or that the caller found gone (`replace`),
        may be replaced by a new incarnation: that is a restart.  A segment id of another node
        is refused while that node is mounted at all (suspect too: it may come back with the
        segment's replicas); once it is dropped the id is free.
        """
        if not replace and self.identity_conflict(node) is not None:
            assert known is not None
            other = known.info
            raise IdentityConflictError(
                f"node id {node.node_id!r} is taken: a live node (incarnation "
                f"{other.incarnation:x}, data endpoint {other.endpoint}) is mounted under it; "
                f"the mount from {node.endpoint} (incarnation {node.incarnation:x}) is refused. "
                "Give each node its own --node-id"
            )
        for info in infos:
            seg = self._segments.get(info.segment_id)
            if seg is None or seg.node_id == node.node_id:
                continue
            owner = self._nodes.get(seg.node_id)
            if owner is not None:  # suspect ones too: they may come back with its replicas
                state = "suspect" if owner.suspect else "live"
                raise IdentityConflictError(
                    f"segment id {info.segment_id} is owned by {state} node {seg.node_id!r} "
                    f"({owner.info.endpoint}); the mount of node {node.node_id!r} "
                    f"({node.endpoint}) that claims it is refused"
                )

    def heartbeat(self, node_id: str, incarnation: int) -> bool:
        """Refresh a node's liveness; False when the master does not know it (mount again)."""
        return self.heartbeats.beat(node_id, incarnation)

    def unmount(self, node_id: str, incarnation: int) -> list[str]:
        """Drop a node at its request; return the keys deleted with it."""
        state = self._nodes.get(node_id)
        if state is None or state.info.incarnation != incarnation:
            return []
        result = TickResult()
        self._drop_node(node_id, result)
        return result.deleted_keys

    def segments(self) -> list[Segment]:
        """The segments offered to readers and writers (not those of suspect nodes)."""
        return list(self._offered.values())

    def room_held(self, seg: Segment) -> bool:
        """Whether `seg` was mounted again a moment ago and hands out no room yet."""
        return seg.writable_after > self._clock()

    def nodes_expected(self) -> bool:
        """Whether puts should wait for a node rather than fail for want of one: none offers a
        DRAM segment, and the master restarted with objects whose segments have not mounted
        again yet (within its restore grace)."""
        return (
            bool(self._orphans)
            and not self._grace_over
            and not any(s.tier is Tier.DRAM for s in self._offered.values())
        )

    def segment(self, segment_id: int) -> Segment | None:
        """The segment, when it is offered (its node is not suspect)."""
        return self._offered.get(segment_id)

    def remount_hold_s(self) -> float:
        """Seconds until every segment's room may be handed out again (0: now); asked on every
        put, so one number, not a pass over the segments (a hold of a segment dropped since
        is sat out too: half a second at most)."""
        return max(0.0, self._held_until - self._clock())

    def awaiting_first_fence(self, nodes: Collection[str] = ()) -> bool:
        """True while a DRAM segment offered to readers (of one of `nodes`, node ids or data
        endpoints, when given) has not been granted to puts yet: its
        node has not taken a write fence of this master run since the mount.  A node takes a
        control request only of the run whose mount reply it took last (node/control.py), so
        this proves the reply reached it.  Until then this run hands out no write grant there:
        a run whose mount reply was lost must leave no grant behind, since the node, which
        never saw it, cannot make a later run start its generations past that run's
        (generations.py): a later run on a restored data directory would reuse them."""
        return bool(self.awaiting_nodes(nodes))

    def put_nodes(
        self, size_bytes: int = 0, room: Callable[[Segment], bool] | None = None
    ) -> tuple[set[str], set[str]]:
        """The nodes a put of `size_bytes` may be placed on now (a DRAM segment offered, not
        draining, not holding its room after a remount, its first fence taken, and free room
        for the value, as put_start takes it before any eviction; and, given `room`, one it
        accepts), and those it may be in a moment (the same, mounting or not)."""
        now = self._clock()
        ready: set[str] = set()
        soon: set[str] = set()
        for seg in self._offered.values():
            if seg.tier is not Tier.DRAM or seg.node_id in self.draining:
                continue
            if size_bytes and seg.largest_free < seg.allocator.aligned(size_bytes):
                continue
            if room is not None and not room(seg):
                continue
            soon.add(seg.node_id)
            if seg.writable_after <= now and seg.segment_id not in self._awaiting:
                ready.add(seg.node_id)
        return ready, soon

    def short_while_mounting(self, wanted: int, size_bytes: int) -> bool:
        """Whether a put of `size_bytes` wanting `wanted` replicas would now get fewer nodes
        than it will once the nodes awaiting their first fence took it (normally within
        milliseconds of their mount): a put started now would be acknowledged short of a
        replica for good."""
        if not self._awaiting:
            return False
        ready, soon = self.put_nodes(size_bytes)
        return len(ready) < min(wanted, len(soon))

    def awaiting_nodes(self, nodes: Collection[str] = ()) -> set[str]:
        """The ids of the nodes offered to readers (among `nodes`, when given) with a segment
        `awaiting_first_fence` (O(1) when there is none: asked on every put)."""
        if not self._awaiting:
            return set()
        out = set()
        for segment_id in self._awaiting:
            seg = self._offered.get(segment_id)
            if seg is not None and (
                not nodes or seg.node_id in nodes or seg.info.node.endpoint in nodes
            ):
                out.add(seg.node_id)
        return out

    def mounted_segment(self, segment_id: int) -> Segment | None:
        """The segment while it is mounted, offered or not (its node may be suspect)."""
        return self._segments.get(segment_id)

    def node(self, node_id: str) -> NodeState | None:
        return self._nodes.get(node_id)

    def node_segment(self, node_id: str, tier: Tier) -> Segment | None:
        state = self._nodes.get(node_id)
        for segment_id in state.segment_ids if state else ():
            seg = self._offered.get(segment_id)
            if seg is not None and seg.tier is tier:
                return seg
        return None

    def last_heartbeat(self, node_id: str) -> float:
        last = self.heartbeats.last(node_id)
        return 0.0 if last is None else last

    def suspect_nodes(self) -> list[str]:
        return [node_id for node_id, state in self._nodes.items() if state.suspect]

    def node_conditions(self) -> list[tuple[NodeState, NodeCondition, float]]:
        """Every mounted node, suspect ones too (what ListNodes shows an operator), with its
        condition and, for a suspect node, the seconds left until it is dropped (0.0 else).
        A suspect node that drains is SUSPECT: that it is not offered matters more; a draining
        one that is MOUNTING is DRAINING (it takes no puts either way)."""
        now = self._clock()
        dropped_at_s = self._heartbeat_ttl_s + self._suspect_grace_s  # of silence
        out: list[tuple[NodeState, NodeCondition, float]] = []
        for node_id, state in self._nodes.items():
            if state.suspect:
                last = self.heartbeats.last(node_id)
                silent_s = math.inf if last is None else now - last
                out.append((state, NodeCondition.SUSPECT, max(0.0, dropped_at_s - silent_s)))
            elif node_id in self.draining:
                out.append((state, NodeCondition.DRAINING, 0.0))
            elif any(i in self._awaiting for i in state.segment_ids):
                out.append((state, NodeCondition.MOUNTING, 0.0))
            else:
                out.append((state, NodeCondition.VALID, 0.0))
        return out

    def _expire(self, now: float, result: TickResult) -> None:
        """Suspect silent nodes, offer again those heard from, drop those silent past the grace
        window; drop orphans whose restore grace ended."""
        ttl_s = self._heartbeat_ttl_s
        for node_id, state in list(self._nodes.items()):
            last = self.heartbeats.last(node_id)
            silent_s = math.inf if last is None else now - last
            if silent_s > ttl_s + self._suspect_grace_s:
                result.dead_nodes.append(state.info)
                self.counters["nodes_expired"] += 1
                self._drop_node(node_id, result)
            elif silent_s > ttl_s:
                if not state.suspect:
                    self._suspect(state)
                    result.suspect_nodes.append(state.info)
            elif state.suspect:
                self._revive(state)
                result.revived_nodes.append(state.info)
        if not self._grace_over and now - self._started_s > self._restore_grace_s:
            self._grace_over = True
            for segment_id in list(self._orphans):
                self._drop_segment(segment_id, result)
            for segment_id in self.releases.segments():  # owed since the restart to segments
                if segment_id not in self._segments and segment_id not in self.persistent_ids:
                    self.releases.forget_segment(segment_id)  # not known persistent: DRAM

    def _suspect(self, state: NodeState) -> None:
        """Stop offering a silent node's segments; its replicas stay (it may come back)."""
        state.suspect = True
        self.counters["nodes_suspected"] += 1
        for segment_id in state.segment_ids:
            self._offered.pop(segment_id, None)
            for slot in self._slots_in(segment_id):  # repairs may start during the window
                if self._state[slot] == COMPLETE:
                    self.under_replicated.add(self._key[slot])  # type: ignore[arg-type]

    def _revive(self, state: NodeState) -> None:
        """A suspect node was heard from again: offer its segments again."""
        state.suspect = False
        for segment_id in state.segment_ids:
            seg = self._segments.get(segment_id)
            if seg is not None:
                self._offered[segment_id] = seg

    def _drop_node(self, node_id: str, result: TickResult, keep: Collection[int] = ()) -> None:
        """Drop a node and its segments (`keep`: those mounting again right now)."""
        state = self._nodes.pop(node_id, None)
        if state is not None:
            self.heartbeats.forget(node_id)
        for segment_id in state.segment_ids if state else ():
            self._drop_segment(segment_id, result, detach=segment_id not in keep)

    def _drop_segment(self, segment_id: int, result: TickResult, *, detach: bool = True) -> None:
        """Drop a segment and its replicas.  A persistent one keeps its blocks on its node:
        they are recorded as detached (detached.py), unless `detach` is False (it mounts
        again at once, and its inventory speaks for them)."""
        seg = self._segments.pop(segment_id, None)
        detach = detach and (
            seg.persistent if seg is not None else segment_id in self.persistent_ids
        )
        self._offered.pop(segment_id, None)
        self._awaiting.discard(segment_id)
        for move in [m for m in self._moves if m[0] == segment_id]:
            del self._moves[move]  # copies into it are moot: finish_* find it gone
        if seg is not None:
            state = self._nodes.get(seg.node_id)
            if state is not None and segment_id in state.segment_ids:
                state.segment_ids.remove(segment_id)
        self._orphans.discard(segment_id)
        slots = self._slots_in(segment_id)
        for slot in slots:
            key = self._key[slot]
            assert key is not None
            self.policy.discard(slot, segment_id, key)
            if detach:
                for r in self._replicas(slot):
                    if r.segment_id == segment_id:
                        self.detached.detach(
                            segment_id, r.offset, BlockName(key, self._checksum[slot])
                        )
            replicas = tuple(r for r in self._replicas(slot) if r.segment_id != segment_id)
            self._set_replicas(slot, replicas)
            self.counters["replicas_dropped"] += 1
            if replicas:
                if self._state[slot] == COMPLETE:
                    self._dirty[key] = True
                    if len(replicas) < self._wanted[slot]:
                        self.under_replicated.add(key)
                continue
            committed = self._state[slot] != PROCESSING
            self._release_slot(slot)
            self._pending.pop(key, None)
            self._lease_keys.discard(key)  # an unused allocation lease dies with its node
            if committed:
                self._dirty.pop(key, None)
                result.deleted_keys.append(key)
                self.counters["objects_lost"] += 1  # its last replica went with its node
