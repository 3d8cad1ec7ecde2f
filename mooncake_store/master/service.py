"""The master's service, a thin shell that turns protobuf calls into ObjectTable calls.

The same methods serve gRPC and the framed endpoint (`framed_server.py`), found by name on
`MasterServicer`.  They are grouped by what they serve, each group a base of the servicer:
`service_puts.py` (puts, allocation leases, revokes), `service_reads.py` (reads, removes,
listing, corrupt reports), `service_nodes.py` (mounts, heartbeats, drains, the node list); the
protobuf reply helpers, the shared state and `persist_dirty` are in `service_base.py`; this
module holds the servicer itself, Hello, Stats and the credential methods.

Protobuf types live only in these modules.  Per-key failures become per-key `Status` values
carrying the stable codes of `common.errors`; durable mutations (commits, removes, objects lost
with a node) are written through the group-committing MetadataStore before the reply goes out.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable

import grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.auth import Role
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError, MooncakeError
from mooncake_store.common.version import __version__
from mooncake_store.master.access import AccessControl
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.corruption import RecentChecks, Verifier
from mooncake_store.master.drain import Drains
from mooncake_store.master.grpc_owners import GrpcOwners
from mooncake_store.master.lease_stock import LeaseStock
from mooncake_store.master.leases import lease_usage
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.replication import Replication
from mooncake_store.master.segments import Tier
from mooncake_store.master.service_base import _OK, FirstFences, _status
from mooncake_store.master.service_nodes import NodeMethods
from mooncake_store.master.service_puts import PutMethods
from mooncake_store.master.service_reads import ReadMethods
from mooncake_store.master.tiering import Tiering

log = logging.getLogger("mooncake.master")


class MasterServicer(PutMethods, ReadMethods, NodeMethods):
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
        self.node_tokens: dict[str, str] = {}
        self.table = table
        self.store = store
        self.config = config
        self.tiering = tiering
        self.replication = replication
        self.drains = drains or Drains(table, replication)
        self.framed_port = 0  # set by the server once the framed endpoint listens
        self.lease_stock = LeaseStock()  # leases minted ahead (service_leases.py)
        self._refills: set[tuple[int, tuple[int, int]]] = set()
        self.grpc_owners = GrpcOwners()  # gRPC connections that started puts (the tick
        # revokes the puts of those the kernel no longer lists: master/grpc_owners.py)
        self.liveness_port = 0  # set by the server once the heartbeat endpoint listens
        self.master_run = int.from_bytes(os.urandom(8), "little") | 1  # never 0 (none)
        self.generation_floor = None  # set by the server (its data directory's)
        self.framed_socket = ""
        self.extra_counters: dict[str, int] = {}  # merged into Stats (set by the server)
        #: Closes the framed connections of a revoked token (set by the server).
        self.drop_token_connections: Callable[[str], int] = lambda token_id: 0
        #: Hashes extents on their nodes (NodeMover.verify, set by the server); None: no node
        #: calls, so no corrupt report can be checked and none deletes anything.
        self.verify_extents: Verifier | None = None
        self.recent_checks = RecentChecks()  # keys whose replicas checked out lately
        #: Pushes the write fences now and waits for the nodes (set by the server); a put
        #: that finds no free room while some is about to be freed (unused leases, extents
        #: of puts that ended uncommitted) waits for it before evicting (service_puts.py).
        self.fence_now: Callable[[], Awaitable[None]] | None = None
        #: Pushes a node its first fence of this run a moment from now (set by the server): a
        #: mount asks for it.  `first_fences(nodes, push, fresh_only=False)` waits for those in
        #: flight (server.py `_await_first_fences`).
        self.fence_soon: Callable[[str], None] | None = None
        self.first_fences: FirstFences | None = None
        self._fence_waits_off_until = 0.0
        self._committing: dict[str, asyncio.Future[None]] = {}  # key -> its commit's outcome
        self._persisting: set[asyncio.Future[None]] = set()  # persist_dirty's writes in flight
        self.persist_failures = 0

    async def Hello(self, request: pb.HelloRequest, context: object) -> pb.HelloResponse:
        return pb.HelloResponse(
            framed_port=self.framed_port,
            framed_socket=self.framed_socket,
            framed_host=self.config.advertise_host,
            version=__version__,
            max_batch_items=self.config.max_batch_items,  # clients split bigger batches
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
        _, leased_bytes = lease_usage(segments)  # unused leases: reported apart from objects
        leases = len(self.table._lease_keys)
        return pb.StatsResponse(
            objects=self.table.object_count(),
            processing=self.table.pending_count() - leases,
            bytes_stored=self.table.bytes_stored(),
            nodes=len({s.node_id for s in segments}),
            capacity_bytes=sum(s.allocator.capacity_bytes for s in segments),
            used_bytes=sum(s.allocator.used_bytes for s in segments) - leased_bytes,
            leases=leases,
            leased_bytes=leased_bytes,
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

    async def RevokeToken(
        self, request: pb.RevokeTokenRequest, context: object
    ) -> pb.RevokeTokenResponse:
        """Revoke one token (master/revocations.py), for an admin: refused from now on, on
        every call; recorded before the reply; framed connections that use it are closed.
        Given the token itself, the master verifies it and keeps the record until its expiry;
        given only an id, for good (an expiry the caller states is never trusted)."""
        authority = self.access.authority
        if authority is None:
            problem = "this master runs with --auth off: it has no tokens to revoke"
            return pb.RevokeTokenResponse(status=_status(InvalidArgumentError(problem)))
        caller = self.access.caller(context)  # before: it may be revoking its own token
        try:
            token_id, expires_s = request.token_id, 0
            if request.token:
                claims = authority.genuine(request.token)
                if token_id and token_id != claims.token_id:
                    raise InvalidArgumentError(
                        f"token_id {token_id!r} is not the id of the token given"
                    )
                token_id, expires_s = claims.token_id, claims.expires_s
            record = self.access.revoked.revoke(token_id, expires_s)
        except AccessDeniedError as exc:
            bad = InvalidArgumentError(f"nothing revoked: {exc.message}")
            return pb.RevokeTokenResponse(status=_status(bad))
        except InvalidArgumentError as exc:
            return pb.RevokeTokenResponse(status=_status(exc))
        closed = self.drop_token_connections(token_id)
        # Its nodes are dropped at the master's next tick, as a node silent past its grace
        # would be: no put or read goes to them from then on (they keep the grants they hold).
        dropped = []
        for node_id, used in list(self.node_tokens.items()):
            if self.table.node(node_id) is None:  # gone since it mounted: forgotten here too
                del self.node_tokens[node_id]
            elif used == token_id:
                self.drop_revoked_node(node_id)
                dropped.append(node_id)
        dropped.sort()
        if record is not None:
            try:
                await self.store.write(revoked=[record])
            except Exception as exc:  # refused here meanwhile, not after a restart: a retry
                log.error("recording the revocation of token %s failed: %s", token_id, exc)
                problem = (  # writes it again (revocations.py)
                    f"token {token_id} is refused by this master, but its revocation could "
                    f"not be recorded ({exc}): a restarted master would accept it; retry"
                )
                return pb.RevokeTokenResponse(status=_status(MooncakeError(problem)))
            self.access.revoked.saved(token_id)
        log.warning("admin token %s revoked token %s (%d framed connections closed, nodes "
                    "dropped: %s)", caller.token_id, token_id, closed,
                    ", ".join(dropped) or "none")  # fmt: skip
        return pb.RevokeTokenResponse(
            status=_OK, already_revoked=record is None, connections_closed=closed,
            node_ids_dropped=dropped,
        )  # fmt: skip

    async def ListRevokedTokens(
        self, request: pb.ListRevokedTokensRequest, context: object
    ) -> pb.ListRevokedTokensResponse:
        return pb.ListRevokedTokensResponse(
            status=_OK,
            tokens=[
                pb.RevokedToken(token_id=r.token_id, expires_s=r.expires_s, revoked_s=r.revoked_s)
                for r in self.access.revoked.listed()
            ],
        )


def add_to_server(servicer: MasterServicer, server: grpc.aio.Server) -> None:
    pb_grpc.add_MasterServiceServicer_to_server(servicer, server)
