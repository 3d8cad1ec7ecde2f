"""The master service's put methods: PutStart, PutEnd (commits made durable, then visible),
allocation leases (BatchLeasedPut, `leases.py`) and PutRevoke.

`PutMethods` is a base of `MasterServicer` (service.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.errors import (
    InvalidArgumentError,
    MooncakeError,
    NoSpaceError,
    ObjectNotFoundError,
)
from mooncake_store.common.grant import GrantMode, grant_generation
from mooncake_store.master.batches import capped, each, pause_every
from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.leases import put_leased, release_all, release_lease
from mooncake_store.master.object_table import PutStartOutcome
from mooncake_store.master.objects import ObjectMeta
from mooncake_store.master.service_base import _OK, _location, _status
from mooncake_store.master.service_leases import LeaseMethods

log = logging.getLogger("mooncake.master")

FENCE_WAIT_S = 3.0  # a put waits this long at most for the room a write fence frees
FENCE_WAITS_OFF_S = 10.0  # after a fence not taken in time, puts do not wait for this long
NODES_BACK_WAIT_S = 1.5  # after a restart, a put waits this long at most for a node to mount


class PutMethods(LeaseMethods):
    """The put methods (see the module docstring)."""

    # ---- puts --------------------------------------------------------------------------------

    def _put_start(
        self,
        item: pb.PutStartItem,
        owner: int = 0,
        outcome: PutStartOutcome | None = None,
        evict: bool = True,
    ) -> pb.PutStartResult:
        try:
            if outcome is None:
                outcome = self._put_start_once(item, owner, evict)
        except MooncakeError as exc:
            return pb.PutStartResult(status=_status(exc))
        if outcome.already_exists:  # with the stored checksum: a different value is a conflict
            meta = self.table.get(item.key)
            if meta is None:
                return pb.PutStartResult(status=_OK, already_exists=True)
            return pb.PutStartResult(
                status=_OK,
                already_exists=True,
                existing_checksum=meta.checksum,
                has_existing_checksum=True,
            )
        return pb.PutStartResult(
            status=_OK,
            replicas=[
                _location(
                    seg,
                    r,
                    item.size_bytes,
                    outcome.deadline_s,
                    GrantMode.WRITE,
                    outcome.generation,
                )
                for seg, r in outcome.placements
            ],
        )

    async def _put_starts(
        self, items: list[pb.PutStartItem], owner: int, context: object = None
    ) -> list[pb.PutStartResult]:
        """put_start of each item.  Room that is about to be free goes to puts before any block
        is evicted: unused allocation leases (leases.py) and the extents of puts that ended
        without a commit, which wait for the nodes' next write fence (fences.py).  While there
        is some, a put takes free room only; one that finds none gives every lease back and,
        once the nodes took a fence (that room is free then), starts again the usual way
        (evicting, or NoSpaceError).  Puts that arrive while a node mounted again a moment ago
        holds its room back (membership.py `REMOUNT_HOLD_S`) wait for it first; one that found
        no room while a node mounted a moment ago has not taken this run's first write fence
        (membership.py `awaiting_first_fence`, normally for milliseconds: server.py
        `_first_fences`) goes elsewhere if it prefers none, but evicts nothing before that
        fence is in: one that finds no free room has it pushed (or waits for the push in
        flight) and tries again; one that prefers such a node waits for it first, and so does
        one that would get fewer replicas without it (`short_while_mounting`: it would be
        acknowledged short for good), unless a push of that fence went untaken already
        (a stalled node costs the puts during its first push, FIRST_FENCE_TIMEOUT_S at most,
        and no more: later puts go on short).  Right after
        a restart, before any node mounted again, a put waits for one (`_wait_for_nodes_back`)."""
        await self._wait_for_nodes_back(context)
        await self._retried_after_commit(items)
        await self._sit_out_remount_hold()
        evict = True
        if self.first_fences is not None and self.table.awaiting_nodes():
            evict = False
            preferred = {n for i in items for n in i.preferred_nodes}
            mine = self.table.awaiting_nodes(preferred) if preferred else set()
            if mine:
                await self.first_fences(mine, True)
            elif any(
                self.table.short_while_mounting(
                    i.replicas or self.config.default_replicas, i.size_bytes
                )
                for i in items
            ):  # a replica it would never get: wait, unless that node let a push go untaken
                if await self.first_fences(self.table.awaiting_nodes(), True, fresh_only=True):
                    self.table.counters["puts_waited_for_mounting"] += 1
        results = await self._put_starts_now(items, owner, evict)
        held = [n for n, r in enumerate(results) if r.status.code == NoSpaceError.code]
        if not held:
            return results
        hold = self.table.remount_hold_s() > 0  # a node mounted again meanwhile
        awaiting = self.table.awaiting_nodes()  # its first fence not taken (yet)
        if hold or awaiting or not evict:
            await self._sit_out_remount_hold()
            if awaiting and self.first_fences is not None:
                await self.first_fences(awaiting, True)
            for n in held:
                results[n] = self._put_start(items[n], owner)
        return results

    async def _wait_for_nodes_back(self, context: object = None) -> None:
        """A master that restarted has no node mounted until they notice (a heartbeat or two):
        a put waits for the first one rather than failing with "no store node is mounted"
        (membership.py `nodes_expected`): NODES_BACK_WAIT_S at most, and never past a gRPC
        caller's deadline (a caller gone before the put starts would leave it pending.  A
        framed call names no deadline, so a framed client with a call timeout under
        NODES_BACK_WAIT_S can meet that; its retry names the lost try's attempt and takes its
        place: puts.py `put_start`)."""
        if not self.table.nodes_expected():
            return
        limit = NODES_BACK_WAIT_S
        remaining = getattr(context, "time_remaining", None)
        left = remaining() if callable(remaining) else None
        if left is not None:
            limit = min(limit, max(0.0, left - 0.25))
        deadline = time.monotonic() + limit
        while self.table.nodes_expected() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _retried_after_commit(self, items: list[pb.PutStartItem]) -> None:
        """A put retried after its PutEnd got no reply (its `attempt` is the key's pending
        put's) finds that put stored, not busy, once its commit ends: wait for it.  (A retry
        of one not sealed yet revokes it: puts.py `put_start`.)"""
        for item in items:
            if item.attempt and self.table.pending_attempt(item.key) == item.attempt:
                committing = self._committing.get(item.key)
                if committing is not None:
                    await asyncio.shield(committing)

    async def _sit_out_remount_hold(self) -> None:
        """Wait until no segment holds its room back (a timer may fire a little early)."""
        for _ in range(100):
            hold = self.table.remount_hold_s()
            if hold <= 0:
                return
            await asyncio.sleep(hold + 0.002)

    async def _put_starts_now(
        self, items: list[pb.PutStartItem], owner: int, evict: bool = True
    ) -> list[pb.PutStartResult]:
        if not self._room_coming():
            return await each(items, lambda i: self._put_start(i, owner, evict=evict))
        waiting: list[int] = []

        def start(n: int, item: pb.PutStartItem) -> pb.PutStartResult:
            try:
                outcome = self._put_start_once(item, owner, evict=False)
            except NoSpaceError:
                release_all(self.table)
                waiting.append(n)
                return pb.PutStartResult()  # replaced below
            except MooncakeError as exc:
                return pb.PutStartResult(status=_status(exc))
            return self._put_start(item, owner, outcome)

        results = await each(list(enumerate(items)), lambda pair: start(*pair))
        if waiting:
            await self._wait_for_fence()
            for n in waiting:
                results[n] = self._put_start(items[n], owner, evict=evict)
        return results

    def _room_coming(self) -> bool:
        """Unused leases, or frees waiting for a write fence in segments offered to puts (and
        the nodes answered the last fence a put waited for in time)."""
        if self.fence_now is None or time.monotonic() < self._fence_waits_off_until:
            return False
        return bool(self.table._lease_keys) or self.table.room_after_fence() > 0

    async def _wait_for_fence(self) -> None:
        """Wait (a moment at most) for the nodes to take a write fence: the extents of released
        leases and of puts that ended uncommitted are free from then on (master/fences.py).
        When they do not answer in time, puts stop waiting for a while and evict instead."""
        if self.fence_now is None:
            return
        try:
            await asyncio.wait_for(self.fence_now(), timeout=FENCE_WAIT_S)
        except Exception as exc:  # a node slow to answer: the put evicts instead
            self._fence_waits_off_until = time.monotonic() + FENCE_WAITS_OFF_S
            log.warning("write fences not taken in %.0fs (%r): puts evict meanwhile",
                        FENCE_WAIT_S, exc)  # fmt: skip

    def _put_start_once(
        self, item: pb.PutStartItem, owner: int, evict: bool = True
    ) -> PutStartOutcome:
        return self.table.put_start(
            item.key,
            item.size_bytes,
            item.replicas,
            fingerprint=item.fingerprint,
            parent_key=item.parent_key,
            tag=item.tag,
            pin_ttl_s=item.pin_ttl_s if item.pin else None,
            owner=owner,
            soft_pin_ttl_s=item.soft_pin_ttl_s,
            preferred_nodes=item.preferred_nodes,
            evict=evict,
            attempt=item.attempt,
            retry=item.retry,
        )

    async def PutStart(self, request: pb.PutStartItem, context: object) -> pb.PutStartResult:
        return (await self._put_start_batch([request], context))[0]

    async def _put_start_batch(
        self, items: list[pb.PutStartItem], context: object
    ) -> list[pb.PutStartResult]:
        results = await self._put_starts(items, self._owner(context), context)
        try:
            await self.persist_dirty()  # evicted blocks are gone for good before their space
        except Exception as exc:  # is reused: when that cannot be written, nobody gets it
            log.error("persisting evictions for %d puts failed: %s", len(items), exc)
            failure = pb.Status(code=MooncakeError.code, message=f"metadata write failed: {exc}")
            for item, result in zip(items, results, strict=True):
                if result.replicas:
                    try:  # this put only (a retry may have taken its place meanwhile)
                        self.table.put_revoke(item.key, grant_generation(result.replicas[0].grant))
                    except MooncakeError:
                        pass  # its node died meanwhile: already gone
                    result.Clear()
                    result.status.CopyFrom(failure)
        return results

    @capped("items")
    async def BatchPutStart(
        self, request: pb.BatchPutStartRequest, context: object
    ) -> pb.BatchPutStartResponse:
        return pb.BatchPutStartResponse(
            results=await self._put_start_batch(list(request.items), context)
        )

    def _owner(self, context: object) -> int:
        """Who started a put, so that its pending puts end when its connection does: a framed
        connection names itself (`owner_id`) and reports its close (`connection_closed`); a
        gRPC connection is named by its peer address, and the tick finds it gone."""
        owner = getattr(context, "owner_id", 0)
        if owner:
            return int(owner)
        peer = getattr(context, "peer", None)
        return self.grpc_owners.owner_for(peer()) if callable(peer) else 0

    def connection_closed(self, owner: int) -> None:
        """A client connection closed: its pending puts will never end, revoke them now."""
        self.drop_lease_stock(owner)
        revoked = self.table.revoke_owner(owner)
        if revoked:
            log.info("revoked %d pending puts of a client that disconnected", len(revoked))

    def _repeated_put_end(self, item: pb.PutEndItem) -> pb.PutEndResult | None:
        """The reply to a PutEnd of a put already sealed with the same checksum (a retry whose
        first reply was lost): success once it is committed, None while it is being made
        durable (the caller waits for that commit)."""
        found = self.table.committed_as(item.key, item.checksum, item.generation)
        if found is None:
            return None
        state, replicas = found
        if state == COMPLETE:
            self.table.counters["put_ends_repeated"] += 1
            return pb.PutEndResult(status=_OK, replicas=replicas)
        return None

    async def _put_end(self, items: list[pb.PutEndItem]) -> list[pb.PutEndResult]:
        results: list[pb.PutEndResult | None] = []
        sealed: list[ObjectMeta] = []
        waits: list[asyncio.Future[None]] = []
        for done, item in enumerate(items):
            await pause_every(done)
            repeated = self._repeated_put_end(item)
            if repeated is not None:
                results.append(repeated)
                continue
            committing = self._committing.get(item.key)
            if committing is not None:  # the first PutEnd is being made durable: wait for it
                waits.append(committing)
                results.append(None)
                continue
            try:
                sealed.append(
                    self.table.put_end(
                        item.key, item.checksum, item.failed_segments, item.generation
                    )
                )
                results.append(None)
            except MooncakeError as exc:
                results.append(pb.PutEndResult(status=_status(exc)))
        committed = await self._commit(sealed) if sealed else {}
        if waits:
            await asyncio.gather(*waits)
        out: list[pb.PutEndResult] = []
        for item, result in zip(items, results, strict=True):
            if result is None:
                result = committed.get(item.key) or self._repeated_put_end(item)
            if result is None:  # waited for a commit that failed, or sealed differently
                lost = ObjectNotFoundError(
                    f"the put of {item.key!r} was not committed (its commit failed or was "
                    "revoked, or it was sealed with another checksum)"
                )
                result = pb.PutEndResult(status=_status(lost))
            out.append(result)
        return out

    async def _commit(self, sealed: list[ObjectMeta]) -> dict[str, pb.PutEndResult]:
        """Make sealed puts durable, then visible; a repeated PutEnd of one of them meanwhile
        waits for this (`_committing`) and reads the outcome from the table."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        for meta in sealed:
            self._committing[meta.key] = done
        out: dict[str, pb.PutEndResult] = {}
        try:
            # With no other put in flight there is nobody to group with: commit now.
            await self.store.write(puts=sealed, alone=not self.table.puts_in_flight())
        except Exception as exc:
            log.error("committing %d objects to RocksDB failed: %s", len(sealed), exc)
            failure = pb.Status(code=MooncakeError.code, message=f"metadata write failed: {exc}")
            for meta in sealed:
                try:
                    self.table.put_revoke(meta.key)
                except MooncakeError:
                    pass  # its node died meanwhile: already gone
                out[meta.key] = pb.PutEndResult(status=failure)
            self.table.mark_dirty(m.key for m in sealed)  # the write may have landed: delete
        else:
            for meta in sealed:
                try:
                    out[meta.key] = pb.PutEndResult(
                        status=_OK, replicas=self.table.commit_put_end(meta.key)
                    )
                except MooncakeError as exc:
                    out[meta.key] = pb.PutEndResult(status=_status(exc))
        finally:
            for meta in sealed:
                if self._committing.get(meta.key) is done:
                    del self._committing[meta.key]
            done.set_result(None)
        return out

    async def PutEnd(self, request: pb.PutEndItem, context: object) -> pb.PutEndResult:
        return (await self._put_end([request]))[0]

    @capped("items")
    async def BatchPutEnd(
        self, request: pb.BatchPutEndRequest, context: object
    ) -> pb.BatchPutEndResponse:
        results = await self._put_end(list(request.items))
        if not request.next:
            return pb.BatchPutEndResponse(results=results)
        leases = self._grant_leases(request.next, self._owner(context))
        return pb.BatchPutEndResponse(results=results, leases=leases)

    # ---- allocation leases (issue 14, master/leases.py) --------------------------------------

    @capped("items")
    async def BatchLeasedPut(
        self, request: pb.BatchLeasedPutRequest, context: object
    ) -> pb.BatchLeasedPutResponse:
        """Commit values written into leases; release leases given back; grant the next.
        Capped and served in slices like every batch (the client slices it: client/leases.py)."""
        results: list[pb.LeasedPutResult | None] = []
        sealed: list[ObjectMeta] = []
        waits: list[asyncio.Future[None]] = []
        deduplicated = False
        for done, item in enumerate(request.items):
            await pause_every(done)
            spec = item.spec
            repeated = self.table.committed_as(spec.key, item.checksum)
            if repeated is not None and item.lease_id not in self.table._lease_keys:
                # A retry whose first reply was lost: that commit used the lease.
                if repeated[0] == COMPLETE:
                    results.append(pb.LeasedPutResult(status=_OK, replicas=repeated[1]))
                    continue
                committing = self._committing.get(spec.key)
                if committing is not None:  # still being made durable: answer as it ends
                    waits.append(committing)
                    results.append(None)
                    continue
            try:
                meta = put_leased(
                    self.table, item.lease_id, spec.key, spec.size_bytes, item.checksum,
                    failed_segments=tuple(item.failed_segments), replicas=spec.replicas,
                    fingerprint=spec.fingerprint, parent_key=spec.parent_key, tag=spec.tag,
                    pin_ttl_s=spec.pin_ttl_s if spec.pin else None,
                    soft_pin_ttl_s=spec.soft_pin_ttl_s,
                )  # fmt: skip
            except MooncakeError as exc:
                release_lease(self.table, item.lease_id)
                results.append(pb.LeasedPutResult(status=_status(exc)))
                continue
            if meta is None:
                deduplicated = True
                results.append(pb.LeasedPutResult(status=_OK, already_exists=True))
            else:
                sealed.append(meta)
                results.append(None)
        committed = await self._commit(sealed) if sealed else {}
        if waits:
            await asyncio.gather(*waits)
        if deduplicated:  # a key stored already, maybe pinned longer now: durable before the
            try:  # reply, as PutStart makes it (it was so only when a lease was minted inline)
                await self.persist_dirty()
            except Exception as exc:  # the keys stay dirty: the tick writes them again
                log.error("persisting the pins of deduplicated leased puts failed: %s", exc)
        for done, lease_id in enumerate(request.release):
            await pause_every(done)
            release_lease(self.table, lease_id)
        out: list[pb.LeasedPutResult] = []
        for item, result in zip(request.items, results, strict=True):
            if result is None:
                end = committed.get(item.spec.key) or self._repeated_put_end(
                    pb.PutEndItem(key=item.spec.key, checksum=item.checksum)
                )
                if end is None:  # waited for a commit that failed
                    lost = ObjectNotFoundError(
                        f"the put of {item.spec.key!r} was not committed (its commit failed or "
                        "was revoked)"
                    )
                    end = pb.PutEndResult(status=_status(lost))
                result = pb.LeasedPutResult(status=end.status, replicas=end.replicas)
            out.append(result)
        leases = self._grant_leases(request.next, self._owner(context))
        return pb.BatchLeasedPutResponse(results=out, leases=leases)

    # ---- revokes -----------------------------------------------------------------------------

    def _revoke(self, key: str, generation: int = 0) -> pb.Status:
        try:
            self.table.put_revoke(key, generation)
            return _OK
        except MooncakeError as exc:
            return _status(exc)

    async def PutRevoke(self, request: pb.KeyRequest, context: object) -> pb.Status:
        return self._revoke(request.key)

    @capped("keys")
    async def BatchPutRevoke(self, request: pb.KeysRequest, context: object) -> pb.StatusesResponse:
        generations = list(request.generations) or [0] * len(request.keys)
        if len(generations) != len(request.keys):  # each key refused: nothing revoked
            bad = InvalidArgumentError(
                f"{len(request.keys)} keys but {len(generations)} generations to revoke"
            )
            return pb.StatusesResponse(statuses=[_status(bad)] * len(request.keys))
        pairs = list(zip(request.keys, generations, strict=True))
        return pb.StatusesResponse(statuses=await each(pairs, lambda p: self._revoke(*p)))
