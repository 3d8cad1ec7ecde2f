"""Allocation leases: pool space granted to a client ahead of its puts (pure rules, no I/O).

A steady put is then one master round trip (issue 14): the client copies the value into a
lease's extents it already holds, and one `BatchLeasedPut` names the key, seals and commits it,
and hands out the next lease.  Two-phase visibility is kept because a lease *is* a pending put
under a placeholder key nobody else can name (an unguessable random suffix): it holds its
extents, counts as pending space, ends with its owner's connection or after `put_timeout_s`,
and dies with its node, through the same rules as every pending put (puts.py).
Committing renames the pending put to the real key and seals it (`put_end`): the object is
invisible until its commit is durable, exactly as a two-phase put is.

Leases never cost anyone else space:

- A lease takes free room only, never an eviction (`put_start(lease_room=...)`), and unused
  leases hold at most `LEASE_SHARE` of a pool.  So filling a pool never evicts a block that a
  store without leases would keep, and a pool that is full and evicting grants no leases (its
  puts are two-phase until it has free room again).
- A plain put that finds no free room gives every unused lease back first (`release_all`), and
  the master service waits for the nodes to fence their write grants so that the put gets that
  room (service_puts.py `_put_starts`; likewise for the room of leases whose client closed);
  only then does it evict, or fail with NoSpaceError.  No lease is
  granted for `REFUSED_AFTER_RELEASE_S` after that, so the room goes to the put.
- Reports count unused leases on their own (`Segment.leases` / `leased_bytes`, `lease_usage`):
  never as objects, replicas, puts in flight or bytes used by objects.

And a lease that goes wrong costs the put a retry, never its outcome:

- A key already stored is deduplicated; the lease, written already, is given back (a write
  grant writes its bytes once: node/write_gate.py).
- A commit that fails for any other reason (the lease expired, the master restarted, the key is
  being written by someone else, the identity differs) releases the lease: nothing becomes
  visible, and the client puts the value again the two-phase way.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from mooncake_store.common.errors import (
    InvalidValueError,
    MooncakeError,
    NoSpaceError,
    ObjectConflictError,
    ObjectNotFoundError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.master.objects import ObjectMeta
from mooncake_store.master.placement import choose_segments

if TYPE_CHECKING:
    from mooncake_store.master.object_table import ObjectTable, PutStartOutcome
    from mooncake_store.master.segments import Segment

LEASE_PREFIX = "\x00lease\x00"
MAX_LEASES_PER_CALL = 64
LEASE_SHARE = 1 / 8  # of a pool, at most, held by unused leases (all clients together)
REFUSED_AFTER_RELEASE_S = 2.0  # after leases gave their room to a put, none for this long


def is_lease(key: str) -> bool:
    return key.startswith(LEASE_PREFIX)


def grant_leases(
    table: ObjectTable, size_bytes: int, replicas: int, count: int, owner: int
) -> list[tuple[str, PutStartOutcome]]:
    """Up to `count` leases of `size_bytes` on `replicas` nodes each, in free room only and
    within `LEASE_SHARE` of each pool (fewer, or none: a lease is never worth a NoSpaceError
    nor an eviction)."""

    def room(seg: Segment) -> bool:
        extent = seg.allocator.aligned(size_bytes)
        return seg.leased_bytes + extent <= seg.allocator.capacity_bytes * LEASE_SHARE

    out: list[tuple[str, PutStartOutcome]] = []
    if table._clock() < table._leases_refused_until:  # the pool is tight: its room is for puts
        return out
    for _ in range(max(0, min(count, MAX_LEASES_PER_CALL))):
        key = f"{LEASE_PREFIX}{owner:x}\x00{os.urandom(16).hex()}"
        try:
            outcome = table.put_start(key, size_bytes, replicas, owner=owner, lease_room=room)
        except MooncakeError:
            break
        table.counters["leases_granted"] = table.counters.get("leases_granted", 0) + 1
        out.append((key, outcome))
    return out


def lease_start(
    table: ObjectTable,
    key: str,
    size_bytes: int,
    wanted: int,
    fast: list[Segment],
    usable: list[Segment],
    extent: int,
    lease_room: Callable[[Segment], bool],
    owner: int,
) -> PutStartOutcome:
    """put_start of an allocation lease: free room in segments `lease_room` accepts, on
    as many nodes as a plain put would get (it takes free room first), or NoSpaceError.
    `usable`: the segments puts may go to, `fast` and those mounting (mounted a moment
    ago, not writable yet).  While one is mounting, no lease on fewer nodes than `wanted`
    and the nodes with room for it allow: a lease outlives that moment, and every put into
    it would be acknowledged short of replicas that a node is about to have room for
    (`leases_refused_mounting`)."""
    could = len(choose_segments(fast, extent, wanted))
    chosen = choose_segments([s for s in fast if lease_room(s)], extent, wanted)
    if not chosen or len(chosen) < could:
        raise NoSpaceError(f"no free room for a lease of {size_bytes} bytes")
    roomy: set[str] = set()  # the nodes a lease could have in a moment
    if len(fast) < len(usable):
        roomy = table.put_nodes(size_bytes, lease_room)[1]
    if len(chosen) < min(wanted, len(roomy)):
        table.counters["leases_refused_mounting"] += 1
        raise NoSpaceError(
            f"a lease would have {len(chosen)} of {wanted} replicas while nodes are mounting"
        )
    outcome = table._allocate(key, size_bytes, chosen, extent, table._clock(), wanted, owner)
    table._lease_keys.add(key)
    for seg in chosen:
        seg.leases += 1
        seg.leased_bytes += extent
    return outcome


def put_leased(
    table: ObjectTable,
    lease: str,
    key: str,
    size_bytes: int,
    checksum: int,
    *,
    failed_segments: tuple[int, ...] = (),
    replicas: int = 0,
    fingerprint: bytes = b"",
    parent_key: str = "",
    tag: bytes = b"",
    pin_ttl_s: float | None = None,
    soft_pin_ttl_s: float = 0.0,
) -> ObjectMeta | None:
    """Make lease `lease` the put of `key` and seal it with `checksum` (COMMITTING; the caller
    persists the snapshot and calls `commit_put_end`, as after `put_end`).  None: `key` is
    already stored (deduplicated; the lease, written already, is released).

    Raises (the lease is left as it is; the caller releases it):
        ObjectNotFoundError: no such lease (expired, revoked, or the master restarted), or
            one `short_now` (the client puts the value again the two-phase way).
        InvalidValueError: `size_bytes` is not the lease's size, or a bad checksum.
        ObjectBusyError / IdentityMismatchError: as put_start would raise them.
        ObjectConflictError: `key` is stored with another checksum (not a duplicate).
    """
    validate_key(key, stored=True)  # a tenant's keys arrive prefixed (master/access.py)
    if is_lease(key):
        raise InvalidValueError("keys starting with NUL 'lease' NUL are reserved")
    slot = table._slot.get(lease)
    if lease not in table._lease_keys or slot is None:
        raise ObjectNotFoundError("the lease is gone (expired, revoked or the master restarted)")
    if table._size[slot] != size_bytes:
        raise InvalidValueError(
            f"the lease holds {table._size[slot]} bytes, the value of {key!r} is {size_bytes}"
        )
    if not 0 <= checksum <= 0xFFFFFFFFFFFFFFFF:
        raise InvalidValueError(f"checksum {checksum} is not a 64-bit unsigned value")
    if len(fingerprint) > 0:
        fingerprint = table._intern_fingerprint(fingerprint)
    now = table._clock()
    pin_until = 0.0 if pin_ttl_s is None else (
        math.inf if pin_ttl_s <= 0 or math.isinf(pin_ttl_s) else now + pin_ttl_s
    )  # fmt: skip
    existing = table._slot.get(key)
    if existing is not None:
        if table._stored_again(existing, key, fingerprint, pin_until):
            if table._checksum[existing] != checksum:  # not a duplicate: the client puts it
                raise ObjectConflictError(  # the two-phase way, which reports the conflict
                    f"{key!r} is already stored with a different value"
                )  # (or heals a key whose stored replicas all fail their checksum)
            table.counters["puts_deduplicated"] += 1
            release_lease(table, lease)
            return None
        table._delete(existing, 0.0)  # restored, but none of its nodes came back
    wanted = replicas or table.config.default_replicas
    if short_now(table, lease, wanted):
        table.counters["leased_puts_short_refused"] += 1
        raise ObjectNotFoundError(
            f"the lease has {len(table._replicas(slot))} of the {wanted} replicas asked for, and "
            "more nodes take puts now: put the value the two-phase way"
        )
    _rename(table, slot, lease, key)
    if parent_key:
        validate_key(parent_key, stored=True)
        parent = table._slot.get(parent_key)
        table._parent[slot] = parent_key if parent is None else table._key[parent]  # type: ignore[assignment]
    table._fingerprint[slot] = fingerprint
    table._wanted[slot] = min(replicas or table.config.default_replicas, 255)
    table._created[slot] = now
    table._cold_set(slot, "tag", tag)
    table._cold_set(slot, "pin_until_s", pin_until)
    if soft_pin_ttl_s > 0:
        table._cold_set(slot, "soft_pin_until_s", now + soft_pin_ttl_s)
    table.counters["leased_puts"] = table.counters.get("leased_puts", 0) + 1
    return table.put_end(key, checksum, failed_segments)


def short_now(table: ObjectTable, lease: str, wanted: int) -> bool:
    """Whether lease `lease` has fewer replicas than `wanted` while a node that does not hold
    one of them could take the value now or once it took its first fence (the two-phase way
    waits for that: service_puts.py): the lease was granted while the cluster had fewer nodes
    with room (one mounted since, came back, or freed room), and a put into it would be
    acknowledged short of a replica for good."""
    slot = table._slot.get(lease)
    if slot is None:
        return False
    replicas = table._replicas(slot)
    if len(replicas) >= wanted:
        return False
    mine = {seg.node_id for r in replicas if (seg := table._offered.get(r.segment_id))}
    return bool(table.put_nodes(table._size[slot])[1] - mine)


def release_lease(table: ObjectTable, lease: str) -> bool:
    """Give a lease's space back (a no-op for a lease already gone); True if one was held."""
    if lease not in table._lease_keys:
        return False
    table.put_revoke(lease)
    return True


def release_all(table: ObjectTable) -> int:
    """Give back every unused lease (a put found no free room: leases must never cost one),
    and grant none for `REFUSED_AFTER_RELEASE_S` (the room freed is the put's, and a pool that
    tight would only take them back again)."""
    released = sum(release_lease(table, key) for key in list(table._lease_keys))
    table._leases_refused_until = table._clock() + REFUSED_AFTER_RELEASE_S
    table.counters["leases_released_for_room"] = (
        table.counters.get("leases_released_for_room", 0) + released
    )
    return released


def release_on(table: ObjectTable, segment_ids: Iterable[int]) -> int:
    """Give back the unused leases with a replica in `segment_ids` (their node began draining
    to stop: a client holding one would place its next put there, drain.py); how many."""
    segments = set(segment_ids)
    doomed = [
        key for key in table._lease_keys
        if any(r.segment_id in segments for r in table._replicas(table._slot[key]))
    ]  # fmt: skip
    return sum(release_lease(table, key) for key in doomed)


def leases_pending(table: ObjectTable) -> int:
    """Pending puts that are unused leases (not puts in flight: nobody will end them soon)."""
    return len(table._lease_keys)


def lease_usage(segments: Iterable[Segment]) -> tuple[int, int]:
    """(unused lease extents, their bytes) in `segments`, for reports."""
    count = size = 0
    for seg in segments:
        count += seg.leases
        size += seg.leased_bytes
    return count, size


def _rename(table: ObjectTable, slot: int, old: str, new: str) -> None:
    """Move a pending put from key `old` (a lease) to key `new` (same slot, extents and
    deadline): from now on it is a put in flight, no longer an unused lease."""
    extent = 0
    for r in table._replicas(slot):
        seg = table._segments.get(r.segment_id)
        if seg is not None:
            extent = extent or seg.allocator.aligned(table._size[slot])
            seg.leases -= 1
            seg.leased_bytes -= extent
    del table._slot[old]
    table._slot[new] = slot
    table._key[slot] = new
    table._lease_keys.discard(old)
    table._pending[new] = table._pending.pop(old)
    owner = table._owner_of.pop(old, 0)
    if owner:
        table._owner_of[new] = owner
        keys = table._owned.get(owner)
        if keys is not None:
            keys.discard(old)
            keys.add(new)
