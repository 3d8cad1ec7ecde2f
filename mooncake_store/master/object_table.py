"""The master's object table (pure core: no I/O, time from an injected clock).

It holds every object's metadata (size, checksum, replicas, state, lease, access statistics),
every mounted segment with its allocator, and the rules between them:

- put_start -> PROCESSING (invisible) -> put_end -> COMMITTING (being made durable) ->
  commit_put_end -> COMPLETE (visible).  put_revoke, a failed commit, a put that outlives
  `put_timeout_s` (zombie), or the death of every replica's node, remove a pending put.
- get_replicas grants a read lease: until it expires, the object's extents are not freed or
  reused, even if the object is removed meanwhile (the free is deferred).
- A segment whose node misses heartbeats for `heartbeat_ttl_s` is dropped with its replicas;
  an object left with no replica is deleted.
- After a master restart, committed objects come back through `restore`; their replicas wait
  for their segment to be mounted again, which rebuilds the allocator from them.  Replicas
  whose segment does not come back within `restore_grace_s` are dropped.

Methods raise MooncakeError subclasses for per-key failures; the service turns them into
per-key statuses.  Persistence is the caller's job: mutations that must reach RocksDB are
returned (`TickResult.deleted_keys`, the metadata from `put_end`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum

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
from mooncake_store.master.placement import choose_segments

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


@dataclass(slots=True)
class ObjectMeta:
    key: str
    size_bytes: int
    state: ObjectState
    replicas: list[Replica]
    checksum: int = 0
    created_s: float = 0.0
    put_deadline_s: float = 0.0
    lease_until_s: float = 0.0
    access_count: int = 0
    last_access_s: float = 0.0
    fingerprint: bytes = b""
    parent_key: str = ""
    tag: bytes = b""


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """What a node tells the master when it mounts its pool."""

    node_id: str
    segment_id: int
    endpoint: str
    shm_socket: str
    size_bytes: int
    secret: bytes
    tier: str = "DRAM"


class Segment:
    """A mounted segment: its mount info, allocator, liveness and the keys it holds."""

    __slots__ = ("allocator", "info", "keys", "last_heartbeat_s")

    def __init__(self, info: SegmentInfo, allocator: ExtentAllocator, now: float) -> None:
        self.info = info
        self.allocator = allocator
        self.last_heartbeat_s = now
        self.keys: set[str] = set()

    @property
    def node_id(self) -> str:
        return self.info.node_id

    @property
    def segment_id(self) -> int:
        return self.info.segment_id

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    @property
    def largest_free(self) -> int:
        return self.allocator.largest_free()


@dataclass(frozen=True, slots=True)
class TableConfig:
    lease_ttl_s: float = 5.0
    put_timeout_s: float = 30.0
    heartbeat_ttl_s: float = 10.0
    restore_grace_s: float = 30.0
    default_replicas: int = 1
    alignment: int = 4096


@dataclass(slots=True)
class PutStartOutcome:
    already_exists: bool
    placements: list[tuple[Segment, Replica]]
    deadline_s: float


@dataclass(slots=True)
class TickResult:
    deleted_keys: list[str] = field(default_factory=list)
    dead_segments: list[SegmentInfo] = field(default_factory=list)
    reclaimed_puts: list[str] = field(default_factory=list)


class ObjectTable:
    def __init__(self, config: TableConfig, *, clock: Callable[[], float]) -> None:
        self.config = config
        self._clock = clock
        self._started_s = clock()
        self._objects: dict[str, ObjectMeta] = {}
        self._segments: dict[int, Segment] = {}
        self._pending: dict[str, float] = {}  # PROCESSING key -> put deadline
        self._orphans: dict[int, set[str]] = {}  # unmounted segment id -> keys (after restore)
        self._deferred: list[tuple[float, int, int]] = []  # (free at, segment id, offset)
        self.counters: dict[str, int] = dict.fromkeys(
            (
                "puts_started",
                "puts_committed",
                "puts_deduplicated",
                "puts_revoked",
                "puts_reclaimed",
                "gets",
                "removes",
                "segments_expired",
                "replicas_dropped",
            ),
            0,
        )

    # ---- segments -------------------------------------------------------------------------

    def mount(self, info: SegmentInfo) -> None:
        """Mount (or re-mount, idempotently) a node's segment.

        A node that comes back with a new segment id restarted and lost its pool: its old
        segment is dropped first.  A segment id known from before a master restart gets its
        allocator rebuilt from the restored replicas.
        """
        now = self._clock()
        existing = self._segments.get(info.segment_id)
        if existing is not None:
            existing.last_heartbeat_s = now
            return
        for seg in list(self._segments.values()):
            if seg.node_id == info.node_id:
                self._drop_segment(seg.segment_id, TickResult())
        seg = Segment(info, ExtentAllocator(info.size_bytes, alignment=self.config.alignment), now)
        self._segments[info.segment_id] = seg
        for key in self._orphans.pop(info.segment_id, set()):
            meta = self._objects.get(key)
            if meta is None:
                continue
            for replica in meta.replicas:
                if replica.segment_id != info.segment_id:
                    continue
                try:
                    seg.allocator.reserve(replica.offset, meta.size_bytes)
                    seg.keys.add(key)
                except ValueError:  # overlaps another restored extent: cannot be trusted
                    meta.replicas.remove(replica)
                    self.counters["replicas_dropped"] += 1
                break

    def heartbeat(self, node_id: str, segment_id: int) -> bool:
        """Refresh a segment's liveness; False when the master does not know it (mount again)."""
        seg = self._segments.get(segment_id)
        if seg is None or seg.node_id != node_id:
            return False
        seg.last_heartbeat_s = self._clock()
        return True

    def unmount(self, node_id: str, segment_id: int) -> list[str]:
        """Drop a segment at the node's request; return the keys deleted with it."""
        seg = self._segments.get(segment_id)
        if seg is None or seg.node_id != node_id:
            return []
        result = TickResult()
        self._drop_segment(segment_id, result)
        return result.deleted_keys

    def segments(self) -> list[Segment]:
        return list(self._segments.values())

    def segment(self, segment_id: int) -> Segment | None:
        return self._segments.get(segment_id)

    # ---- puts -----------------------------------------------------------------------------

    def put_start(
        self,
        key: str,
        size_bytes: int,
        replicas: int = 0,
        *,
        fingerprint: bytes = b"",
        parent_key: str = "",
        tag: bytes = b"",
    ) -> PutStartOutcome:
        """Allocate replicas of a new object on distinct nodes (best effort on the count).

        `fingerprint` names the writer's identity (reads presenting another are refused),
        `parent_key` the previous block of its prefix chain, `tag` small application metadata.

        Raises:
            InvalidKeyError / InvalidValueError / InvalidArgumentError: bad key, size or metadata.
            ObjectBusyError: a put of this key is in progress.
            IdentityMismatchError: the key is stored under another identity.
            NoSpaceError: no mounted node has room.
        """
        validate_key(key)
        if parent_key:
            validate_key(parent_key)
        if len(fingerprint) > MAX_FINGERPRINT_BYTES:
            raise InvalidArgumentError(
                f"fingerprint is {len(fingerprint)} bytes; the limit is {MAX_FINGERPRINT_BYTES}"
            )
        if len(tag) > MAX_TAG_BYTES:
            raise InvalidArgumentError(f"tag is {len(tag)} bytes; the limit is {MAX_TAG_BYTES}")
        if size_bytes <= 0:
            raise InvalidValueError(f"object size must be > 0 bytes, got {size_bytes}")
        if replicas < 0:
            raise InvalidValueError(f"replicas must be >= 1 (or 0 for the default), got {replicas}")
        now = self._clock()
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
                self.counters["puts_deduplicated"] += 1
                return PutStartOutcome(True, [], 0.0)
            # Restored after a master restart but none of its nodes is back: write it again
            # rather than report a put that nobody could read.
            self._delete(meta, 0.0)
        if not self._segments:
            raise NoSpaceError("no store node is mounted: start a mooncake-store node first")
        largest = max(s.allocator.capacity_bytes for s in self._segments.values())
        if size_bytes > largest:
            raise InvalidValueError(
                f"object of {size_bytes} bytes is larger than any node's pool ({largest} bytes): "
                "split it into smaller blocks or start nodes with more --dram"
            )
        extent = self._any_allocator().aligned(size_bytes)
        wanted = replicas or self.config.default_replicas
        chosen = choose_segments(self._segments.values(), extent, wanted)
        if not chosen:
            leased = sum(
                self._segments[sid].allocator.extent(off)
                for _, sid, off in self._deferred
                if sid in self._segments
            )
            held = f"; {leased} bytes are freed when their read leases end" if leased else ""
            raise NoSpaceError(
                f"no store node has {extent} contiguous free bytes for {key!r} "
                f"({len(self._segments)} nodes mounted{held})"
            )
        placements = []
        for seg in chosen:
            offset = seg.allocator.allocate(size_bytes)
            assert offset is not None, "placement chose a segment without room"
            seg.keys.add(key)
            placements.append((seg, Replica(seg.segment_id, offset)))
        deadline = now + self.config.put_timeout_s
        self._objects[key] = ObjectMeta(
            key,
            size_bytes,
            ObjectState.PROCESSING,
            [r for _, r in placements],
            created_s=now,
            put_deadline_s=deadline,
            fingerprint=fingerprint,
            parent_key=parent_key,
            tag=tag,
        )
        self._pending[key] = deadline
        self.counters["puts_started"] += 1
        return PutStartOutcome(False, placements, deadline)

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
            meta.replicas = [r for r in meta.replicas if r.segment_id not in failed]
            self._release(key, lost, 0.0)
        if not meta.replicas:
            self._delete(meta, 0.0)
            self.counters["puts_revoked"] += 1
            raise ReplicaUnavailableError(f"no replica of {key!r} was written; the put is revoked")
        meta.checksum = checksum
        meta.state = ObjectState.COMMITTING
        self._pending.pop(key, None)
        return meta

    def commit_put_end(self, key: str) -> int:
        """Make a COMMITTING object visible (after it is durable); return its replica count.

        Raises:
            ReplicaUnavailableError: every replica's node died while it was being persisted.
        """
        meta = self._objects.get(key)
        if meta is None or meta.state is not ObjectState.COMMITTING:
            raise ReplicaUnavailableError(f"every replica of {key!r} was lost while committing")
        meta.state = ObjectState.COMPLETE
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

    # ---- reads ----------------------------------------------------------------------------

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
        live = [(s, r) for r in meta.replicas if (s := self._segments.get(r.segment_id))]
        if not live:
            raise ReplicaUnavailableError(
                f"{key!r} is committed but none of its nodes is mounted; retry shortly"
            )
        now = self._clock()
        meta.lease_until_s = max(meta.lease_until_s, now + self.config.lease_ttl_s)
        meta.access_count += 1
        meta.last_access_s = now
        self.counters["gets"] += 1
        return meta, live

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

    def exists(self, key: str) -> bool:
        """True when `key` is committed and readable.  Does not count as an access."""
        meta = self._objects.get(key)
        return (
            meta is not None
            and meta.state is ObjectState.COMPLETE
            and any(r.segment_id in self._segments for r in meta.replicas)
        )

    def get(self, key: str) -> ObjectMeta | None:
        return self._objects.get(key)

    def remove(self, key: str) -> None:
        """Delete a committed object.  Extents under a read lease are freed when it ends.

        Raises:
            ObjectNotFoundError: no committed object under `key`.
            ObjectBusyError: a put of `key` is in progress.
        """
        meta = self._objects.get(key)
        if meta is None:
            raise ObjectNotFoundError(f"no object under key {key!r}")
        if meta.state is not ObjectState.COMPLETE:
            raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
        self._delete(meta, meta.lease_until_s)
        self.counters["removes"] += 1

    # ---- time -----------------------------------------------------------------------------

    def tick(self) -> TickResult:
        """Expire dead segments, reclaim zombie puts, run deferred frees, end restore grace."""
        now = self._clock()
        result = TickResult()
        ttl = self.config.heartbeat_ttl_s
        for seg in list(self._segments.values()):
            if now - seg.last_heartbeat_s > ttl:
                result.dead_segments.append(seg.info)
                self.counters["segments_expired"] += 1
                self._drop_segment(seg.segment_id, result)
        for key, deadline in list(self._pending.items()):
            if deadline <= now:
                meta = self._objects[key]
                self._delete(meta, 0.0)
                result.reclaimed_puts.append(key)
                self.counters["puts_reclaimed"] += 1
        while self._deferred and self._deferred[0][0] <= now:
            _, segment_id, offset = heapq.heappop(self._deferred)
            owner = self._segments.get(segment_id)
            if owner is not None:
                owner.allocator.free(offset)
        if self._orphans and now - self._started_s > self.config.restore_grace_s:
            for segment_id in list(self._orphans):
                self._drop_segment(segment_id, result)
        return result

    # ---- restore and stats ----------------------------------------------------------------

    def restore(self, metas: Iterable[ObjectMeta]) -> int:
        """Load committed objects after a master restart; their segments must mount again."""
        count = 0
        for meta in metas:
            meta.state = ObjectState.COMPLETE
            self._objects[meta.key] = meta
            for replica in meta.replicas:
                self._orphans.setdefault(replica.segment_id, set()).add(meta.key)
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
            for r in meta.replicas:
                seg = self._segments.get(r.segment_id)
                if seg is None:
                    assert key in self._orphans.get(r.segment_id, ()), f"{key!r}: lost replica"
                else:
                    assert key in seg.keys
                    assert seg.allocator._allocated.get(r.offset) == seg.allocator.aligned(
                        meta.size_bytes
                    )
        for seg in self._segments.values():
            seg.allocator.validate()
            for key in seg.keys:
                meta = self._objects[key]
                assert any(r.segment_id == seg.segment_id for r in meta.replicas)

    # ---- internals ------------------------------------------------------------------------

    def _any_allocator(self) -> ExtentAllocator:
        return next(iter(self._segments.values())).allocator

    def _release(self, key: str, replicas: Iterable[Replica], free_at_s: float) -> None:
        now = self._clock()
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is None:
                orphan_keys = self._orphans.get(r.segment_id)
                if orphan_keys is not None:
                    orphan_keys.discard(key)
                continue
            seg.keys.discard(key)
            if free_at_s > now:
                heapq.heappush(self._deferred, (free_at_s, r.segment_id, r.offset))
            else:
                seg.allocator.free(r.offset)

    def _delete(self, meta: ObjectMeta, free_at_s: float) -> None:
        self._release(meta.key, meta.replicas, free_at_s)
        meta.replicas = []
        del self._objects[meta.key]
        self._pending.pop(meta.key, None)

    def _drop_segment(self, segment_id: int, result: TickResult) -> None:
        seg = self._segments.pop(segment_id, None)
        keys = seg.keys if seg is not None else self._orphans.pop(segment_id, set())
        for key in keys:
            meta = self._objects.get(key)
            if meta is None:
                continue
            meta.replicas = [r for r in meta.replicas if r.segment_id != segment_id]
            self.counters["replicas_dropped"] += 1
            if not meta.replicas:
                committed = meta.state is not ObjectState.PROCESSING
                del self._objects[key]
                self._pending.pop(key, None)
                if committed:
                    result.deleted_keys.append(key)
