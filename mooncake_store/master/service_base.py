"""What the master service's method groups share: the protobuf reply helpers, the servicer's
state (set by `MasterServicer.__init__`) and `persist_dirty`.

The method groups (`service_puts.py`, `service_reads.py`, `service_nodes.py`) are bases of
`MasterServicer` (service.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from typing import Protocol

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.clock import expiry_ms
from mooncake_store.common.errors import OK, MooncakeError
from mooncake_store.common.grant import GrantMode, sign
from mooncake_store.master.access import AccessControl
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.corruption import RecentChecks, Verifier
from mooncake_store.master.drain import Drains
from mooncake_store.master.generations import GenerationFloor
from mooncake_store.master.grpc_owners import GrpcOwners
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import Replica
from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.replication import Replication
from mooncake_store.master.segments import Segment, Tier
from mooncake_store.master.tiering import Tiering

log = logging.getLogger("mooncake.master")

_OK = pb.Status(code=OK)


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


class FirstFences(Protocol):
    """Waits (a moment at most) for the first write fences of `node_ids` (server.py
    `_await_first_fences`); True when there was one to wait for."""

    def __call__(
        self, node_ids: Collection[str], push: bool, *, fresh_only: bool = False
    ) -> Awaitable[bool]: ...


class ServicerBase(pb_grpc.MasterServiceServicer):
    """The servicer's state the method groups use (set by `MasterServicer.__init__`)."""

    access: AccessControl
    control_keys: dict[str, bytes]  # node id -> the key signing control requests to it
    node_tokens: dict[str, str]  # node id -> the id of the token it mounted with
    table: ObjectTable
    store: MetadataStore
    config: MasterConfig
    tiering: Tiering
    replication: Replication
    drains: Drains
    liveness_port: int
    verify_extents: Verifier | None  # hashes extents on their nodes (corruption.py)
    recent_checks: RecentChecks  # keys whose replicas checked out lately
    grpc_owners: GrpcOwners  # gRPC connections that started puts (grpc_owners.py)
    fence_now: Callable[[], Awaitable[None]] | None  # pushes write fences (server.py)
    fence_soon: Callable[[str], None] | None  # a node's first fence, soon (server.py)
    first_fences: FirstFences | None  # waits for them (server.py)
    master_run: int  # this master process's run: random, new at every start (generations.py)
    generation_floor: GenerationFloor | None  # the data directory's (None: no directory)
    _fence_waits_off_until: float  # time.monotonic(): puts do not wait for fences until then
    _committing: dict[str, asyncio.Future[None]]  # key -> its commit's outcome
    _persisting: set[asyncio.Future[None]]  # persist_dirty's metadata writes in flight
    persist_failures: int  # persist_dirty writes that failed, ever

    async def persist_dirty(self) -> None:
        """Write what evictions, moves and adoptions changed (durable before replies).  When
        the write fails, the keys stay dirty: the next tick writes them again."""
        dirty = self.table.take_dirty()
        if dirty.puts or dirty.deletes or dirty.releases or dirty.segments or dirty.detached:
            write = asyncio.ensure_future(
                self.store.write(puts=dirty.puts, deletes=dirty.deletes, releases=dirty.releases,
                                 segments=dirty.segments, detached=dirty.detached)
            )  # fmt: skip
            self._persisting.add(write)
            try:
                await write
            except BaseException:
                self.persist_failures += 1
                self.table.mark_dirty([*(m.key for m in dirty.puts), *dirty.deletes])
                self.table.releases.mark_dirty(dirty.releases)
                self.table.new_persistent += dirty.segments
                self.table.detached.mark_dirty(dirty.detached)
                raise
            finally:
                self._persisting.discard(write)

    async def persisted(self, failures: int) -> bool:
        """Wait for the `persist_dirty` writes in flight now; False when one of them, or any
        since `persist_failures` was `failures`, failed (its records are dirty again, for the
        next write)."""
        writes = list(self._persisting)
        if writes:
            await asyncio.wait(writes)
        return self.persist_failures == failures
