"""The master's shell around tier movement: calls each node's NodeService.

`Tiering` (pure) plans moves and reserves their destinations; this module sends each node its
batch, reports the outcome back (`Tiering.complete`), and forwards the persistent-tier extents
the table freed (`Release`), so a node's index never outlives the master's records for long.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.auth import SIGNATURE_METADATA, sign_request
from mooncake_store.common.clock import SIGNED_OFFSETS, expiry_ms
from mooncake_store.common.errors import OK, ChecksumMismatchError
from mooncake_store.common.grant import Grant, GrantMode, sign_grant
from mooncake_store.common.tls import PLAINTEXT, TlsConfig
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.releases import BlockName
from mooncake_store.master.replication import CopyTask, Replication
from mooncake_store.master.segments import Segment
from mooncake_store.master.tiering import MoveTask, Tiering

log = logging.getLogger("mooncake.master")

T = TypeVar("T", MoveTask, CopyTask)

_REPEAT_WARNING_S = 60.0


class RepeatedWarnings:
    """Say each node's repeated failure once, then at most every `every_s` with how many went
    unsaid: a fence that a node refuses is sent again at every tick (4 a second), and so would
    its warning be (a master that lost its place to another logs that for every node)."""

    def __init__(
        self, every_s: float = _REPEAT_WARNING_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last: dict[str, tuple[float, int]] = {}  # node id: (when said, unsaid since)

    def warn(self, node_id: str, message: str, *args: object) -> bool:
        """Log `message % args` for `node_id` unless said less than `every_s` ago."""
        now = self._clock()
        said = self._last.get(node_id)
        if said is not None and now - said[0] < self.every_s:
            self._last[node_id] = (said[0], said[1] + 1)
            return False
        unsaid = said[1] if said is not None else 0
        suffix = f" ({unsaid} more since it was last logged)" if unsaid else ""
        log.warning(message + suffix, *args)
        self._last[node_id] = (now, 0)
        return True

    def clear(self, node_id: str) -> None:
        """The failure is over: the next one is said at once."""
        self._last.pop(node_id, None)


class NodeMover:
    def __init__(
        self, table: ObjectTable, tiering: Tiering, *, timeout_s: float = 60.0,
        tls: TlsConfig = PLAINTEXT,
    ) -> None:  # fmt: skip
        self.table = table
        self.tls = tls
        self._credentials = tls.grpc_channel_credentials() if tls.serves else None
        self.tiering = tiering
        self.timeout_s = timeout_s
        self.verify_timeout_s = 10.0  # a Verify call (hashes at memory speed: ample)
        self._channels: dict[str, tuple[str, grpc.aio.Channel, pb_grpc.NodeServiceStub]] = {}
        #: Per node id, the key that signs its control requests (set at mount; empty: auth off).
        self.control_keys: dict[str, bytes] = {}
        # Named in every control request (set by the server: the servicer's run); nodes act
        # only for the run whose mount reply they took last (node/control.py `_other_run`).
        self.master_run = 0
        self._fence_warnings = RepeatedWarnings()
        self._release_warnings = RepeatedWarnings()

    def _signed(self, node_id: str, method: str, request: Message) -> list[tuple[str, str]]:
        """The metadata that makes `request` a master-signed one for `node_id`."""
        key = self.control_keys.get(node_id)
        if key is None:
            return []
        body = request.SerializeToString(deterministic=True)
        # Stamped with the master's clock, which nodes follow (common/clock.py).
        return [(SIGNATURE_METADATA, sign_request(key, method, body, SIGNED_OFFSETS.now_s()))]

    def _stub(self, node_id: str) -> pb_grpc.NodeServiceStub | None:
        state = self.table.node(node_id)
        if state is None or not state.info.control_endpoint:
            return None
        endpoint = state.info.control_endpoint
        cached = self._channels.get(node_id)
        if cached is not None and cached[0] == endpoint:
            return cached[2]
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(endpoint, self._credentials)
        else:
            channel = grpc.aio.insecure_channel(endpoint)
        stub = pb_grpc.NodeServiceStub(channel)
        self._channels[node_id] = (endpoint, channel, stub)
        return stub

    def run(self, tasks: list[MoveTask]) -> dict[str, Coroutine[Any, Any, None]]:
        """One coroutine per node carrying out its moves."""
        by_node: dict[str, list[MoveTask]] = defaultdict(list)
        for task in tasks:
            by_node[task.node_id].append(task)
        return {n: self._run_node(n, ts) for n, ts in by_node.items()}

    def _live(self, tasks: list[T], complete: Callable[[T, bool], object]) -> list[T]:
        """The tasks whose source and destination are still the mounts they were planned for;
        the others (a mount gone while the tick's write was on its way) end as failed."""
        mounted = self.table.mounted_segment
        live = []
        for task in tasks:
            if (
                mounted(task.src.segment_id) is task.src
                and mounted(task.dst.segment_id) is task.dst
            ):
                live.append(task)
            else:
                complete(task, False)
        return live

    async def _run_node(self, node_id: str, tasks: list[MoveTask]) -> None:
        tasks = self._live(tasks, self.tiering.complete)
        if not tasks:
            return
        stub = self._stub(node_id)
        codes = [-1] * len(tasks)
        if stub is not None:
            request = pb.MoveRequest(tasks=[
                pb.MoveTask(
                    key=t.key, src_segment=t.src.segment_id, src_offset=t.source.offset,
                    dst_segment=t.dst.segment_id, dst_offset=t.dst_offset,
                    size_bytes=t.size_bytes, checksum=t.checksum, fingerprint=t.fingerprint,
                    parent_key=t.parent_key, tag=t.tag,
                )
                for t in tasks
            ], master_run=self.master_run)  # fmt: skip
            try:
                signed = self._signed(node_id, "Move", request)
                reply = await stub.Move(request, timeout=self.timeout_s, metadata=signed)
                codes = [s.code for s in reply.statuses]
            except grpc.aio.AioRpcError as exc:
                log.warning("moves on node %s failed: %s", node_id, exc.code().name)
        for task, code in zip(tasks, codes, strict=True):
            self.tiering.complete(task, code == OK, corrupt=code == ChecksumMismatchError.code)

    def copy(self, tasks: list[CopyTask],
             replication: Replication) -> dict[str, Coroutine[Any, Any, None]]:  # fmt: skip
        """One coroutine per destination node carrying out its copies."""
        by_node: dict[str, list[CopyTask]] = defaultdict(list)
        for task in tasks:
            by_node[task.dst.node_id].append(task)
        return {n: self._copy_node(n, ts, replication) for n, ts in by_node.items()}

    async def _copy_node(self, node_id: str, tasks: list[CopyTask],
                         replication: Replication) -> None:  # fmt: skip
        tasks = self._live(tasks, replication.complete)
        if not tasks:
            return
        stub = self._stub(node_id)
        codes = [-1] * len(tasks)
        if stub is not None:
            fetches = []
            for t in tasks:
                node = t.src.info.node
                grant = Grant(t.src.segment_id, t.source.offset, t.size_bytes,
                              expiry_ms(t.lease_until_s), GrantMode.READ)  # fmt: skip
                fetches.append(pb.FetchTask(
                    key=t.key, src_endpoint=node.endpoint, grant=sign_grant(node.secret, grant),
                    src_offset=t.source.offset, size_bytes=t.size_bytes, checksum=t.checksum,
                    dst_segment=t.dst.segment_id, dst_offset=t.dst_offset,
                ))  # fmt: skip
            try:
                request = pb.FetchRequest(tasks=fetches, master_run=self.master_run)
                signed = self._signed(node_id, "Fetch", request)
                reply = await stub.Fetch(request, timeout=self.timeout_s, metadata=signed)
                codes = [s.code for s in reply.statuses]
            except grpc.aio.AioRpcError as exc:
                log.warning("copies to node %s failed: %s", node_id, exc.code().name)
        for task, code in zip(tasks, codes, strict=True):
            replication.complete(task, code == OK)

    async def release(
        self, released: dict[int, list[tuple[int, BlockName]]], generations: dict[int, int]
    ) -> None:
        """Send each segment's owed releases (frees.py `take_released`) to its node, if it is
        still the mount they were taken for (`generations`); else its new mount checked them
        against its inventory already."""
        for segment_id, blocks in released.items():
            offsets = [offset for offset, _ in blocks]
            seg = self.table.mounted_segment(segment_id)  # a suspect node is told too
            generation = generations.get(segment_id)
            if seg is None or seg.generation != generation:
                continue  # mounted again, or gone: its next mount reconciles
            stub = self._stub(seg.node_id)
            if stub is None:
                self.table.release_again(segment_id, offsets, generation)
                continue
            try:
                request = pb.ReleaseRequest(  # `offsets` for nodes that predate `blocks`
                    segment_id=segment_id, master_run=self.master_run, offsets=offsets,
                    blocks=[pb.ReleasedBlock(offset=offset, key=name.key, checksum=name.checksum)
                            for offset, name in blocks],
                )  # fmt: skip
                signed = self._signed(seg.node_id, "Release", request)
                status = await stub.Release(request, timeout=5.0, metadata=signed)
            except grpc.aio.AioRpcError as exc:
                problem = f"failed: {exc.code().name}"
            else:
                problem = "" if status.code == OK else f"was refused: {status.message}"
            node_id = seg.node_id
            if problem:  # sent again at the next tick (unless allocated again meanwhile)
                self._release_warnings.warn(node_id, "release on node %s %s", node_id, problem)
                self.table.release_again(segment_id, offsets, generation)
            else:
                self._release_warnings.clear(node_id)
                self.table.release_done(segment_id, offsets, generation)

    async def fence(
        self, fences: list[tuple[Segment, int, frozenset[int]]], timeout_s: float = 5.0
    ) -> None:
        """Send each node the write fences of its segments; report each one taken."""
        by_node: dict[str, list[tuple[Segment, int, frozenset[int]]]] = defaultdict(list)
        for fence in fences:
            by_node[fence[0].node_id].append(fence)

        async def send(node_id: str, mine: list[tuple[Segment, int, frozenset[int]]]) -> None:
            stub = self._stub(node_id)
            if stub is None:
                return
            request = pb.FenceWritesRequest(
                fences=[
                    pb.WriteFence(segment_id=seg.segment_id, floor=floor, open=sorted(open_))
                    for seg, floor, open_ in mine
                ],
                master_run=self.master_run,
            )
            try:
                signed = self._signed(node_id, "FenceWrites", request)
                status = await stub.FenceWrites(request, timeout=timeout_s, metadata=signed)
            except grpc.aio.AioRpcError as exc:
                self._fence_warnings.warn(
                    node_id, "write fence on node %s failed: %s", node_id, exc.code().name
                )
                self.table.fence_failed()
                return
            if status.code != OK:  # not taken (this run's mount reply not applied there yet)
                self._fence_warnings.warn(
                    node_id, "node %s did not take a write fence: %s", node_id, status.message
                )
                self.table.fence_failed()
                return
            self._fence_warnings.clear(node_id)
            for seg, floor, open_ in mine:
                self.table.fence_acked(seg, floor, open_)

        await asyncio.gather(*(send(n, mine) for n, mine in by_node.items()))

    async def verify(self, extents: list[tuple[Segment, int, int, int]]) -> list[int]:
        """Have each extent's node hash it in place against its checksum; one status code per
        extent (segment, offset, size, checksum): OK, ChecksumMismatchError's, or -1 when its
        node could not tell (unreachable, unknown extent).  Awaits the nodes, never blocks."""
        by_node: dict[str, list[int]] = defaultdict(list)
        for i, (seg, _, _, _) in enumerate(extents):
            by_node[seg.node_id].append(i)
        codes = [-1] * len(extents)

        async def send(node_id: str, mine: list[int]) -> None:
            stub = self._stub(node_id)
            if stub is None:
                return
            request = pb.VerifyRequest(extents=[
                pb.VerifyExtent(segment_id=extents[i][0].segment_id, offset=extents[i][1],
                                size_bytes=extents[i][2], checksum=extents[i][3])
                for i in mine
            ])  # fmt: skip
            try:
                signed = self._signed(node_id, "Verify", request)
                reply = await stub.Verify(request, timeout=self.verify_timeout_s, metadata=signed)
            except grpc.aio.AioRpcError as exc:
                log.warning("verifying extents on node %s failed: %s", node_id, exc.code().name)
                return
            for i, status in zip(mine, reply.statuses, strict=True):
                codes[i] = status.code

        await asyncio.gather(*(send(n, mine) for n, mine in by_node.items()))
        return codes

    async def close(self) -> None:
        for _, channel, _ in self._channels.values():
            await channel.close()
        self._channels.clear()
