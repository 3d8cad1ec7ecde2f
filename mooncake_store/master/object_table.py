"""The master's object table (pure core: no I/O, time from an injected clock).

It holds every object's metadata (size, checksum, replicas, state, lease, pin, access
statistics, identity), every node and mounted segment with its allocator, and the rules
between them:

- put_start -> PROCESSING (invisible) -> put_end -> COMMITTING (being made durable) ->
  commit_put_end -> COMPLETE (visible).  put_revoke, a failed commit, a put that outlives
  `put_timeout_s` (zombie), or the death of every replica's node, remove a pending put.
- get_replicas grants a read lease: until it expires, the object's extents are not freed,
  evicted or reused, even if the object is removed meanwhile (the free is deferred).
- New objects go to the fastest volatile tier (DRAM).  When no node has room, the eviction
  policy picks victims synchronously (never leased, pinned or pending objects), so a put fails
  with NoSpaceError only when nothing is evictable.  Tier movement (demotion, promotion) is
  planned by `tiering.py` on top of this table.
- A node that misses heartbeats for `heartbeat_ttl_s` is dropped with its segments; an object
  left with no replica is deleted.  A node that mounts with a new incarnation restarted: its
  old segments are dropped, and blocks its persistent tier reports (inventory) are adopted.
- After a master restart, committed objects come back through `restore`; their replicas wait
  for their segment to be mounted again, which rebuilds the allocator from them (a persistent
  segment reconciles them against the node's inventory).  Replicas whose segment does not come
  back within `restore_grace_s` are dropped.

Methods raise MooncakeError subclasses for per-key failures; the service turns them into
per-key statuses.  Mutations that must reach RocksDB outside the put path (evictions, moves,
adopted blocks, dead nodes) accumulate and are drained with `take_dirty()`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from mooncake_store.common.blocks import BlockRecord
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
from mooncake_store.master.allocator import ExtentAllocator
from mooncake_store.master.eviction import EvictionPolicy, LruPolicy
from mooncake_store.master.placement import choose_segments
from mooncake_store.master.segments import (
    NodeInfo,
    NodeState,
    Segment,
    SegmentInfo,
    Tier,
)

MAX_FINGERPRINT_BYTES = 64
MAX_TAG_BYTES = 256


class ObjectState(Enum):
    PROCESSING = 1
    COMMITTING = 2
    COMPLETE = 3


@dataclass(slots=True)
class Replica:
    segment_id: int
    offset: int


class _Cold:
    """The fields of ObjectMeta that almost every block leaves at their defaults."""

    __slots__ = ("hold_until_s", "moving", "pin_until_s", "slow_reads", "tag", "wanted_replicas")

    def __init__(self) -> None:
        for name, default in _COLD_DEFAULTS.items():
            setattr(self, name, default)


_COLD_DEFAULTS: dict[str, object] = {
    "tag": b"",
    "pin_until_s": 0.0,
    "moving": False,
    "slow_reads": 0,
    "wanted_replicas": 1,
    "hold_until_s": 0.0,
}


class _ColdField:
    """An ObjectMeta attribute kept in its `_cold` sidecar, created on the first write of a
    value other than the default: 48 bytes less per block for the blocks that never need it."""

    def __init__(self, default: object) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, meta: ObjectMeta | None, owner: type | None = None) -> Any:
        if meta is None:
            return self
        cold = meta._cold
        return self.default if cold is None else getattr(cold, self.name)

    def __set__(self, meta: ObjectMeta, value: object) -> None:
        cold = meta._cold
        if cold is None:
            if value == self.default:
                return
            cold = meta._cold = _Cold()
        setattr(cold, self.name, value)


class ObjectMeta:
    """One object's metadata.  There is one per block (10M on a big master), so the fields
    most blocks leave at their defaults live in a sidecar object made on demand."""

    __slots__ = (
        "_cold", "_replicas", "access_count", "checksum", "created_s", "fingerprint", "key",
        "last_access_s", "lease_until_s", "parent_key", "size_bytes", "state",
        "window_reads", "window_start_s",
    )  # fmt: skip

    _replicas: Replica | tuple[Replica, ...]
    tag = _ColdField(b"")
    pin_until_s = _ColdField(0.0)
    moving = _ColdField(False)
    slow_reads = _ColdField(0)  # reads served only from a persistent tier since it got there
    wanted_replicas = _ColdField(1)  # what the put asked for: re-replication restores it
    hold_until_s = _ColdField(0.0)  # a node-to-node copy reads the source until then

    def __init__(
        self,
        key: str,
        size_bytes: int,
        state: ObjectState,
        replicas: tuple[Replica, ...],
        *,
        checksum: int = 0,
        created_s: float = 0.0,
        lease_until_s: float = 0.0,
        access_count: int = 0,
        last_access_s: float = 0.0,
        fingerprint: bytes = b"",
        parent_key: str = "",
        tag: bytes = b"",
        pin_until_s: float = 0.0,
        moving: bool = False,
        slow_reads: int = 0,
        wanted_replicas: int = 1,
        window_start_s: float = 0.0,  # hot-block detection: reads since window_start_s
        window_reads: int = 0,
        hold_until_s: float = 0.0,
    ) -> None:
        self.key = key
        self.size_bytes = size_bytes
        self.state = state
        self.replicas = replicas
        self.checksum = checksum
        self.created_s = created_s
        self.lease_until_s = lease_until_s
        self.access_count = access_count
        self.last_access_s = last_access_s
        self.fingerprint = fingerprint
        self.parent_key = parent_key
        self.window_start_s = window_start_s
        self.window_reads = window_reads
        self._cold: _Cold | None = None
        self.tag = tag
        self.pin_until_s = pin_until_s
        self.moving = moving
        self.slow_reads = slow_reads
        self.wanted_replicas = wanted_replicas
        self.hold_until_s = hold_until_s

    @property
    def replicas(self) -> tuple[Replica, ...]:
        r = self._replicas
        return (r,) if type(r) is Replica else r  # type: ignore[return-value]

    @replicas.setter
    def replicas(self, replicas: tuple[Replica, ...]) -> None:
        # Almost every block has one replica: keep it without a tuple (48 bytes a block).
        self._replicas = replicas[0] if len(replicas) == 1 else tuple(replicas)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObjectMeta):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"ObjectMeta({body})"

    @property
    def protected_until_s(self) -> float:
        """Readers' leases and copies in flight keep the extents until then."""
        return max(self.lease_until_s, self.hold_until_s)


_FIELDS = (
    "key", "size_bytes", "state", "replicas", "checksum", "created_s", "lease_until_s",
    "access_count", "last_access_s", "fingerprint", "parent_key", *_COLD_DEFAULTS,
    "window_start_s", "window_reads",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TableConfig:
    lease_ttl_s: float = 5.0
    put_timeout_s: float = 30.0
    heartbeat_ttl_s: float = 10.0
    restore_grace_s: float = 30.0
    default_replicas: int = 1
    alignment: int = 4096
    hot_window_s: float = 10.0
    hot_reads: int = 0  # reads within a window that make a block hot (0: no hot replicas)


@dataclass(slots=True)
class PutStartOutcome:
    already_exists: bool
    placements: list[tuple[Segment, Replica]]
    deadline_s: float


@dataclass(slots=True)
class TickResult:
    deleted_keys: list[str] = field(default_factory=list)
    dead_nodes: list[NodeInfo] = field(default_factory=list)
    reclaimed_puts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Dirty:
    """Mutations to persist: objects to (re)write and keys to delete."""

    puts: list[ObjectMeta] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)


class ObjectTable:
    def __init__(
        self,
        config: TableConfig,
        *,
        clock: Callable[[], float],
        policy: EvictionPolicy | None = None,
    ) -> None:
        self.config = config
        self.policy = policy or LruPolicy()
        self._clock = clock
        self._started_s = clock()
        self._objects: dict[str, ObjectMeta] = {}
        self._nodes: dict[str, NodeState] = {}
        self._segments: dict[int, Segment] = {}
        self._pending: dict[str, float] = {}  # PROCESSING key -> put deadline
        self._fingerprints: dict[bytes, bytes] = {}
        self._sizes: dict[int, int] = {}
        self._orphans: dict[int, set[str]] = {}  # unmounted segment id -> keys (after restore)
        self._deferred: list[tuple[float, int, int]] = []  # (free at, segment id, offset)
        self._dirty: dict[str, bool] = {}  # key -> True: write it, False: delete it
        self._released: dict[int, list[int]] = {}  # persistent segment -> freed offsets
        self.slow_keys: set[str] = set()  # read from a persistent tier only: promotion candidates
        self.read_keys: set[str] = set()  # read since the last plan: GPU promotion candidates
        self.under_replicated: set[str] = set()  # lost a replica: re-replication candidates
        self.hot_keys: set[str] = set()  # read hot_reads times within a window
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "puts_started", "puts_committed", "puts_deduplicated", "puts_revoked",
                "puts_reclaimed", "gets", "removes", "nodes_expired", "replicas_dropped",
                "evictions", "objects_adopted",
            ),
            0,
        )  # fmt: skip

    # ---- nodes and segments -----------------------------------------------------------------

    def mount(
        self,
        node: NodeInfo,
        segments: Sequence[tuple[SegmentInfo, Sequence[BlockRecord] | None]],
    ) -> None:
        """Mount a node's segments (idempotent for the same incarnation).

        A new incarnation of a known node means it restarted: its old segments are dropped
        first.  A persistent segment's inventory is reconciled with what the master knows:
        matching replicas are kept, unknown blocks adopted, missing ones dropped.
        """
        now = self._clock()
        known = self._nodes.get(node.node_id)
        if known is not None and known.info.incarnation == node.incarnation:
            known.last_heartbeat_s = now
            return
        dropped = TickResult()
        if known is not None:
            self._drop_node(node.node_id, dropped)
        state = NodeState(node, now)
        self._nodes[node.node_id] = state
        for info, inventory in segments:
            if info.segment_id in self._segments:  # claimed by another node: take it over
                self._drop_segment(info.segment_id, dropped)
            allocator = ExtentAllocator(info.size_bytes, alignment=self.config.alignment)
            seg = Segment(info, allocator)
            self._segments[info.segment_id] = seg
            state.segment_ids.append(info.segment_id)
            self._adopt(seg, self._orphans.pop(info.segment_id, set()), inventory)
        for key in dropped.deleted_keys:
            self._dirty.setdefault(key, False)  # unless adopted again just now

    def _adopt(
        self, seg: Segment, orphan_keys: set[str], inventory: Sequence[BlockRecord] | None
    ) -> None:
        reported = {item.offset: item for item in inventory or ()}
        for key in orphan_keys:
            meta = self._objects.get(key)
            if meta is None:
                continue
            replica = next((r for r in meta.replicas if r.segment_id == seg.segment_id), None)
            if replica is None:
                continue
            item = reported.pop(replica.offset, None)
            trusted = inventory is None or (
                item is not None and item.key == key and item.checksum == meta.checksum
            )
            if trusted and self._reserve(seg, replica.offset, meta.size_bytes):
                seg.keys.add(key)
                self.policy.insert(key, seg.segment_id, parent=meta.parent_key)
            else:
                self._lose_replica(meta, replica)
        for item in reported.values():  # blocks the master did not know were there
            self._adopt_item(seg, item)

    def _adopt_item(self, seg: Segment, item: BlockRecord) -> None:
        meta = self._objects.get(item.key)
        if meta is not None and (
            meta.state is not ObjectState.COMPLETE
            or meta.checksum != item.checksum
            or meta.size_bytes != item.size_bytes
        ):
            self._note_release(seg, item.offset)
            return
        if not self._reserve(seg, item.offset, item.size_bytes):
            return
        if meta is None:
            meta = ObjectMeta(
                item.key, item.size_bytes, ObjectState.COMPLETE, (), checksum=item.checksum,
                created_s=self._clock(), fingerprint=item.fingerprint,
                parent_key=item.parent_key, tag=item.tag,
            )  # fmt: skip
            self._objects[item.key] = meta
            self.counters["objects_adopted"] += 1
        meta.replicas = (*meta.replicas, Replica(seg.segment_id, item.offset))
        seg.keys.add(item.key)
        self.policy.insert(item.key, seg.segment_id, parent=meta.parent_key)
        self._dirty[item.key] = True

    def _reserve(self, seg: Segment, offset: int, size_bytes: int) -> bool:
        try:
            seg.allocator.reserve(offset, size_bytes)
            return True
        except ValueError:  # overlaps another extent or lies outside: cannot be trusted
            return False

    def heartbeat(self, node_id: str, incarnation: int) -> bool:
        """Refresh a node's liveness; False when the master does not know it (mount again)."""
        state = self._nodes.get(node_id)
        if state is None or state.info.incarnation != incarnation:
            return False
        state.last_heartbeat_s = self._clock()
        return True

    def unmount(self, node_id: str, incarnation: int) -> list[str]:
        """Drop a node at its request; return the keys deleted with it."""
        state = self._nodes.get(node_id)
        if state is None or state.info.incarnation != incarnation:
            return []
        result = TickResult()
        self._drop_node(node_id, result)
        return result.deleted_keys

    def segments(self) -> list[Segment]:
        return list(self._segments.values())

    def segment(self, segment_id: int) -> Segment | None:
        return self._segments.get(segment_id)

    def node(self, node_id: str) -> NodeState | None:
        return self._nodes.get(node_id)

    def node_segment(self, node_id: str, tier: Tier) -> Segment | None:
        state = self._nodes.get(node_id)
        for segment_id in state.segment_ids if state else ():
            seg = self._segments.get(segment_id)
            if seg is not None and seg.tier is tier:
                return seg
        return None

    def last_heartbeat(self, node_id: str) -> float:
        state = self._nodes.get(node_id)
        return state.last_heartbeat_s if state else 0.0

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
    ) -> PutStartOutcome:
        """Allocate replicas of a new object on distinct nodes (best effort on the count).

        `fingerprint` names the writer's identity (reads presenting another are refused),
        `parent_key` the previous block of its prefix chain, `tag` small application metadata,
        `pin_ttl_s` protects it from eviction (0 or inf: until removed; None: not pinned).
        When no node has room, victims are evicted synchronously.

        Raises:
            InvalidKeyError / InvalidValueError / InvalidArgumentError: bad key, size or metadata.
            ObjectBusyError: a put of this key is in progress.
            IdentityMismatchError: the key is stored under another identity.
            NoSpaceError: no node has room and nothing can be evicted.
        """
        validate_key(key)
        if parent_key:
            validate_key(parent_key)
            parent = self._objects.get(parent_key)
            if parent is not None:
                parent_key = parent.key  # share the parent's string: ~110 bytes per block
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
        # Blocks come in a few sizes: share one int per size (28 bytes a block otherwise, as
        # each request decodes its own).
        if len(self._sizes) < 4096:
            size_bytes = self._sizes.setdefault(size_bytes, size_bytes)
        now = self._clock()
        pin_until = 0.0 if pin_ttl_s is None else (
            math.inf if pin_ttl_s <= 0 or math.isinf(pin_ttl_s) else now + pin_ttl_s
        )  # fmt: skip
        meta = self._objects.get(key)
        if meta is not None:
            if meta.state is not ObjectState.COMPLETE:
                raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
            if any(r.segment_id in self._segments for r in meta.replicas):
                if meta.fingerprint != fingerprint:
                    raise IdentityMismatchError(
                        f"{key!r} is already stored under another identity "
                        f"({meta.fingerprint.hex() or 'none'}, not {fingerprint.hex() or 'none'})"
                    )
                if pin_until > meta.pin_until_s:
                    meta.pin_until_s = pin_until
                    self._dirty[key] = True
                self.counters["puts_deduplicated"] += 1
                return PutStartOutcome(True, [], 0.0)
            # Restored after a master restart but none of its nodes is back: write it again
            # rather than report a put that nobody could read.
            self._delete(meta, 0.0)
        fast = [s for s in self._segments.values() if s.tier is Tier.DRAM]
        if not fast:
            raise NoSpaceError("no store node is mounted: start a mooncake-store node first")
        largest = max(s.allocator.capacity_bytes for s in fast)
        if size_bytes > largest:
            raise InvalidValueError(
                f"object of {size_bytes} bytes is larger than any node's pool ({largest} bytes): "
                "split it into smaller blocks or start nodes with more --dram"
            )
        extent = fast[0].allocator.aligned(size_bytes)
        wanted = replicas or self.config.default_replicas
        chosen = choose_segments(fast, extent, wanted)
        if not chosen:
            chosen = self._evict_for(fast, extent)
        if not chosen:
            leased = sum(
                self._segments[sid].allocator.extent(off)
                for _, sid, off in self._deferred
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
            seg.keys.add(key)
            placements.append((seg, Replica(seg.segment_id, offset)))
        deadline = now + self.config.put_timeout_s
        self._objects[key] = ObjectMeta(
            key, size_bytes, ObjectState.PROCESSING, tuple(r for _, r in placements),
            created_s=now, fingerprint=fingerprint,
            parent_key=parent_key, tag=tag, pin_until_s=pin_until, wanted_replicas=wanted,
        )  # fmt: skip
        self._pending[key] = deadline
        self.counters["puts_started"] += 1
        return PutStartOutcome(False, placements, deadline)

    def _evict_for(self, candidates: list[Segment], extent: int) -> list[Segment]:
        """Evict from the segment with most free space until `extent` fits; [] if impossible."""
        for seg in sorted(candidates, key=lambda s: -s.free_bytes):
            if self.make_room(seg, extent):
                return [seg]
        return []

    def make_room(self, seg: Segment, extent: int) -> bool:
        """Evict victims from `seg` until an extent of `extent` bytes fits."""
        while seg.allocator.largest_free() < extent:
            victim = self.policy.pick(seg.segment_id, self.evictable)
            if victim is None:
                return False
            self.evict(victim, seg)
        return True

    def evictable(self, key: str) -> bool:
        meta = self._objects.get(key)
        now = self._clock()
        return (
            meta is not None
            and meta.state is ObjectState.COMPLETE
            and not meta.moving
            and meta.protected_until_s <= now
            and meta.pin_until_s <= now
        )

    def evict(self, key: str, seg: Segment) -> None:
        """Drop `key`'s replica in `seg` (the object goes when it was the last one)."""
        meta = self._objects[key]
        replica = next(r for r in meta.replicas if r.segment_id == seg.segment_id)
        self.counters["evictions"] += 1
        self._lose_replica(meta, replica)

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
        zombie.  The caller persists it, then calls `commit_put_end` (or `put_revoke`).

        Raises:
            ObjectNotFoundError: no put of `key` is pending (revoked, timed out, never started).
            ReplicaUnavailableError: no replica survived; the put is revoked.
        """
        meta = self._objects.get(key)
        if meta is None or meta.state is not ObjectState.PROCESSING:
            raise ObjectNotFoundError(
                f"no put of {key!r} is pending: it was revoked, timed out or never started"
            )
        failed = set(failed_segments)
        if failed:
            lost = [r for r in meta.replicas if r.segment_id in failed]
            meta.replicas = tuple(r for r in meta.replicas if r.segment_id not in failed)
            self._free(key, lost, 0.0)
        if not meta.replicas:
            self._delete(meta, 0.0)
            self.counters["puts_revoked"] += 1
            raise ReplicaUnavailableError(f"no replica of {key!r} was written; the put is revoked")
        meta.checksum = checksum
        meta.state = ObjectState.COMMITTING
        self._pending.pop(key, None)
        return meta

    def puts_in_flight(self) -> int:
        """Puts started and not yet sealed (their PutEnd is still to come)."""
        return len(self._pending)

    def commit_put_end(self, key: str) -> int:
        """Make a COMMITTING object visible (after it is durable); return its replica count.

        Raises:
            ReplicaUnavailableError: every replica's node died while it was being persisted.
        """
        meta = self._objects.get(key)
        if meta is None or meta.state is not ObjectState.COMMITTING:
            raise ReplicaUnavailableError(f"every replica of {key!r} was lost while committing")
        meta.state = ObjectState.COMPLETE
        for r in meta.replicas:
            self.policy.insert(key, r.segment_id, parent=meta.parent_key)
        if len(meta.replicas) < meta.wanted_replicas:  # best effort now, more when nodes allow
            self.under_replicated.add(key)
        self.counters["puts_committed"] += 1
        return len(meta.replicas)

    def put_revoke(self, key: str) -> None:
        """Abort a pending put and free its extents.

        Raises:
            ObjectNotFoundError: nothing pending under `key`.
            ObjectBusyError: the object is already committed (use remove).
        """
        meta = self._objects.get(key)
        if meta is None:
            raise ObjectNotFoundError(f"no put of {key!r} is pending")
        if meta.state is ObjectState.COMPLETE:
            raise ObjectBusyError(f"{key!r} is already committed; remove it instead of revoking")
        self._delete(meta, 0.0)
        self.counters["puts_revoked"] += 1

    # ---- reads ------------------------------------------------------------------------------

    def get_replicas(
        self, key: str, fingerprint: bytes = b""
    ) -> tuple[ObjectMeta, list[tuple[Segment, Replica]]]:
        """Return the object and its readable replicas, granting a read lease on them.

        Raises:
            ObjectNotFoundError: no committed object under `key`.
            IdentityMismatchError: `fingerprint` is given and differs from the stored one.
            ReplicaUnavailableError: the object's nodes are not mounted (yet).
        """
        meta = self._objects.get(key)
        if meta is None or meta.state is not ObjectState.COMPLETE:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if fingerprint and meta.fingerprint != fingerprint:
            raise IdentityMismatchError(
                f"{key!r} was stored under another identity (fingerprint "
                f"{meta.fingerprint.hex() or 'none'}, this read presents {fingerprint.hex()}): "
                "a different model, dtype, layout or TP rank; it is not served"
            )
        replicas = meta.replicas
        if len(replicas) == 1:  # almost every block: no comprehension
            seg = self._segments.get(replicas[0].segment_id)
            live = [(seg, replicas[0])] if seg is not None else []
        else:
            live = [(s, r) for r in replicas if (s := self._segments.get(r.segment_id))]
        if not live:
            raise ReplicaUnavailableError(
                f"{key!r} is committed but none of its nodes is mounted; retry shortly"
            )
        now = self._clock()
        meta.lease_until_s = max(meta.lease_until_s, now + self.config.lease_ttl_s)
        meta.access_count += 1
        meta.last_access_s = now
        if now - meta.window_start_s > self.config.hot_window_s:
            meta.window_start_s, meta.window_reads = now, 0
        meta.window_reads += 1
        if self.config.hot_reads and meta.window_reads >= self.config.hot_reads:
            self.hot_keys.add(key)
        for s, _ in live:
            if not s.info.tier.persistent:
                break
        else:  # served only from a persistent tier
            meta.slow_reads += 1
            self.slow_keys.add(key)
        self.policy.access(key)
        self.read_keys.add(key)
        self.counters["gets"] += 1
        return meta, live

    def exists(self, key: str) -> bool:
        """True when `key` is committed and readable.  Does not count as an access."""
        meta = self._objects.get(key)
        return (
            meta is not None
            and meta.state is ObjectState.COMPLETE
            and any(r.segment_id in self._segments for r in meta.replicas)
        )

    def prefix_match(self, keys: Iterable[str], fingerprint: bytes = b"") -> int:
        """How many leading `keys` are readable (and of `fingerprint`, when given).

        A probe like `exists`: it grants no lease and counts no access.
        """
        matched = 0
        for key in keys:
            if not self.exists(key):
                break
            if fingerprint and self._objects[key].fingerprint != fingerprint:
                break
            matched += 1
        return matched

    def get(self, key: str) -> ObjectMeta | None:
        return self._objects.get(key)

    def objects(self) -> Iterable[ObjectMeta]:
        return self._objects.values()

    def remove(self, key: str) -> None:
        """Delete a committed object (pinned or not).  Leased extents are freed later.

        Raises:
            ObjectNotFoundError: no committed object under `key`.
            ObjectBusyError: a put of `key` is in progress.
        """
        meta = self._objects.get(key)
        if meta is None:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if meta.state is not ObjectState.COMPLETE:
            raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
        self._delete(meta, meta.protected_until_s)
        self.counters["removes"] += 1

    # ---- time -------------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Expire dead nodes, reclaim zombie puts, run deferred frees, end restore grace."""
        now = self._clock()
        result = TickResult()
        ttl = self.config.heartbeat_ttl_s
        for node_id, state in list(self._nodes.items()):
            if now - state.last_heartbeat_s > ttl:
                result.dead_nodes.append(state.info)
                self.counters["nodes_expired"] += 1
                self._drop_node(node_id, result)
        for key, deadline in list(self._pending.items()):
            if deadline <= now:
                self._delete(self._objects[key], 0.0)
                result.reclaimed_puts.append(key)
                self.counters["puts_reclaimed"] += 1
        while self._deferred and self._deferred[0][0] <= now:
            _, segment_id, offset = heapq.heappop(self._deferred)
            owner = self._segments.get(segment_id)
            if owner is not None:
                self._free_extent(owner, offset)
        if self._orphans and now - self._started_s > self.config.restore_grace_s:
            for segment_id in list(self._orphans):
                self._drop_segment(segment_id, result)
        for key in result.deleted_keys:
            self._dirty.pop(key, None)  # reported in the result, persisted by the caller
        return result

    def take_dirty(self) -> Dirty:
        """Objects to (re)write and keys to delete since the last call (drained)."""
        out = Dirty()
        for key, alive in self._dirty.items():
            meta = self._objects.get(key)
            if alive and meta is not None and meta.state is ObjectState.COMPLETE:
                out.puts.append(meta)
            elif meta is None:
                out.deletes.append(key)
        self._dirty.clear()
        return out

    def take_released(self) -> dict[int, list[int]]:
        """Persistent-tier extents freed since the last call, per segment (drained)."""
        out, self._released = self._released, {}
        return out

    # ---- movement between tiers (planned by tiering.py) --------------------------------------

    def begin_move(self, key: str, src: Segment, dst: Segment) -> tuple[Replica, int] | None:
        """Reserve an extent in `dst` for a copy of `key`'s replica in `src`; mark it moving.

        Returns (source replica, destination offset), or None when `dst` has no room (or
        already holds a replica of `key`).
        """
        meta = self._objects[key]
        if any(r.segment_id == dst.segment_id for r in meta.replicas):
            return None
        source = next((r for r in meta.replicas if r.segment_id == src.segment_id), None)
        offset = dst.allocator.allocate(meta.size_bytes) if source is not None else None
        if source is None or offset is None:
            return None
        meta.moving = True
        return source, offset

    def finish_move(self, key: str, source: Replica, dst: Segment, offset: int, ok: bool) -> bool:
        """Swap the source replica for the copy (ok) or give the copy's extent back.

        Returns True when the object now lives at the destination.
        """
        meta = self._objects.get(key)
        live_dst = self._segments.get(dst.segment_id) is dst
        valid = meta is not None and meta.moving and any(r is source for r in meta.replicas)
        if meta is not None:
            meta.moving = False
        if not (ok and valid and live_dst):
            if live_dst:
                self._free_extent(dst, offset)
            return False
        assert meta is not None
        meta.replicas = tuple(r for r in meta.replicas if r is not source)
        self._free(key, [source], meta.protected_until_s)  # readers of the source keep it a while
        meta.replicas = (*meta.replicas, Replica(dst.segment_id, offset))
        dst.keys.add(key)
        self.policy.insert(key, dst.segment_id, parent=meta.parent_key)
        meta.slow_reads = 0
        self._dirty[key] = True
        return True

    def finish_copy(self, key: str, source: Replica, dst: Segment, offset: int, ok: bool) -> bool:
        """Add the copy as a new replica (ok) or give its extent back; True when added."""
        meta = self._objects.get(key)
        live_dst = self._segments.get(dst.segment_id) is dst
        valid = meta is not None and meta.moving and meta.state is ObjectState.COMPLETE
        if meta is not None:
            meta.moving = False
            meta.hold_until_s = 0.0
        on_node = meta is not None and any(
            (s := self._segments.get(r.segment_id)) is not None and s.node_id == dst.node_id
            for r in meta.replicas
        )
        if not (ok and valid and live_dst) or on_node:
            if live_dst:
                self._free_extent(dst, offset)
            return False
        assert meta is not None
        meta.replicas = (*meta.replicas, Replica(dst.segment_id, offset))
        dst.keys.add(key)
        self.policy.insert(key, dst.segment_id, parent=meta.parent_key)
        self._dirty[key] = True
        return True

    def drop_replica(self, key: str, seg: Segment) -> None:
        """Remove one replica of a committed object that keeps at least one other."""
        meta = self._objects[key]
        if len(meta.replicas) < 2:
            raise ValueError(f"{key!r} has a single replica; remove the object instead")
        replica = next(r for r in meta.replicas if r.segment_id == seg.segment_id)
        meta.replicas = tuple(r for r in meta.replicas if r is not replica)
        self._free(key, [replica], meta.protected_until_s)
        self._dirty[key] = True

    def hold(self, key: str, until_s: float) -> None:
        """Protect `key`'s extents for a node-to-node copy (released by finish_copy)."""
        meta = self._objects.get(key)
        if meta is not None:
            meta.hold_until_s = max(meta.hold_until_s, until_s)

    # ---- restore and stats ------------------------------------------------------------------

    def restore(self, metas: Iterable[ObjectMeta]) -> int:
        """Load committed objects after a master restart; their segments must mount again."""
        count = 0
        for meta in metas:
            meta.state = ObjectState.COMPLETE
            self._objects[meta.key] = meta
            for replica in meta.replicas:
                self._orphans.setdefault(replica.segment_id, set()).add(meta.key)
            if len(meta.replicas) < meta.wanted_replicas:
                self.under_replicated.add(meta.key)
            count += 1
        return count

    def object_count(self) -> int:
        return sum(1 for m in self._objects.values() if m.state is ObjectState.COMPLETE)

    def pending_count(self) -> int:
        return len(self._objects) - self.object_count()

    def bytes_stored(self) -> int:
        return sum(m.size_bytes for m in self._objects.values() if m.state is ObjectState.COMPLETE)

    def validate(self) -> None:
        """Check cross-structure invariants (used by tests)."""
        for key, meta in self._objects.items():
            assert meta.key == key
            assert meta.replicas, f"{key!r} has no replicas"
            assert (key in self._pending) == (meta.state is ObjectState.PROCESSING)
            assert len({r.segment_id for r in meta.replicas}) == len(meta.replicas)
            for r in meta.replicas:
                seg = self._segments.get(r.segment_id)
                if seg is None:
                    assert key in self._orphans.get(r.segment_id, ()), f"{key!r}: lost replica"
                else:
                    assert key in seg.keys, f"{key!r} missing from segment keys"
                    assert seg.allocator._allocated.get(r.offset) == seg.allocator.aligned(
                        meta.size_bytes
                    )
        for seg in self._segments.values():
            seg.allocator.validate()
            assert self._nodes[seg.node_id].info == seg.info.node
            for key in seg.keys:
                meta = self._objects[key]
                assert any(r.segment_id == seg.segment_id for r in meta.replicas)

    # ---- internals --------------------------------------------------------------------------

    def _note_release(self, seg: Segment, offset: int) -> None:
        """Tell the node (persistent tiers only) to forget an extent the master does not use."""
        if seg.tier.persistent:
            self._released.setdefault(seg.segment_id, []).append(offset)

    def _free_extent(self, seg: Segment, offset: int) -> None:
        """Give an allocated extent back now and tell its node."""
        seg.allocator.free(offset)
        self._note_release(seg, offset)

    def _free(self, key: str, replicas: Iterable[Replica], free_at_s: float) -> None:
        now = self._clock()
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is None:
                orphan_keys = self._orphans.get(r.segment_id)
                if orphan_keys is not None:
                    orphan_keys.discard(key)
                continue
            if key in seg.keys:
                seg.keys.discard(key)
                self.policy.discard(key, r.segment_id)
            if free_at_s > now:
                heapq.heappush(self._deferred, (free_at_s, r.segment_id, r.offset))
            else:
                self._free_extent(seg, r.offset)

    def _lose_replica(self, meta: ObjectMeta, replica: Replica) -> None:
        """Drop one replica of a committed object; delete the object if it was the last."""
        meta.replicas = tuple(r for r in meta.replicas if r is not replica)
        self._free(meta.key, [replica], meta.protected_until_s)
        self.counters["replicas_dropped"] += 1
        if meta.replicas:
            self._dirty[meta.key] = True
        else:
            del self._objects[meta.key]
            self._pending.pop(meta.key, None)
            self._dirty[meta.key] = False

    def _delete(self, meta: ObjectMeta, free_at_s: float) -> None:
        self._free(meta.key, meta.replicas, free_at_s)
        meta.replicas = ()
        del self._objects[meta.key]
        self._pending.pop(meta.key, None)
        self._dirty.pop(meta.key, None)

    def _drop_node(self, node_id: str, result: TickResult) -> None:
        state = self._nodes.pop(node_id, None)
        for segment_id in state.segment_ids if state else ():
            self._drop_segment(segment_id, result)

    def _drop_segment(self, segment_id: int, result: TickResult) -> None:
        seg = self._segments.pop(segment_id, None)
        if seg is not None:
            state = self._nodes.get(seg.node_id)
            if state is not None and segment_id in state.segment_ids:
                state.segment_ids.remove(segment_id)
        keys = seg.keys if seg is not None else self._orphans.pop(segment_id, set())
        for key in keys:
            self.policy.discard(key, segment_id)
            meta = self._objects.get(key)
            if meta is None:
                continue
            meta.replicas = tuple(r for r in meta.replicas if r.segment_id != segment_id)
            self.counters["replicas_dropped"] += 1
            if meta.replicas:
                if meta.state is ObjectState.COMPLETE:
                    self._dirty[key] = True
                    if len(meta.replicas) < meta.wanted_replicas:
                        self.under_replicated.add(key)
                continue
            committed = meta.state is not ObjectState.PROCESSING
            del self._objects[key]
            self._pending.pop(key, None)
            if committed:
                self._dirty.pop(key, None)
                result.deleted_keys.append(key)
