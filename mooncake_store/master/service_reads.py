"""The master service's read-side methods: replica lists (reads grant read leases),
prefix matches, existence probes, removes (durable before visible), key listing, metadata-only
descriptions and corrupt-object reports.

`ReadMethods` is a base of `MasterServicer` (service.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.errors import MooncakeError, ObjectHasLeaseError, ObjectNotFoundError
from mooncake_store.common.grant import GrantMode
from mooncake_store.master.batches import SLICE_ITEMS, capped, each, pause_every
from mooncake_store.master.corruption import check_reports
from mooncake_store.master.objects import ObjectMeta
from mooncake_store.master.service_base import _OK, ServicerBase, _fill_location, _status

log = logging.getLogger("mooncake.master")


class ReadMethods(ServicerBase):
    """The read, remove and listing methods (see the module docstring)."""

    # ---- reads -------------------------------------------------------------------------------

    def _replica_list(
        self, out: pb.ReplicaListResult, key: str, fingerprint: bytes = b""
    ) -> pb.ReplicaListResult:
        """Fill `out` (built in place: a message added to a reply is not copied again)."""
        try:
            found = self.table.read(key, fingerprint)
        except MooncakeError as exc:
            out.status.code, out.status.message = exc.code, exc.message
            return out
        size_bytes = found.size_bytes
        out.size_bytes = size_bytes
        out.checksum = found.checksum
        out.lease_ttl_s = self.config.lease_ttl_s
        if found.tag:
            out.tag = found.tag
        if found.parent_key:
            out.parent_key = found.parent_key
        for seg, r in found.live:  # the grants name the put's generation (client/speculative.py)
            _fill_location(out.replicas.add(), seg, r, size_bytes, found.lease_until_s,
                           GrantMode.READ, found.generation)  # fmt: skip
        return out

    async def _replica_lists(
        self, keys: Sequence[str], fingerprint: bytes
    ) -> pb.BatchGetReplicaListResponse:
        reply = pb.BatchGetReplicaListResponse()
        results = reply.results
        for done, key in enumerate(keys):
            await pause_every(done)
            self._replica_list(results.add(), key, fingerprint)
        return reply

    async def GetReplicaList(self, request: pb.KeyRequest, context: object) -> pb.ReplicaListResult:
        return self._replica_list(pb.ReplicaListResult(), request.key, request.fingerprint)

    @capped("keys")
    async def BatchGetReplicaList(
        self, request: pb.KeysRequest, context: object
    ) -> pb.BatchGetReplicaListResponse:
        return await self._replica_lists(request.keys, request.fingerprint)

    async def _prefix_match(self, keys: Sequence[str], fingerprint: bytes) -> int:
        matched = 0
        for start in range(0, len(keys), SLICE_ITEMS):
            if start:
                await asyncio.sleep(0)
            part = keys[start : start + SLICE_ITEMS]
            found = self.table.prefix_match(part, fingerprint)
            matched += found
            if found < len(part):
                break
        return matched

    @capped("keys")
    async def PrefixMatch(self, request: pb.KeysRequest, context: object) -> pb.PrefixMatchResponse:
        return pb.PrefixMatchResponse(
            matched=await self._prefix_match(request.keys, request.fingerprint)
        )

    @capped("keys")
    async def GetPrefix(
        self, request: pb.KeysRequest, context: object
    ) -> pb.BatchGetReplicaListResponse:
        matched = await self._prefix_match(request.keys, request.fingerprint)
        keys = request.keys[:matched]
        return await self._replica_lists(keys, request.fingerprint)

    async def Exists(self, request: pb.KeyRequest, context: object) -> pb.ExistsResult:
        return pb.ExistsResult(exists=self.table.exists(request.key))

    @capped("keys")
    async def BatchExists(self, request: pb.KeysRequest, context: object) -> pb.BatchExistsResponse:
        return pb.BatchExistsResponse(exists=await each(request.keys, self.table.exists))

    # ---- removes -----------------------------------------------------------------------------

    async def _remove(self, keys: list[str], unless_leased: bool = False) -> list[pb.Status]:
        """Durable before visible: the deletes reach RocksDB first, then the objects go.  When
        the write fails, nothing is removed and every key reports the failure.  With
        `unless_leased`, an object being read is refused (ObjectHasLeaseError)."""
        statuses: list[pb.Status | None] = []
        doomed: list[ObjectMeta] = []
        for done, key in enumerate(keys):
            await pause_every(done)
            try:
                if unless_leased and self.table.leased(key):
                    raise ObjectHasLeaseError(
                        f"{key!r} is being read (its read lease has not ended); remove it "
                        "with force, or retry after the lease"
                    )
                doomed.append(self.table.check_removable(key))
                statuses.append(None)
            except MooncakeError as exc:
                statuses.append(_status(exc))
        if doomed:
            owed = [r for meta in doomed for r in self.table.releases_of(meta)]
            try:
                await self.store.write(deletes=[m.key for m in doomed], releases=owed)
            except Exception as exc:
                log.error("removing %d objects: the metadata write failed: %s", len(doomed), exc)
                self.table.mark_dirty(m.key for m in doomed)  # the write may have landed
                self.table.releases.mark_dirty(owed)  # as they are: none owed yet
                failure = pb.Status(
                    code=MooncakeError.code,
                    message=f"metadata write failed ({exc}); nothing was removed, retry",
                )
                return [s or failure for s in statuses]
            for meta in doomed:
                if self.table.same_object(meta):  # not removed, lost or put again meanwhile
                    self.table.remove(meta.key)
                else:
                    self.table.removed_meanwhile(meta.key, owed)
        return [s or _OK for s in statuses]

    async def Remove(self, request: pb.KeyRequest, context: object) -> pb.Status:
        return (await self._remove([request.key]))[0]

    @capped("keys")
    async def BatchRemove(self, request: pb.KeysRequest, context: object) -> pb.StatusesResponse:
        return pb.StatusesResponse(
            statuses=await self._remove(list(request.keys), request.unless_leased)
        )

    # ---- issue 13: key listing and metadata-only descriptions --------------------------------

    async def ListKeys(self, request: pb.ListKeysRequest, context: object) -> pb.ListKeysResponse:
        limit = min(request.limit or 1000, 10000)
        try:
            start = int(request.cursor or "0")
            if start < 0:
                raise ValueError
        except ValueError:
            return pb.ListKeysResponse()  # a cursor this master never issued: nothing more
        rows, next_slot = self.table.scan_keys(start, limit, request.prefix)
        return pb.ListKeysResponse(
            keys=[pb.KeyInfo(key=k, size_bytes=size, replicas=n) for k, size, n in rows],
            next_cursor="" if next_slot < 0 else str(next_slot),
        )

    @capped("keys")
    async def BatchDescribe(
        self, request: pb.KeysRequest, context: object
    ) -> pb.BatchDescribeResponse:
        reply = pb.BatchDescribeResponse()
        for done, key in enumerate(request.keys):
            await pause_every(done)
            out = reply.results.add()
            meta = self.table.get(key) if self.table.exists(key) else None
            if meta is None:
                out.status.code = ObjectNotFoundError.code
                out.status.message = f"no object under key {key!r}"
                continue
            out.size_bytes = meta.size_bytes
            for r in meta.replicas:
                seg = self.table.segment(r.segment_id)
                if seg is None:
                    continue
                out.replicas.add(
                    node_id=seg.node_id, segment_id=seg.segment_id,
                    endpoint=seg.info.node.endpoint, tier=seg.tier.value, offset=r.offset,
                )  # fmt: skip
        return reply

    # ---- corrupt objects ---------------------------------------------------------------------

    @capped("reports")
    async def BatchReportCorrupt(
        self, request: pb.ReportCorruptRequest, context: object
    ) -> pb.StatusesResponse:
        """Deletes only what the nodes find failing its checksum (master/corruption.py)."""
        outcomes = await check_reports(
            self.table, list(request.reports), self.verify_extents, self.recent_checks
        )
        await self.persist_dirty()
        return pb.StatusesResponse(
            statuses=[_OK if err is None else _status(err) for err in outcomes]
        )
