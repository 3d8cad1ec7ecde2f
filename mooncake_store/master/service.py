"""The master's service, a thin shell that turns protobuf calls into ObjectTable calls.

The same methods serve gRPC and the framed endpoint (`framed_server.py`).

Protobuf types live only here.  Per-key failures become per-key `Status` values carrying the
stable codes of `common.errors`; durable mutations (commits, removes, objects lost with a node)
are written through the group-committing MetadataStore before the reply goes out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

import grpc
from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.auth import Role, control_key, grant_key
from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.clock import expiry_ms
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    IdentityConflictError,
    InvalidArgumentError,
    MooncakeError,
    NoSpaceError,
    ObjectHasLeaseError,
    ObjectNotFoundError,
    SegmentNotFoundError,
)
from mooncake_store.common.grant import GrantMode, sign
from mooncake_store.common.version import __version__
from mooncake_store.master.access import AccessControl, Caller
from mooncake_store.master.batches import SLICE_ITEMS, capped, each, pause_every
from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.corruption import RecentChecks, Verifier, check_reports
from mooncake_store.master.drain import Drains
from mooncake_store.master.grpc_owners import GrpcOwners
from mooncake_store.master.leases import grant_leases, put_leased, release_all, release_lease
from mooncake_store.master.object_table import ObjectTable, PutStartOutcome
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.replication import Replication
from mooncake_store.master.segments import NodeInfo, Segment, SegmentInfo, Tier
from mooncake_store.master.tiering import Tiering

log = logging.getLogger("mooncake.master")

_OK = pb.Status(code=OK)


async def _listening(endpoint: str, timeout_s: float = 1.0) -> bool:
    """Whether something accepts TCP connections at host:port (a timeout counts as yes)."""
    host, _, port = endpoint.rpartition(":")
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), timeout_s)
    except TimeoutError:
        return True
    except (OSError, ValueError):
        return False
    writer.close()
    return True


def _status(exc: MooncakeError) -> pb.Status:
    return pb.Status(code=exc.code, message=exc.message)


def _location(
    seg: Segment,
    replica: Replica,
    size_bytes: int,
    expires_s: float,
    mode: GrantMode,
    generation: int = 0,
) -> pb.ReplicaLocation:
    out = pb.ReplicaLocation()
    _fill_location(out, seg, replica, size_bytes, expires_s, mode, generation)
    return out


def _fill_location(
    out: pb.ReplicaLocation,
    seg: Segment,
    replica: Replica,
    size_bytes: int,
    expires_s: float,
    mode: GrantMode,
    generation: int = 0,
) -> None:
    info = seg.info
    node = info.node
    segment_id, offset = info.segment_id, replica.offset
    out.node_id = node.node_id
    out.segment_id = segment_id
    out.endpoint = node.endpoint
    if info.tier is Tier.DRAM or info.tier is Tier.GPU:  # GPU: same-host CUDA IPC (issue 14)
        out.shm_socket = node.shm_socket
    out.offset = offset
    out.size_bytes = size_bytes
    out.grant = sign(
        node.secret, segment_id, offset, size_bytes, expiry_ms(expires_s), mode, generation
    )
    out.tier = info.tier.value
    out.grpc_endpoint = node.control_endpoint  # the node's gRPC DataService (issue 15)


class MasterServicer(pb_grpc.MasterServiceServicer):
    def __init__(
        self,
        table: ObjectTable,
        store: MetadataStore,
        config: MasterConfig,
        tiering: Tiering,
        replication: Replication,
        *,
        drains: Drains | None = None,
        access: AccessControl | None = None,
    ) -> None:
        self.access = access or AccessControl(None)
        #: Per node id: the key that signs the master's control requests to its incarnation.
        self.control_keys: dict[str, bytes] = {}
        self.table = table
        self.store = store
        self.config = config
        self.tiering = tiering
        self.replication = replication
        self.drains = drains or Drains(table, replication)
        self.framed_port = 0  # set by the server once the framed endpoint listens
        self.grpc_owners = GrpcOwners()  # gRPC connections that started puts (the tick
        # revokes the puts of those the kernel no longer lists: master/grpc_owners.py)
        self.liveness_port = 0  # set by the server once the heartbeat endpoint listens
        self.framed_socket = ""
        self.extra_counters: dict[str, int] = {}  # merged into Stats (set by the server)
        #: Hashes extents on their nodes (NodeMover.verify, set by the server); None: no node
        #: calls, so no corrupt report can be checked and none deletes anything.
        self.verify_extents: Verifier | None = None
        self.recent_checks = RecentChecks()  # keys whose replicas checked out lately
        self._committing: dict[str, asyncio.Future[None]] = {}  # key -> its commit's outcome

    async def Hello(self, request: pb.HelloRequest, context: object) -> pb.HelloResponse:
        return pb.HelloResponse(
            framed_port=self.framed_port,
            framed_socket=self.framed_socket,
            framed_host=self.config.advertise_host,
            version=__version__,
        )

    # ---- puts -----------------------------------------------------------------------------

    def _put_start(self, item: pb.PutStartItem, owner: int = 0) -> pb.PutStartResult:
        try:
            outcome = self._put_start_room(item, owner)
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

    def _put_start_room(self, item: pb.PutStartItem, owner: int) -> PutStartOutcome:
        """put_start; out of room, unused allocation leases are given back and it tries again."""
        try:
            return self._put_start_once(item, owner)
        except NoSpaceError:
            if not release_all(self.table):
                raise
        return self._put_start_once(item, owner)

    def _put_start_once(self, item: pb.PutStartItem, owner: int) -> PutStartOutcome:
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
        )

    async def PutStart(self, request: pb.PutStartItem, context: object) -> pb.PutStartResult:
        return (await self._put_start_batch([request], context))[0]

    async def _put_start_batch(
        self, items: list[pb.PutStartItem], context: object
    ) -> list[pb.PutStartResult]:
        owner = self._owner(context)
        results = await each(items, lambda i: self._put_start(i, owner))
        try:
            await self.persist_dirty()  # evicted blocks are gone for good before their space
        except Exception as exc:  # is reused: when that cannot be written, nobody gets it
            log.error("persisting evictions for %d puts failed: %s", len(items), exc)
            failure = pb.Status(code=MooncakeError.code, message=f"metadata write failed: {exc}")
            for item, result in zip(items, results, strict=True):
                if result.replicas:
                    try:
                        self.table.put_revoke(item.key)
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
        revoked = self.table.revoke_owner(owner)
        if revoked:
            log.info("revoked %d pending puts of a client that disconnected", len(revoked))

    def _repeated_put_end(self, item: pb.PutEndItem) -> pb.PutEndResult | None:
        """The reply to a PutEnd of a put already sealed with the same checksum (a retry whose
        first reply was lost): success once it is committed, None while it is being made
        durable (the caller waits for that commit)."""
        found = self.table.committed_as(item.key, item.checksum)
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
                sealed.append(self.table.put_end(item.key, item.checksum, item.failed_segments))
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
        leases = await self._grant_leases(request.next, self._owner(context))
        return pb.BatchPutEndResponse(results=results, leases=leases)

    # ---- allocation leases (issue 14, master/leases.py) --------------------------------------

    async def _grant_leases(self, wanted: Sequence[pb.LeaseRequest], owner: int) -> list[pb.Lease]:
        out: list[pb.Lease] = []
        now = self.table._clock()
        for want in wanted[:16]:
            for lease_id, outcome in grant_leases(
                self.table, want.size_bytes, want.replicas, want.count, owner
            ):
                out.append(pb.Lease(
                    lease_id=lease_id, size_bytes=want.size_bytes,
                    replicas=[_location(seg, r, want.size_bytes, outcome.deadline_s,
                                        GrantMode.WRITE, outcome.generation)
                              for seg, r in outcome.placements],
                    expires_in_s=outcome.deadline_s - now, wanted_replicas=want.replicas,
                ))  # fmt: skip
        if out:
            await self.persist_dirty()  # evicted blocks are gone before the space is reused
        return out

    async def BatchLeasedPut(
        self, request: pb.BatchLeasedPutRequest, context: object
    ) -> pb.BatchLeasedPutResponse:
        """Commit values written into leases; release leases given back; grant the next."""
        results: list[pb.LeasedPutResult | None] = []
        sealed: list[ObjectMeta] = []
        for item in request.items:
            spec = item.spec
            repeated = self.table.committed_as(spec.key, item.checksum)
            if (
                repeated is not None
                and repeated[0] == COMPLETE
                and (item.lease_id not in self.table._lease_keys)
            ):  # a retry whose first reply was lost: that commit used the lease
                results.append(pb.LeasedPutResult(status=_OK, replicas=repeated[1]))
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
                results.append(pb.LeasedPutResult(status=_OK, already_exists=True))
            else:
                sealed.append(meta)
                results.append(None)
        committed = await self._commit(sealed) if sealed else {}
        for lease_id in request.release:
            release_lease(self.table, lease_id)
        out: list[pb.LeasedPutResult] = []
        for item, result in zip(request.items, results, strict=True):
            if result is None:
                end = committed[item.spec.key]
                result = pb.LeasedPutResult(status=end.status, replicas=end.replicas)
            out.append(result)
        leases = await self._grant_leases(request.next, self._owner(context))
        return pb.BatchLeasedPutResponse(results=out, leases=leases)

    def _revoke(self, key: str) -> pb.Status:
        try:
            self.table.put_revoke(key)
            return _OK
        except MooncakeError as exc:
            return _status(exc)

    async def PutRevoke(self, request: pb.KeyRequest, context: object) -> pb.Status:
        return self._revoke(request.key)

    @capped("keys")
    async def BatchPutRevoke(self, request: pb.KeysRequest, context: object) -> pb.StatusesResponse:
        return pb.StatusesResponse(statuses=await each(request.keys, self._revoke))

    # ---- reads ----------------------------------------------------------------------------

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
        for seg, r in found.live:
            _fill_location(
                out.replicas.add(), seg, r, size_bytes, found.lease_until_s, GrantMode.READ
            )
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
            try:
                await self.store.write(deletes=[m.key for m in doomed])
            except Exception as exc:
                log.error("removing %d objects: the metadata write failed: %s", len(doomed), exc)
                self.table.mark_dirty(m.key for m in doomed)  # the write may have landed
                failure = pb.Status(
                    code=MooncakeError.code,
                    message=f"metadata write failed ({exc}); nothing was removed, retry",
                )
                return [s or failure for s in statuses]
            for meta in doomed:
                if self.table.same_object(meta):  # not removed, lost or put again meanwhile
                    self.table.remove(meta.key)
        return [s or _OK for s in statuses]

    async def Remove(self, request: pb.KeyRequest, context: object) -> pb.Status:
        return (await self._remove([request.key]))[0]

    @capped("keys")
    async def BatchRemove(self, request: pb.KeysRequest, context: object) -> pb.StatusesResponse:
        return pb.StatusesResponse(
            statuses=await self._remove(list(request.keys), request.unless_leased)
        )

    # ---- issue 13: key listing and metadata-only descriptions ------------------------------

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

    # ---- nodes ----------------------------------------------------------------------------

    def _node_keys(self, request: pb.MountSegmentRequest, caller: Caller) -> tuple[bytes, bytes]:
        """The node's grant key and control key: derived from its node token's secret when
        authentication is on (the node derives the same keys; they never travel), else the
        grant key the node sent (and no control key).

        Raises:
            AccessDeniedError: the caller may not act as this node.
        """
        authority = self.access.authority
        if authority is None:
            if len(request.secret) < 16:
                raise AccessDeniedError(
                    "this master runs with --auth off, but the node has a token (it derives its "
                    "grant key and sends none): start the master with auth on, or the node "
                    "without a token"
                )
            return bytes(request.secret), b""
        if caller.role is not Role.NODE or not caller.may_act_as_node(request.node_id):
            raise AccessDeniedError(
                f"mounting node {request.node_id!r} needs a node token bound to that id "
                f"(`mooncake-admin token create --role node --node-id {request.node_id}`); "
                f"this is a {caller.role.value} token"
                + (f" for node {caller.node_id!r}" if caller.node_id else "")
            )
        secret = authority.node_secret(caller.node_id, caller.token_id)
        node_id, incarnation = request.node_id, request.incarnation
        return grant_key(secret, node_id, incarnation), control_key(secret, node_id, incarnation)

    def _check_node_proof(self, method: str, request: Message, context: object) -> None:
        """Raises AccessDeniedError unless a node token's caller signed `request` with its node
        secret (`AccessControl.check_node_proof`)."""
        metadata = getattr(context, "invocation_metadata", lambda: ())()
        self.access.check_node_proof(self.access.caller(context), method, request, metadata)

    def _check_node(self, node_id: str, context: object) -> None:
        caller = self.access.caller(context)
        if self.access.enabled and not caller.may_act_as_node(node_id):
            raise AccessDeniedError(
                f"a {caller.role.value} token "
                + (f"of node {caller.node_id!r} " if caller.node_id else "")
                + f"may not act as node {node_id!r}"
            )

    async def MountSegment(
        self, request: pb.MountSegmentRequest, context: object
    ) -> pb.MountSegmentResponse:
        try:
            secret, control = self._node_keys(request, self.access.caller(context))
            self._check_node_proof("MountSegment", request, context)
        except AccessDeniedError as refused:
            log.warning("refused a mount of node %r: %s", request.node_id, refused)
            return pb.MountSegmentResponse(status=_status(refused))
        try:
            node = NodeInfo(
                node_id=request.node_id,
                incarnation=request.incarnation,
                endpoint=request.endpoint,
                shm_socket=request.shm_socket,
                control_endpoint=request.control_endpoint,
                secret=secret,
            )
            segments = [
                (
                    SegmentInfo(node, spec.segment_id, Tier(spec.tier or "DRAM"), spec.size_bytes),
                    [
                        BlockRecord(i.key, i.offset, i.size_bytes, i.checksum,
                                      bytes(i.fingerprint), i.parent_key, bytes(i.tag))
                        for i in spec.inventory
                    ] if Tier(spec.tier or "DRAM").persistent else None,
                )
                for spec in request.segments
            ]  # fmt: skip
        except ValueError as exc:
            return pb.MountSegmentResponse(status=_status(InvalidArgumentError(str(exc))))
        if self.config.alignment_bytes % 4096 and any(i.tier.persistent for i, _ in segments):
            problem = (
                f"an NVMe tier needs the master's alignment_bytes to be a multiple of 4096 "
                f"(O_DIRECT), it is {self.config.alignment_bytes}"
            )
            return pb.MountSegmentResponse(status=_status(InvalidArgumentError(problem)))
        known = self.table.node(node.node_id)
        fresh = known is None or known.info.incarnation != node.incarnation
        other = self.table.identity_conflict(node)
        # Another process mounted under this id and still heartbeats.  If its data endpoint
        # refuses connections it is gone (killed and restarted elsewhere): replace it.
        replace = other is not None and not await _listening(other.endpoint)
        try:
            self.table.mount(node, segments, replace=replace)
        except IdentityConflictError as exc:
            log.error("refused the mount of node %s: %s", node.node_id, exc.message)
            return pb.MountSegmentResponse(status=_status(exc))
        if control:  # the keys of the incarnation that mounted, once it has
            self.control_keys[node.node_id] = control
        await self.persist_dirty()
        if fresh:
            log.info(
                "mounted node %s (incarnation %x) at %s: %s",
                node.node_id,
                node.incarnation,
                node.endpoint,
                ", ".join(f"{i.tier.value} {i.size_bytes} bytes" for i, _ in segments),
            )
        return pb.MountSegmentResponse(
            status=_OK,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            liveness_port=self.liveness_port,
        )

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: object
    ) -> pb.HeartbeatResponse:
        try:
            self._check_node(request.node_id, context)
            self._check_node_proof("Heartbeat", request, context)
        except AccessDeniedError as refused:
            return pb.HeartbeatResponse(status=_status(refused))
        if self.table.heartbeat(request.node_id, request.incarnation):
            return pb.HeartbeatResponse(status=_OK)
        exc = SegmentNotFoundError(f"node {request.node_id} is not mounted; mount again")
        return pb.HeartbeatResponse(status=_status(exc))

    async def UnmountSegment(self, request: pb.UnmountSegmentRequest, context: object) -> pb.Status:
        try:
            self._check_node(request.node_id, context)
            self._check_node_proof("UnmountSegment", request, context)
        except AccessDeniedError as refused:
            return _status(refused)
        self.drains.forget(request.node_id)
        deleted = self.table.unmount(request.node_id, request.incarnation)
        log.info("unmounted node %s (%d objects lost)", request.node_id, len(deleted))
        await self.store.write(deletes=deleted)
        await self.persist_dirty()
        return _OK

    async def DrainNode(
        self, request: pb.DrainNodeRequest, context: object
    ) -> pb.DrainNodeResponse:
        """Start (or continue) draining a node that is about to stop (see drain.py)."""
        try:
            self._check_node(request.node_id, context)
            self._check_node_proof("DrainNode", request, context)
        except AccessDeniedError as refused:
            return pb.DrainNodeResponse(status=_status(refused))
        started = request.node_id not in self.drains.draining
        try:
            progress = self.drains.drain(request.node_id, request.incarnation)
        except MooncakeError as exc:
            return pb.DrainNodeResponse(status=_status(exc))
        if started:
            log.info("draining node %s: %d objects have their only replicas there",
                     request.node_id, progress.remaining)  # fmt: skip
        return pb.DrainNodeResponse(
            status=_OK,
            remaining=progress.remaining,
            copying=progress.copying,
            saved=progress.saved,
        )

    async def ListNodes(
        self, request: pb.ListNodesRequest, context: object
    ) -> pb.ListNodesResponse:
        now = time.monotonic()
        return pb.ListNodesResponse(
            nodes=[
                pb.NodeInfo(
                    node_id=s.node_id,
                    segment_id=s.segment_id,
                    endpoint=s.info.node.endpoint,
                    tier=s.tier.value,
                    size_bytes=s.allocator.capacity_bytes,
                    used_bytes=s.allocator.used_bytes,
                    objects=s.objects,
                    last_heartbeat_age_s=max(0.0, now - self.table.last_heartbeat(s.node_id)),
                    incarnation=s.info.node.incarnation,
                )
                for s in self.table.segments()
            ]
        )

    async def persist_dirty(self) -> None:
        """Write what evictions, moves and adoptions changed (durable before replies).  When
        the write fails, the keys stay dirty: the next tick writes them again."""
        dirty = self.table.take_dirty()
        if dirty.puts or dirty.deletes:
            try:
                await self.store.write(puts=dirty.puts, deletes=dirty.deletes)
            except Exception:
                self.table.mark_dirty([*(m.key for m in dirty.puts), *dirty.deletes])
                raise

    # ---- corrupt objects ------------------------------------------------------------------

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

    async def Stats(self, request: pb.StatsRequest, context: object) -> pb.StatsResponse:
        segments = self.table.segments()
        counters = dict(self.table.counters)
        counters.update(self.tiering.counters)
        counters.update(self.replication.counters)
        counters.update(self.drains.counters)
        counters["hot_objects"] = len(self.replication.hot)
        counters["under_replicated"] = len(self.table.under_replicated)
        counters.update(self.extra_counters)  # hits and misses, counted by master/metrics.py
        counters["metadata_batches"] = self.store.batches_written
        counters["metadata_mutations"] = self.store.mutations_written
        counters["metadata_reopened"] = self.store.reopened
        return pb.StatsResponse(
            objects=self.table.object_count(),
            processing=self.table.pending_count(),
            bytes_stored=self.table.bytes_stored(),
            nodes=len({s.node_id for s in segments}),
            capacity_bytes=sum(s.allocator.capacity_bytes for s in segments),
            used_bytes=sum(s.allocator.used_bytes for s in segments),
            max_object_bytes=max(
                (s.allocator.capacity_bytes for s in segments if s.tier is Tier.DRAM), default=0
            ),
            counters=counters,
        )

    # ---- credentials (issue 12) -------------------------------------------------------------

    async def Authenticate(
        self, request: pb.AuthenticateRequest, context: object
    ) -> pb.AuthenticateResponse:
        """Who the caller is (a framed connection authenticates in FramedServer)."""
        try:
            caller = (
                self.access.authenticate(request.token, request.tenant)
                if request.token
                else self.access.caller(context)
            )
        except AccessDeniedError as refused:
            return pb.AuthenticateResponse(status=_status(refused), auth=self.access.enabled)
        return pb.AuthenticateResponse(
            status=_OK,
            role=caller.role.value,
            tenant=caller.tenant,
            node_id=caller.node_id,
            auth=self.access.enabled,
        )

    async def CreateToken(
        self, request: pb.CreateTokenRequest, context: object
    ) -> pb.CreateTokenResponse:
        """A new token, for an admin (the role table admits no one else)."""
        authority = self.access.authority
        if authority is None:
            problem = "this master runs with --auth off: it issues no tokens"
            return pb.CreateTokenResponse(status=_status(InvalidArgumentError(problem)))
        try:
            token = authority.issue(
                Role(request.role), request.tenant, ttl_s=request.ttl_s, node_id=request.node_id
            )
        except (MooncakeError, ValueError) as exc:
            return pb.CreateTokenResponse(status=_status(InvalidArgumentError(str(exc))))
        caller = self.access.caller(context)
        log.info("admin token %s issued a %s token for tenant %r", caller.token_id,
                 request.role, request.tenant)  # fmt: skip
        return pb.CreateTokenResponse(status=_OK, token=token)


def add_to_server(servicer: MasterServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_MasterServiceServicer_to_server(servicer, server)
