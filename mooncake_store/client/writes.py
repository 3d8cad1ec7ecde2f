"""The write side of the client's operations, as flows (see `steps`): put and put_many.

A put is two-phase: one BatchPutStart for the whole batch (the master allocates replicas on
distinct nodes), the bytes go straight to the nodes (shared memory on this host, TCP otherwise),
then one BatchPutEnd commits them with their checksums (docs/CHECKSUM.md).  A put whose every
replica failed is revoked, so a half-written object is never visible.

A value may be given as parts (`put_many_from_parts`, Mooncake's multi-buffer puts): the parts
are stored as one object, their concatenation, copied from each caller buffer straight into
the pool or sent one after the other on the TCP data path, with no staging buffer.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.client.device import device_bytes, is_device_buffer, to_host
from mooncake_store.client.leases import (
    LeasedOutcome,
    LeasePool,
    leased_put_call,
    put_end_leases_call,
)
from mooncake_store.client.master_client import (
    put_end_call,
    put_revoke_call,
)
from mooncake_store.client.put_attempts import PutAttempts, unanswered
from mooncake_store.client.put_items import (
    PendingPut,
    check_conflicts,
    heal_conflicts,
    start_puts,
)
from mooncake_store.client.shm import CopyStopped, Guard
from mooncake_store.client.speculative import LocationMemory
from mooncake_store.client.steps import (
    Flow,
    MapPools,
    Transfer,
    Transfers,
    as_readable,
    copy_parts_into,
    parts_checksum,
    split_like,
)
from mooncake_store.client.transport import Hasher
from mooncake_store.client.types import PutPlan, PutResult, PutSpec, ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES
from mooncake_store.common.errors import (
    DataPathError,
    InvalidArgumentError,
    InvalidValueError,
    MooncakeError,
    ObjectBusyError,
    ObjectConflictError,
    ObjectNotFoundError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.common.wire import Op

log = logging.getLogger("mooncake.client")


class WriteFlows(LocationMemory):
    """Write operations (a mixin of ClientFlows, flows.py: the state is its)."""

    replicas: int | None
    max_value_bytes: int
    counters: dict[str, int]
    _leases: LeasePool | None
    _attempts: PutAttempts

    def put_flow(
        self,
        key: str,
        value: object,
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parent: str | None = None,
        tag: bytes = b"",
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> Flow[PutResult]:
        results = yield from self.put_many_flow(
            [(key, value)], replicas=replicas, fingerprint=fingerprint,
            parents=None if parent is None else [parent], tags=[tag], pin=pin,
            pin_ttl_s=pin_ttl_s,
        )  # fmt: skip
        return results[0]

    def put_many_flow(
        self,
        items: Mapping[str, object] | Iterable[tuple[str, object]],
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parents: Sequence[str | None] | None = None,
        tags: Sequence[bytes] | None = None,
        pin: bool = False,
        pin_ttl_s: float = 0.0,
        soft_pin_ttl_s: float = 0.0,
        preferred_nodes: Sequence[str] = (),
        parts: bool = False,
        outcomes: bool = False,
    ) -> Flow[list[PutResult]]:
        """The put of `items`; with `parts`, each value is a sequence of buffers stored as one
        object.  With `outcomes`, a failed item's entry is its MooncakeError instead of the
        first failure being raised (the result then holds PutResult | MooncakeError)."""
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        for name, extra in (("parents", parents), ("tags", tags)):
            if extra is not None and len(extra) != len(pairs):
                raise InvalidArgumentError(f"{len(pairs)} items but {len(extra)} {name}")
        wanted = self._replicas(replicas)
        pending: list[PendingPut] = []
        seen: set[str] = set()
        for i, (key, value) in enumerate(pairs):
            validate_key(key)
            if key in seen:  # a repeated key in one batch names the same content: write it once
                continue
            seen.add(key)
            values = list(value) if parts else [value]  # type: ignore[call-overload]
            if not values:
                raise InvalidValueError(f"value of {key!r} has no parts; give at least one")
            device = device_bytes(value) if not parts and is_device_buffer(value) else None
            if device is not None:  # moved by DMA where the pool is on this host
                views, size = [], int(device.nbytes)
            else:
                views = [as_readable(to_host(v) if is_device_buffer(v) else v) for v in values]
                size = sum(len(v) for v in views)
            if size == 0:
                raise InvalidValueError(f"value of {key!r} is empty; store at least 1 byte")
            if size > self.max_value_bytes:
                raise InvalidValueError(
                    f"value of {key!r} is {size} bytes, over max_value_bytes "
                    f"({self.max_value_bytes}); split it into blocks"
                )
            spec = PutSpec(
                key, size, wanted, bytes(fingerprint),
                (parents[i] or "") if parents is not None else "",
                bytes(tags[i]) if tags is not None else b"", pin, pin_ttl_s,
                soft_pin_ttl_s, tuple(preferred_nodes),
            )  # fmt: skip
            pending.append(PendingPut(key, [v for v in views if len(v)], spec, device=device))
        if not pending:
            return []
        committed: dict[str, int] = {}
        leasing = self._leases is not None and not preferred_nodes
        two_phase = (yield from self._put_leased(pending, committed)) if leasing else pending
        if two_phase:
            yield from self._put_two_phase(two_phase, committed, leasing)
        self._remember_puts(pending, committed)
        failed = {p.key: p.error for p in pending if p.error is not None}
        if failed and not outcomes:
            raise next(iter(failed.values()))
        first = {p.key: p.plan is not None and p.plan.already_exists for p in pending}
        results: list = []
        for key, _ in pairs:
            if key in failed:
                results.append(failed[key])
            elif key in first:
                results.append(PutResult(key, committed.get(key, 0), first.pop(key)))
            else:  # a repeat within the batch
                results.append(PutResult(key, 0, True))
        return results

    def _remember_puts(self, pending: list[PendingPut], committed: dict[str, int]) -> None:
        """Remember where the committed puts landed in same-host pools (client/speculative.py:
        a write grant names its put's generation, a leased one its lease's, the object's)."""
        for p in pending:
            if p.key not in committed or p.plan is None or p.plan.already_exists:
                continue
            failed = p.failed or ()
            for loc in p.plan.replicas:
                if loc.segment_id not in failed and self._remember(
                    p.key, loc, p.spec.size_bytes, p.checksum
                ):
                    break

    def _put_two_phase(
        self, pending: list[PendingPut], committed: dict[str, int], leasing: bool
    ) -> Flow[None]:
        """PutStart, copy, PutEnd; once more, from a new PutStart, for the puts whose every
        replica the data path refused or failed (a node mounted again or fenced meanwhile ends
        the write grants it had: the master revoked them or places the put anew), and for
        those whose PutEnd found no put pending (reclaimed past --put-timeout, or started on a
        master run that ended: one whose first PutEnd committed before the restart, its reply
        lost, is found stored by the new PutStart)."""
        failed = yield from self._two_phase_round(pending, committed, leasing)
        again = [p for p in failed if p.retryable]
        if not again:
            return
        self.counters["put_retries"] += len(again)
        log.info("putting %d objects again: %s", len(again), again[0].error)
        first = [p.error for p in again]
        for p in again:
            p.plan, p.failed, p.error, p.checksum, p.retryable = None, None, None, 0, False
        yield from self._two_phase_round(again, committed, leasing)
        for p, error in zip(again, first, strict=True):
            if isinstance(p.error, ObjectBusyError):  # the first round's revoke did not land:
                p.error = error  # why the put failed is the data path's error

    def _two_phase_round(
        self, pending: list[PendingPut], committed: dict[str, int], leasing: bool
    ) -> Flow[list[PendingPut]]:
        """PutStart, copy, PutEnd (which asks for leases for the next puts of these sizes).
        Returns the puts revoked because no replica could be written, and those whose PutEnd
        found no put pending."""
        yield from start_puts(pending, self._attempts)
        check_conflicts(pending, self.counters)
        conflicted = [p for p in pending if isinstance(p.error, ObjectConflictError)]
        if conflicted:
            yield from heal_conflicts(conflicted, self.counters, self._attempts)
        to_write = [p for p in pending if p.plan is not None and not p.plan.already_exists]
        try:
            # Replicas in pools already mapped on this host are plain copies: no task each.
            remote = [p for p in to_write if not self._write_local(p)]
            if remote:
                yield from self._write_remote(remote)
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled or broken mid-write: leave nothing pending behind (best effort; the
            # master also reclaims puts that never end).
            if to_write:
                yield from self._revoke(to_write)
            raise
        to_end = [p for p in to_write if p.landed()]
        to_revoke = [p for p in to_write if not p.landed()]
        not_pending: list[PendingPut] = []
        if to_end:
            items = [(p.key, p.checksum, p.failed or (), p.generation) for p in to_end]
            wanted = self._leases.wanted([p.spec for p in to_end]) if self._leases else []
            try:
                if leasing and wanted:
                    ends, granted = yield put_end_leases_call(items, wanted)
                    self._leases.add(granted, wanted)  # type: ignore[union-attr]
                else:
                    ends = yield put_end_call(items)
            except BaseException as exc:
                if unanswered(exc):
                    for p in to_end:
                        self._attempts.lost(p.key, p.attempt)
                raise
            for p, end in zip(to_end, ends, strict=True):
                if isinstance(end, MooncakeError):
                    p.error = end
                    if unanswered(end):
                        self._attempts.lost(p.key, p.attempt)
                    if isinstance(end, ObjectNotFoundError):  # nothing pending: put it again
                        p.retryable = True
                        not_pending.append(p)
                else:
                    committed[p.key] = end
        if to_revoke:
            yield from self._revoke(to_revoke)
            for p in to_revoke:
                p.error = p.error or DataPathError(f"no replica of {p.key!r} could be written")
        return to_revoke + not_pending

    def _put_leased(
        self, pending: list[PendingPut], committed: dict[str, int]
    ) -> Flow[list[PendingPut]]:
        """Put `pending` into held leases with one master call (client/leases.py); returns the
        items that must go the two-phase way (no lease held, or their lease failed)."""
        assert self._leases is not None
        leases = self._leases.take([p.spec for p in pending])
        if leases is None:
            return pending
        # Probe the leases' nodes first (once per pool): a node on another host is not mapped
        # and its lease is written over TCP, which the node checks.
        yield MapPools([loc for lease in leases for loc in lease.locations])
        for p, lease in zip(pending, leases, strict=True):
            p.plan = PutPlan(False, lease.locations)
            p.leased = True
        try:
            remote = [p for p in pending if not self._write_local(p)]
            if remote:
                yield from self._write_remote(remote)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._give_back([lease.lease_id for lease in leases])
            raise
        landed = [(p, lease) for p, lease in zip(pending, leases, strict=True) if p.landed()]
        unused = [lease.lease_id for p, lease in zip(pending, leases, strict=True)
                  if not p.landed()]  # fmt: skip
        unused += self._leases.stale()  # past their use: their room is free at once
        outcomes: list[LeasedOutcome] = []
        granted: list[pb.Lease] = []
        if landed or unused:
            wanted = self._leases.wanted([p.spec for p in pending])
            call = leased_put_call(
                [(p.spec, lease, p.checksum, p.failed or ()) for p, lease in landed],
                wanted, unused,
            )  # fmt: skip
            outcomes, granted = yield call
            self._leases.add(granted, wanted)
        redo = [p for p in pending if not p.landed()]
        for (p, _lease), outcome in zip(landed, outcomes, strict=True):
            if outcome.error is not None:  # the lease failed: nothing visible, put it again
                redo.append(p)
            elif outcome.already_exists:  # the master gave the lease back: it was written
                p.plan = PutPlan(True, [])
            else:
                committed[p.key] = outcome.replicas
                self.counters["leased_puts"] = self.counters.get("leased_puts", 0) + 1
        for p in redo:
            p.plan, p.failed, p.error, p.checksum, p.leased = None, None, None, 0, False
            p.retryable = False
        return redo

    def _copy_guard(self, loc: ReplicaLocation, *, leased: bool) -> Guard | None:
        """ShmMapper.copy_guard, counting the copies refused."""
        guard = self.shm.copy_guard(loc, leased=leased)
        if guard is None:
            self._count("copies_refused")
        return guard

    def _count(self, name: str) -> None:
        self.counters[name] = self.counters.get(name, 0) + 1

    def _give_back(self, lease_ids: list[str]) -> Flow[None]:
        """Release leases after a failed copy, best effort (the master reclaims them anyway)."""
        try:
            yield leased_put_call([], [], lease_ids)
        except MooncakeError as exc:
            log.info("could not release %d leases (the master reclaims them): %s",
                     len(lease_ids), exc)  # fmt: skip

    def _revoke(self, failed: list[PendingPut]) -> Flow[None]:
        """Revoke puts that failed, best effort: a revoke that cannot reach the master does
        not hide why the put failed (the master reclaims a put that never ends anyway, and
        this client's next put of the key revokes it: put_attempts.py)."""
        try:
            outcomes = yield put_revoke_call(
                [p.key for p in failed], [p.generation for p in failed]
            )
        except BaseException as exc:
            for p in failed:
                self._attempts.lost(p.key, p.attempt)
            if not isinstance(exc, MooncakeError):
                raise
            log.info("could not revoke %d failed puts (the master reclaims them): %s",
                     len(failed), exc)  # fmt: skip
            return
        for p, outcome in zip(failed, outcomes, strict=True):
            if outcome is not None and unanswered(outcome):  # a slice got no reply
                self._attempts.lost(p.key, p.attempt)

    def _write_remote(self, pending: list[PendingPut]) -> Flow[None]:
        """Write every replica of `pending`: same-host pools by copy, the rest over TCP."""
        yield MapPools([loc for p in pending for loc in p.plan.replicas])  # type: ignore[union-attr]
        remote: list[tuple[PendingPut, ReplicaLocation]] = []
        unhashed: list[PendingPut] = []
        for p in pending:
            assert p.plan is not None
            p.failed = []
            if p.device is not None and self._write_local(p):
                continue  # device -> pool by DMA
            p.host_parts()
            hashed = False
            for loc in p.plan.replicas:
                pool = self._mapped(loc)
                guard = None if pool is None else self._copy_guard(loc, leased=p.leased)
                if pool is None or guard is None:
                    remote.append((p, loc))  # not here, or a grant that ended
                    continue
                try:
                    self._copy_into(p, loc, pool, hash_it=not hashed, guard=guard)
                except CopyStopped:
                    self._count("copies_stopped")
                    remote.append((p, loc))  # ended mid-copy: the node refuses it over TCP
                    continue
                hashed = True
            if not hashed:
                unhashed.append(p)
        if remote:
            # A value no same-host copy hashed is hashed by its first TCP write, piece by
            # piece as it goes out (see Transfer).
            hashers: dict[int, Hasher] = {id(p): Hasher() for p in unhashed}
            writes = [
                Transfer(Op.WRITE, loc, p.payload, hashers.pop(id(p), None)) for p, loc in remote
            ]
            results = yield Transfers(writes)
            for (p, loc), write, err in zip(remote, writes, results, strict=True):
                if write.hasher is not None:  # complete only if every byte went out
                    p.checksum = (
                        write.hasher.intdigest() if err is None else parts_checksum(p.parts)
                    )
                if err is None:
                    self.counters["tcp_writes"] += 1
                    continue
                assert p.failed is not None
                p.failed.append(loc.segment_id)
                p.retryable = (p.retryable or not p.error) and isinstance(
                    err, (DataPathError, OSError)
                )  # every replica refused by its node or not reached: worth a new put
                p.error = p.error or DataPathError(
                    f"writing {p.key!r} to node {loc.node_id} failed: {err}"
                )
        for p in pending:
            if p.landed():
                p.error = None  # at least one replica landed: the put succeeds

    def _write_local(self, p: PendingPut) -> bool:
        """Write every replica by plain copies when all are in mapped same-host pools."""
        assert p.plan is not None
        pools = [self._mapped(loc) for loc in p.plan.replicas]
        if any(pool is None for pool in pools):
            return False
        guards = [self._copy_guard(loc, leased=p.leased) for loc in p.plan.replicas]
        if any(guard is None for guard in guards):
            return False  # over TCP, where the node refuses a grant that ended
        if p.device is not None and not p.parts:
            self._dma_into(p, pools)  # type: ignore[arg-type]
            p.failed = []
            return True
        try:
            for i, (loc, pool, guard) in enumerate(
                zip(p.plan.replicas, pools, guards, strict=True)
            ):
                assert pool is not None
                self._copy_into(p, loc, pool, hash_it=i == 0, guard=guard)
        except CopyStopped:
            self._count("copies_stopped")
            return False  # likewise: what it copied lands in room nobody else has yet
        p.failed = []
        return True

    def _dma_into(self, p: PendingPut, pools: list[memoryview]) -> None:
        """A device value: one DMA device -> the first replica's pool (registered with CUDA),
        hashed as its pieces land; further same-host replicas are copies of that pool extent."""
        from mooncake_store.client.cuda import cuda_path

        assert p.plan is not None
        first = p.plan.replicas[0]
        p.checksum = cuda_path().write_pool(p.device, first.segment_id, pools[0], first.offset)
        n = p.spec.size_bytes
        landed = pools[0][first.offset : first.offset + n]
        for loc, pool in zip(p.plan.replicas[1:], pools[1:], strict=True):
            pool[loc.offset : loc.offset + n] = landed
        self.counters["shm_writes"] += len(p.plan.replicas)

    def _copy_into(
        self,
        p: PendingPut,
        loc: ReplicaLocation,
        pool: memoryview,
        *,
        hash_it: bool,
        guard: Guard | None = None,
    ) -> None:
        """Copy the value (its parts one after the other) into a same-host replica; the first
        copy also yields the checksum.  `guard` runs before every 1 MiB (CopyStopped)."""
        region = pool[loc.offset : loc.offset + p.spec.size_bytes]
        if hash_it:
            p.checksum = copy_parts_into(region, p.parts, guard)
        else:
            for dest, part in zip(split_like(region, p.parts), p.parts, strict=True):
                for at in range(0, len(part), CHUNK_BYTES):
                    if guard is not None:
                        guard()
                    dest[at : at + CHUNK_BYTES] = part[at : at + CHUNK_BYTES]
        self.counters["shm_writes"] += 1

    def _replicas(self, replicas: int | None) -> int:
        wanted = replicas if replicas is not None else self.replicas
        if wanted is None:
            return 0
        if wanted < 1:
            raise InvalidArgumentError(f"replicas must be >= 1, got {wanted}")
        return wanted
