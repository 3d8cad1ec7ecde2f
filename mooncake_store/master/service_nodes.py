"""The master service's node methods: mounts (node keys, identity conflicts), heartbeats,
unmounts, drains and the node list.  A node token's caller proves each call with its node
secret (`AccessControl.check_node_proof`).

`NodeMethods` is a base of `MasterServicer` (service.py).
"""

from __future__ import annotations

import asyncio
import logging
import time

from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.auth import Role, control_key, grant_key, sign_request
from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.daemon import StartupError
from mooncake_store.common.errors import (
    AccessDeniedError,
    IdentityConflictError,
    InvalidArgumentError,
    MooncakeError,
    SegmentNotFoundError,
)
from mooncake_store.master.access import Caller
from mooncake_store.master.generations import past_earlier_run
from mooncake_store.master.liveness import master_time_reply, signed_master_time
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from mooncake_store.master.service_base import _OK, ServicerBase, _status

log = logging.getLogger("mooncake.master")


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


class NodeMethods(ServicerBase):
    """The node and membership methods (see the module docstring)."""

    # ---- nodes -------------------------------------------------------------------------------

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

    def drop_revoked_node(self, node_id: str) -> None:
        """A node whose token was revoked: its heartbeats are forgotten, so the next tick drops
        it as a silent node (membership.py), and the revocation forgets it too."""
        self.table.heartbeats.forget(node_id)
        self.node_tokens.pop(node_id, None)

    async def MountSegment(
        self, request: pb.MountSegmentRequest, context: object
    ) -> pb.MountSegmentResponse:
        caller = self.access.caller(context)
        try:
            secret, control = self._node_keys(request, caller)
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
        unusable = self._generations_past(request)
        if unusable is not None:
            return pb.MountSegmentResponse(status=_status(unusable))
        known = self.table.node(node.node_id)
        fresh = known is None or known.info.incarnation != node.incarnation
        other = self.table.identity_conflict(node)
        # Another process mounted under this id and still heartbeats.  If its data endpoint
        # refuses connections it is gone (killed and restarted elsewhere): replace it.
        replace = other is not None and not await _listening(other.endpoint)
        if caller.token_id and caller.token_id in self.access.revoked:  # revoked meanwhile
            gone = AccessDeniedError(f"token {caller.token_id} was revoked")
            log.warning("refused a mount of node %r: %s", request.node_id, gone)
            return pb.MountSegmentResponse(status=_status(gone))
        try:
            self.table.mount(node, segments, replace=replace, remount=request.remount)
        except IdentityConflictError as exc:
            log.error("refused the mount of node %s: %s", node.node_id, exc.message)
            return pb.MountSegmentResponse(status=_status(exc))
        if control:  # the keys of the incarnation that mounted, once it has
            self.control_keys[node.node_id] = control
        if caller.token_id:  # revoking that token drops the node (RevokeToken)
            self.node_tokens[node.node_id] = caller.token_id
        else:
            self.node_tokens.pop(node.node_id, None)
        await self.persist_dirty()
        if caller.token_id and caller.token_id in self.access.revoked:
            # Revoked while the mount was being persisted (after RevokeToken looked for its
            # nodes): dropped at the next tick, as RevokeToken drops them.
            self.drop_revoked_node(node.node_id)
            gone = AccessDeniedError(f"token {caller.token_id} was revoked")
            return pb.MountSegmentResponse(status=_status(gone))
        if fresh:
            log.info(
                "mounted node %s (incarnation %x) at %s: %s",
                node.node_id,
                node.incarnation,
                node.endpoint,
                ", ".join(f"{i.tier.value} {i.size_bytes} bytes" for i, _ in segments),
            )
        # Taken after the awaits above, with no await until the reply: every put started
        # on these segments so far is in `open`, every later one is at or above `floor`.
        fences = [
            pb.WriteFence(segment_id=s, floor=f, open=sorted(o))
            for s, f, o in self.table.mount_fences(i.segment_id for i, _ in segments)
        ]
        if self.fence_soon is not None and self.table.awaiting_first_fence([node.node_id]):
            self.fence_soon(node.node_id)  # its first fence of this run opens it to puts
        key = self.control_keys.get(node.node_id)
        now_ms, time_signature = signed_master_time(
            key, node.node_id, node.incarnation, request.nonce
        )
        signature = ""
        if key is not None:  # signed as FenceWrites is: a node lowers its fence for no one else
            body = pb.FenceWritesRequest(fences=fences).SerializeToString(deterministic=True)
            signature = sign_request(key, "MountFences", body, now_ms / 1000)
        return pb.MountSegmentResponse(
            status=_OK,
            heartbeat_interval_s=self.config.heartbeat_interval_s,
            heartbeat_ttl_s=self.config.heartbeat_ttl_s,
            liveness_port=self.liveness_port,
            fences=fences,
            fences_signature=signature,
            master_run=self.master_run,
            master_time_ms=now_ms,
            time_signature=time_signature,
        )

    def _generations_past(self, request: pb.MountSegmentRequest) -> MooncakeError | None:
        """Before a mount: hand out generations past those of the earlier master run that
        mounted this node last (its grants may still be out: generations.py), with the floor
        file moved past them first.  The error to refuse the mount with, or None."""
        try:
            start = past_earlier_run(
                self.master_run, request.master_run, request.generation_seen,
                self.table.next_generation,
            )  # fmt: skip
        except ValueError as exc:
            return InvalidArgumentError(str(exc))
        if not start:
            return None
        if self.generation_floor is not None:
            try:
                self.generation_floor.reserve(start)
            except StartupError as exc:
                return MooncakeError(exc.args[0] if exc.args else str(exc))
        log.warning(
            "node %s was mounted by another master run and saw put generation %d, past this "
            "run's next (%d; the data directory went back in time, or is new): later puts are "
            "named from %d", request.node_id, request.generation_seen,
            self.table.next_generation, start,
        )  # fmt: skip
        self.table.generations_from(start)
        return None

    async def Heartbeat(
        self, request: pb.HeartbeatRequest, context: object
    ) -> pb.HeartbeatResponse:
        try:
            self._check_node(request.node_id, context)
            self._check_node_proof("Heartbeat", request, context)
        except AccessDeniedError as refused:
            return pb.HeartbeatResponse(status=_status(refused))
        if self.table.heartbeat(request.node_id, request.incarnation):
            return master_time_reply(request, self.control_keys.get(request.node_id))
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
        if self.table.node(request.node_id) is None:
            self.node_tokens.pop(request.node_id, None)
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
        """One row per mounted segment of every mounted node, suspect ones too, with the
        node's condition (issue 11: an operator sees a suspect or draining node)."""
        now = time.monotonic()
        rows = []
        for state, condition, drop_in_s in self.table.node_conditions():
            age_s = max(0.0, now - self.table.last_heartbeat(state.info.node_id))
            for segment_id in state.segment_ids:
                s = self.table.mounted_segment(segment_id)
                if s is None:
                    continue
                rows.append(
                    pb.NodeInfo(
                        node_id=s.node_id,
                        segment_id=s.segment_id,
                        endpoint=s.info.node.endpoint,
                        tier=s.tier.value,
                        size_bytes=s.allocator.capacity_bytes,
                        used_bytes=s.allocator.used_bytes - s.leased_bytes,  # leases: apart
                        objects=s.objects - s.leases,
                        leases=s.leases,
                        leased_bytes=s.leased_bytes,
                        last_heartbeat_age_s=age_s,
                        incarnation=s.info.node.incarnation,
                        state=condition.value,
                        drop_in_s=drop_in_s,
                    )
                )
        return pb.ListNodesResponse(nodes=rows)
