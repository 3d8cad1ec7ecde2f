"""The put lifecycle in the object table.

put_start -> PROCESSING (invisible) -> put_end -> COMMITTING (being made durable) ->
commit_put_end -> COMPLETE (visible).  put_revoke, a failed commit, a put that outlives
`put_timeout_s` (zombie: reclaimed by `ObjectTable.tick`, or at its late PutEnd, refused), the
close of the connection that started it (`revoke_owner`), or the death of every replica's node,
remove a pending put.
Pending puts may hold (and evict for) at most `max_pending_share` of a pool.

`PutLifecycle` is a base of `ObjectTable` (object_table.py) on top of `EvictionVictims`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

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
from mooncake_store.master.columns import COMMITTING, COMPLETE, PROCESSING
from mooncake_store.master.leases import lease_start, leases_pending
from mooncake_store.master.membership import REMOUNT_HOLD_S
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.placement import choose_segments
from mooncake_store.master.segments import Segment, Tier
from mooncake_store.master.victims import EvictionVictims

if TYPE_CHECKING:
    from mooncake_store.master.object_table import ObjectTable

log = logging.getLogger("mooncake.master")

MAX_FINGERPRINT_BYTES = 64
MAX_TAG_BYTES = 256


@dataclass(slots=True)
class PutStartOutcome:
    already_exists: bool
    placements: list[tuple[Segment, Replica]]
    deadline_s: float
    generation: int = 0  # the put's, named by its write grants


class PutLifecycle(EvictionVictims):
    """Puts: start, end, commit, revoke (see the module docstring)."""

    # The object table's state these rules use (set by ObjectTable.__init__).
    draining: Collection[str]
    _owner_of: dict[str, int]  # PROCESSING key -> the connection that started it
    _owned: dict[int, set[str]]  # connection -> its PROCESSING keys
    _lease_keys: set[str]  # pending puts that are allocation leases (leases.py)
    _fingerprints: dict[bytes, bytes]

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
        evict: bool = True,
        attempt: int = 0,
        retry: int = 0,
        lease_room: Callable[[Segment], bool] | None = None,
    ) -> PutStartOutcome:
        """Allocate replicas of a new object on distinct nodes (best effort on the count).

        `fingerprint` names the writer's identity (reads presenting another are refused),
        `parent_key` the previous block of its prefix chain, `tag` small application metadata,
        `pin_ttl_s` protects it from eviction (0 or inf: until removed; None: not pinned);
        `soft_pin_ttl_s` (> 0) keeps it for that long unless nothing else can be evicted.
        `preferred_nodes` (node ids or data endpoints) receive the replicas when they have
        room.  `owner` names the client connection (0: none): `revoke_owner` ends its pending
        puts.  When no node has room, victims are evicted synchronously, for at most
        `max_pending_share` of a segment held by pending puts; with `evict` False, NoSpaceError
        instead.  `lease_room` makes it an allocation lease (leases.py): only segments it
        accepts, free room only (never an eviction), and every replica a plain put would get
        or none.  `attempt` (nonzero) is the client's id of this put and `retry` how often
        it was sent again after a reply that never came: a put of `key` pending under the same
        id with a lower `retry` is an earlier try whose reply never reached the client, so
        nobody writes with its grant; it is revoked and this one starts in its place
        (`puts_superseded`).  A later try already pending is not (this one is the stale one);
        nor is a sealed one (its PutEnd came): the caller waits for its commit first
        (`pending_attempt`).

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
        if slot is not None and attempt and self._state[slot] == PROCESSING:
            earlier = self._attempt.get(slot)
            if earlier is not None and earlier[0] == attempt and earlier[1] < retry:
                self.put_revoke(key)
                self.counters["puts_superseded"] += 1
                slot = None
        if slot is not None:
            if self._stored_again(slot, key, fingerprint, pin_until):
                self.counters["puts_deduplicated"] += 1
                return PutStartOutcome(True, [], 0.0)
            # Restored after a master restart but none of its nodes is back: write it again
            # rather than report a put that nobody could read.
            self._delete(slot, 0.0)
        usable = [
            s for s in self._offered.values()
            if s.tier is Tier.DRAM and s.node_id not in self.draining
        ]  # fmt: skip
        fast = [
            s for s in usable
            if s.writable_after <= now  # not a node mounted again a moment ago
            and s.segment_id not in self._awaiting  # membership.py
        ]  # fmt: skip
        if not fast:
            if any(s.writable_after > now for s in self._offered.values()):
                raise NoSpaceError(
                    "every store node was mounted again less than "
                    f"{REMOUNT_HOLD_S:g}s ago (the master or the node restarted): retry shortly"
                )
            if self.awaiting_first_fence():  # type: ignore[attr-defined]
                raise NoSpaceError(
                    "no store node has taken this master's first write fence since it mounted "
                    "(its mount reply may not have reached it yet): retry shortly"
                )
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
        if lease_room is not None:
            return lease_start(
                cast("ObjectTable", self), key, size_bytes, wanted, fast, usable, extent,
                lease_room, owner,
            )  # fmt: skip
        chosen = choose_segments(fast, extent, wanted, preferred)
        if not chosen and not evict:
            raise NoSpaceError(f"no store node has {extent} free bytes for {key!r}")
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
        outcome = self._allocate(
            key, size_bytes, chosen, extent, now, wanted, owner, fingerprint=fingerprint,
            parent_key=parent_key, tag=tag, pin_until=pin_until, soft_pin_ttl_s=soft_pin_ttl_s,
        )  # fmt: skip
        if attempt:
            self._attempt[self._slot[key]] = (attempt, retry)
        return outcome

    def pending_attempt(self, key: str) -> int:
        """The client's attempt id of `key`'s put while it is pending or being committed
        (0: none, or no such put)."""
        slot = self._slot.get(key)
        if slot is None or self._state[slot] == COMPLETE:
            return 0
        return self._attempt.get(slot, (0, 0))[0]

    def _allocate(
        self,
        key: str,
        size_bytes: int,
        chosen: list[Segment],
        extent: int,
        now: float,
        wanted: int,
        owner: int,
        *,
        fingerprint: bytes = b"",
        parent_key: str = "",
        tag: bytes = b"",
        pin_until: float = 0.0,
        soft_pin_ttl_s: float = 0.0,
    ) -> PutStartOutcome:
        """Allocate `key`'s extents in the `chosen` segments: a pending put from now on."""
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

    def _stored_again(self, slot: int, key: str, fingerprint: bytes, pin_until: float) -> bool:
        """A put (two-phase or leased) of a key that has a slot: True when a replica of it is
        on a mounted node (the put is a duplicate; a longer pin is kept), False when none is
        (restored, but none of its nodes came back: the caller deletes it and writes again).

        Raises:
            ObjectBusyError: a put of the key is in progress.
            IdentityMismatchError: the key is stored under another identity.
        """
        if self._state[slot] != COMPLETE:
            raise ObjectBusyError(f"a put of {key!r} is in progress; retry after it ends")
        if not any(r.segment_id in self._segments for r in self._replicas(slot)):
            return False
        stored = self._fingerprint[slot]
        if stored != fingerprint:
            raise IdentityMismatchError(
                f"{key!r} is already stored under another identity "
                f"({stored.hex() or 'none'}, not {fingerprint.hex() or 'none'})"
            )
        if pin_until > self._cold_get(slot, "pin_until_s"):
            self._cold_set(slot, "pin_until_s", pin_until)
            self._dirty[key] = True
        return True

    def _intern_fingerprint(self, fingerprint: bytes) -> bytes:
        """One bytes object per engine identity, shared by all its blocks (a cluster has a
        handful of identities and millions of blocks)."""
        known = self._fingerprints.get(fingerprint)
        if known is not None:
            return known
        if len(self._fingerprints) < 4096:
            self._fingerprints[fingerprint] = fingerprint
        return fingerprint

    def put_end(
        self, key: str, checksum: int, failed_segments: Iterable[int] = (), generation: int = 0
    ) -> ObjectMeta:
        """Seal a pending put with its checksum, dropping replicas the client failed to write.
        `generation` (nonzero) names the put: a PutEnd of an earlier put of the key (revoked,
        reclaimed or superseded meanwhile) must not seal a later one.

        The object moves to COMMITTING: still invisible, and no longer reclaimable as a
        zombie.  The caller persists the returned snapshot, then calls `commit_put_end` (or
        `put_revoke`).

        Raises:
            ObjectNotFoundError: no put of `key` is pending (revoked, timed out, never started).
            ReplicaUnavailableError: no replica survived; the put is revoked.
            InvalidValueError: the checksum is not a 64-bit unsigned value.
        """
        slot = self._pending_slot(key, generation)
        if self._pending[key] <= self._clock():  # the tick had not come round to it yet
            self._reclaim(slot)
            raise ObjectNotFoundError(
                f"the put of {key!r} outlived its deadline (put_timeout) and was reclaimed"
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

    def _reclaim(self, slot: int) -> None:
        """End a pending put that outlived its deadline (`put_timeout_s`): nothing visible,
        its extents freed (by `ObjectTable.tick`, or at its late PutEnd)."""
        self._delete(slot, 0.0)
        self.counters["puts_reclaimed"] += 1

    def _other_put(self, slot: int, generation: int) -> bool:
        """True when `generation` names a put other than the one in `slot` (0 names any: a
        PutEnd or revoke of an older client)."""
        return bool(generation) and self._gen[slot] != generation

    def _pending_slot(self, key: str, generation: int) -> int:
        """The slot of `key`'s pending put (of `generation`, when nonzero), or
        ObjectNotFoundError."""
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != PROCESSING:
            raise ObjectNotFoundError(
                f"no put of {key!r} is pending: it was revoked, timed out or never started"
            )
        if self._other_put(slot, generation):
            raise ObjectNotFoundError(
                f"the put of {key!r} this PutEnd names was revoked, timed out or replaced by its "
                "client's retry; a later put of the key is pending"
            )
        return slot

    def committed_as(self, key: str, checksum: int, generation: int = 0) -> tuple[int, int] | None:
        """(state, replica count) of `key` when its put (of `generation`, when nonzero) was
        sealed with `checksum` (COMMITTING or COMPLETE), else None: a repeated PutEnd whose
        first reply was lost finds it here; one of a put that ended meanwhile does not find
        another client's put of the same bytes."""
        slot = self._slot.get(key)
        if slot is None or self._state[slot] == PROCESSING or self._checksum[slot] != checksum:
            return None
        if self._other_put(slot, generation):
            return None
        return self._state[slot], len(self._replicas(slot))

    def puts_in_flight(self) -> int:
        """Puts started and not yet sealed (their PutEnd is still to come); unused allocation
        leases (leases.py) are not puts in flight."""
        return len(self._pending) - (
            leases_pending(cast("ObjectTable", self)) if self._lease_keys else 0
        )

    def commit_put_end(self, key: str) -> int:
        """Make a COMMITTING object visible (after it is durable); return its replica count.

        Raises:
            ReplicaUnavailableError: every replica's node died while it was being persisted.
        """
        slot = self._slot.get(key)
        if slot is None or self._state[slot] != COMMITTING:
            raise ReplicaUnavailableError(f"every replica of {key!r} was lost while committing")
        self._state[slot] = COMPLETE
        self._attempt.pop(slot, None)
        replicas = self._replicas(slot)
        self._unpend(slot, replicas)
        for r in replicas:
            self._cache(slot, r.segment_id)
        if len(replicas) < self._wanted[slot]:  # best effort now, more when nodes allow
            self.under_replicated.add(key)
        self.counters["puts_committed"] += 1
        return len(replicas)

    def put_revoke(self, key: str, generation: int = 0) -> None:
        """Abort a pending put and free its extents; `generation` (nonzero) names the put, as
        `put_end`'s does.

        Raises:
            ObjectNotFoundError: nothing pending under `key` (of that generation).
            ObjectBusyError: the object is already committed (use remove).
        """
        slot = self._slot.get(key)
        if slot is None:
            raise ObjectNotFoundError(f"no put of {key!r} is pending")
        if self._state[slot] == COMPLETE:
            raise ObjectBusyError(f"{key!r} is already committed; remove it instead of revoking")
        if self._other_put(slot, generation):
            raise ObjectNotFoundError(
                f"the put of {key!r} being revoked ended already; a later put of it is pending"
            )
        self._delete(slot, 0.0)
        self.counters["puts_revoked"] += 1

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

    def _unpend(self, slot: int, replicas: Iterable[Replica]) -> None:
        """These replicas of a pending put no longer count against their segment's share;
        the put no longer belongs to a connection."""
        replicas = tuple(replicas)
        extent = 0
        for r in replicas:
            seg = self._segments.get(r.segment_id)
            if seg is not None:
                extent = extent or seg.allocator.aligned(self._size[slot])
                seg.pending_bytes -= extent
        self.fences.dirty = True  # its write grants end: tell the nodes
        key = self._key[slot]
        if key in self._lease_keys:  # an unused allocation lease ends (leases.py)
            self._lease_keys.discard(key)  # type: ignore[arg-type]
            for r in replicas:
                seg = self._segments.get(r.segment_id)
                if seg is not None:
                    seg.leases -= 1
                    seg.leased_bytes -= extent
        owner = self._owner_of.pop(key, 0) if key is not None else 0
        if owner:
            keys = self._owned.get(owner)
            if keys is not None:
                keys.discard(key)  # type: ignore[arg-type]
                if not keys:
                    del self._owned[owner]
