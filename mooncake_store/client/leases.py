"""Allocation leases on the client side: the pool of leases a client holds, and their calls.

The master grants a client pool space ahead of its puts (master/leases.py).  A put whose value
fits a held lease (same size and replica count) copies the value into the lease's extents and
commits it with one `BatchLeasedPut`, which also asks for the next lease: one master round trip
per put on the steady path, single key or batch.  The first put of a size is two-phase, and its
PutEnd asks for the leases.  A lease that fails (expired, master restarted, key busy) costs the
put one more two-phase attempt, never its outcome.

Leases reserve pool space, so a client keeps few: per (size, replicas) class at most what its
last batch used, and at most `MAX_LEASED_BYTES` per class; it uses a lease only within its first
half-life (the rest is margin for the copy and the commit), and gives back the ones past it
with its next leased put.  The master grants leases from free room only and takes them back
when a put needs the room (master/leases.py): a class it granted fewer than asked is not asked
for more for `REFUSED_FOR_S`.  Leases are on by default (`Client(leases=False)` opts out); the
master ends a client's unused leases when its connection closes.  A client on a node's host
copies into its lease through shared memory, which the node's gate does not see: it copies
only while the write fence the node shows in shared memory admits the lease's generation
(common/shm_fence.py), so a lease the master has taken back is written over TCP instead, where
the node refuses it, and the put is retried two-phase.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.client.master_calls import PutEndTuple, put_end_items
from mooncake_store.client.master_client import MasterCall, _location, status_error
from mooncake_store.client.types import PutSpec, ReplicaLocation
from mooncake_store.common.errors import MooncakeError

MAX_LEASES_PER_CLASS = 64
MAX_LEASED_BYTES = 64 << 20  # per class: leases hold pool space nobody else can use
MAX_CLASSES = 8
REFUSED_FOR_S = 1.0  # a class the master granted fewer leases than asked: not asked meanwhile


@dataclass(frozen=True, slots=True)
class Lease:
    lease_id: str
    size_bytes: int
    replicas: int  # as the put asks (0: the master's default)
    locations: list[ReplicaLocation]
    usable_until: float  # time.monotonic()


@dataclass(frozen=True, slots=True)
class LeasedOutcome:
    error: MooncakeError | None
    replicas: int
    already_exists: bool


class LeasePool:
    """The leases one client holds, by (size, replicas); safe to share between threads."""

    def __init__(self) -> None:
        self._held: dict[tuple[int, int], list[Lease]] = {}
        # A class the master granted fewer leases than asked (no free room, or the leases'
        # share of the pools is used up): batches of more than that go two-phase without
        # asking again, until the time given (time.monotonic()).
        self._granted_at_most: dict[tuple[int, int], tuple[int, float]] = {}
        self._stale: list[str] = []  # leases past their use, to give back
        self._lock = threading.Lock()

    def take(self, specs: Sequence[PutSpec]) -> list[Lease] | None:
        """A lease for every spec, or None (then none is taken)."""
        now = time.monotonic()
        need: dict[tuple[int, int], int] = {}
        for spec in specs:
            cls = (spec.size_bytes, spec.replicas)
            need[cls] = need.get(cls, 0) + 1
        with self._lock:
            for cls, n in need.items():
                held = self._held.get(cls)
                if held:
                    self._stale += [x.lease_id for x in held if x.usable_until <= now]
                    held[:] = [lease for lease in held if lease.usable_until > now]
                if not held or len(held) < n:
                    return None
            return [self._held[(s.size_bytes, s.replicas)].pop() for s in specs]

    def wanted(self, specs: Sequence[PutSpec]) -> list[pb.LeaseRequest]:
        """What to ask for to serve the next batch like `specs` from leases."""
        counts: dict[tuple[int, int], int] = {}
        for spec in specs:
            cls = (spec.size_bytes, spec.replicas)
            counts[cls] = counts.get(cls, 0) + 1
        out = []
        with self._lock:
            if len(self._held) > MAX_CLASSES:  # sizes come and go: forget the empty classes
                for cls in [c for c, held in self._held.items() if not held]:
                    del self._held[cls]
            now = time.monotonic()
            for (size, replicas), n in counts.items():
                have = len(self._held.get((size, replicas), ()))
                at_most, until = self._granted_at_most.get((size, replicas), (n, 0.0))
                if n > at_most and now < until:
                    continue
                want = max(min(n, self._cap((size, replicas))) - have, 0)
                if want and (len(self._held) < MAX_CLASSES or (size, replicas) in self._held):
                    out.append(pb.LeaseRequest(size_bytes=size, replicas=replicas, count=want))
        return out

    def add(self, leases: Sequence[pb.Lease], asked: Sequence[pb.LeaseRequest] = ()) -> None:
        now = time.monotonic()
        with self._lock:
            for want in asked:
                cls = (want.size_bytes, want.replicas)
                got = sum(1 for x in leases if (x.size_bytes, x.wanted_replicas) == cls)
                if got < want.count:
                    limit = got + len(self._held.get(cls, ()))
                    self._granted_at_most[cls] = (limit, now + REFUSED_FOR_S)
            for lease in leases:
                held = self._held.setdefault((lease.size_bytes, lease.wanted_replicas), [])
                held.append(Lease(
                    lease.lease_id, lease.size_bytes, lease.wanted_replicas,
                    [_location(r) for r in lease.replicas],
                    now + max(0.0, lease.expires_in_s) / 2,
                ))  # fmt: skip

    def stale(self) -> list[str]:
        """Leases found past their use since the last call (drained): to give back."""
        with self._lock:
            out, self._stale = self._stale, []
        return out

    def drain(self) -> list[str]:
        """Every held lease id (to give back as the client closes)."""
        with self._lock:
            ids = [lease.lease_id for held in self._held.values() for lease in held]
            self._held.clear()
            ids += self._stale
            self._stale = []
        return ids

    @staticmethod
    def _cap(cls: tuple[int, int]) -> int:
        return max(1, min(MAX_LEASES_PER_CLASS, MAX_LEASED_BYTES // max(1, cls[0])))


def leased_put_call(
    items: Sequence[tuple[PutSpec, Lease, int, Sequence[int]]],
    next_leases: Sequence[pb.LeaseRequest],
    release: Sequence[str] = (),
) -> MasterCall[tuple[list[LeasedOutcome], list[pb.Lease]]]:
    """Commit values written into leases: (spec, lease, checksum, failed segments) each."""
    request = pb.BatchLeasedPutRequest(
        items=[
            pb.LeasedPutItem(
                spec=pb.PutStartItem(
                    key=s.key, size_bytes=s.size_bytes, replicas=s.replicas,
                    fingerprint=s.fingerprint, parent_key=s.parent_key, tag=s.tag, pin=s.pin,
                    pin_ttl_s=s.pin_ttl_s, soft_pin_ttl_s=s.soft_pin_ttl_s,
                ),
                lease_id=lease.lease_id, checksum=checksum, failed_segments=list(failed),
            )
            for s, lease, checksum, failed in items
        ],
        next=list(next_leases),
        release=list(release),
    )  # fmt: skip

    def parse(
        reply: pb.BatchLeasedPutResponse,
    ) -> tuple[list[LeasedOutcome], list[pb.Lease]]:
        outcomes = [
            LeasedOutcome(status_error(r.status), r.replicas, r.already_exists)
            for r in reply.results
        ]
        return outcomes, list(reply.leases)

    # Idempotent: a repeat of a commit that went through finds the key committed with the same
    # checksum and its lease used, and answers success again.
    return MasterCall(
        "BatchLeasedPut", request, parse, idempotent=True, batch="items", merge=_join_pairs,
        slice_failed=lambda error, n: ([LeasedOutcome(error, 0, False)] * n, []),
    )  # fmt: skip


def put_end_leases_call(
    items: Sequence[PutEndTuple], next_leases: Sequence[pb.LeaseRequest]
) -> MasterCall[tuple[list[int | MooncakeError], list[pb.Lease]]]:
    """BatchPutEnd that also asks for leases for the next puts."""
    request = pb.BatchPutEndRequest(items=put_end_items(items), next=list(next_leases))

    def parse(reply: pb.BatchPutEndResponse) -> tuple[list[int | MooncakeError], list[pb.Lease]]:
        return [status_error(r.status) or r.replicas for r in reply.results], list(reply.leases)

    return MasterCall(
        "BatchPutEnd", request, parse, idempotent=True, batch="items", merge=_join_pairs,
        slice_failed=lambda error, n: ([error] * n, []),
    )  # fmt: skip


def _join_pairs(replies: list[tuple[list[Any], list[pb.Lease]]]) -> Any:
    """The (outcomes, leases) replies of a batch's slices as one (see MasterCall.slices)."""
    return (
        [outcome for outcomes, _ in replies for outcome in outcomes],
        [lease for _, leases in replies for lease in leases],
    )
