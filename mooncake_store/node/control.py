"""The node's control service, called by the master: moves between tiers, releases, checks.

Moves: DRAM -> NVMe (demotion), NVMe -> DRAM (promotion), DRAM -> GPU (promotion of the
hottest blocks), GPU -> DRAM (demotion at the GPU tier's high watermark).  Fetches copy a block
from another node (re-replication, hot replicas, drains) over that node's data path, staged and
checked against the block's checksum before a byte of it lands in the pool.

Moves run on the I/O thread pool.  A demotion checks the DRAM bytes against the block's
checksum, writes them to the NVMe file, syncs it, and only then indexes the block, so the index
never names bytes that are not on disk.  A promotion reads the NVMe bytes into the pool and
checks them; a block that fails is reported as corrupt (the master drops that replica).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import socket
import ssl
import threading
from collections.abc import Callable
from concurrent.futures import Executor

import grpc
from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.addresses import split_host_port
from mooncake_store.common.auth import SIGNATURE_METADATA, RequestVerifier
from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.checksum import checksum
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    ChecksumMismatchError,
    DataPathError,
)
from mooncake_store.common.grant import WriteFence
from mooncake_store.common.shm_fence import FENCE_ACK_GRACE_S
from mooncake_store.common.wire import MAX_ERROR_BYTES, RESPONSE, Op, pack_request
from mooncake_store.node.gpu import GpuTier
from mooncake_store.node.nvme import NvmeTier, aligned
from mooncake_store.node.write_gate import WriteGate

log = logging.getLogger("mooncake.node")


class NodeControl(pb_grpc.NodeServiceServicer):
    def __init__(self, dram: dict[int, memoryview], nvme: dict[int, NvmeTier],
                 gpu: dict[int, GpuTier], executor: Executor, *,
                 tls: ssl.SSLContext | None = None,
                 gate: WriteGate | None = None,
                 verifier: RequestVerifier | None = None,
                 fetch_timeout_s: float = 30.0) -> None:  # fmt: skip
        self.verifier = verifier  # None: the node has no token (its master runs --auth off)
        self.refused = 0
        self.dram = dram
        self.gate = gate if gate is not None else WriteGate()  # the data path's (DataAccess)
        self.fetch_timeout_s = fetch_timeout_s  # connect and each read of a fetch
        self.tls = tls  # the client context of fetches from other nodes (None: plaintext)
        self.nvme = nvme
        self.gpu = gpu
        self.executor = executor
        self.demoted = 0
        self.promoted = 0
        self.fetched = 0
        self.fetched_bytes = 0
        self.checksum_failures = 0  # blocks that failed their checksum in a move or a fetch
        self._local = threading.local()  # each I/O thread's fetch staging buffer
        # The run of the master whose mount reply the node took last (0: none yet): set by
        # the node once its master link exists (node/master_link.py `master_run`).
        self.master_run: Callable[[], int] = lambda: 0

    async def _check(self, method: str, request: Message, context: object) -> None:
        """Abort the call (PERMISSION_DENIED) unless the master signed this very request."""
        if self.verifier is None:
            return
        ctx: grpc.aio.ServicerContext = context  # type: ignore[assignment]
        signature = ""
        for key, value in ctx.invocation_metadata() or ():
            if key == SIGNATURE_METADATA:
                signature = value if isinstance(value, str) else value.decode()
        try:
            self.verifier.verify(method, request.SerializeToString(deterministic=True), signature)
        except AccessDeniedError as exc:
            self.refused += 1
            log.warning("refused a %s request: %s", method, exc)
            await ctx.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))

    def _other_run(self, method: str, run: int) -> str | None:
        """Why a master-signed request of master run `run` is refused: that run is not the one
        whose mount reply the node took last.  Before the node's first mount reply (its own
        run 0) every run is taken; after it, a request naming no run (0) is refused too: every
        master names its run.  A master that lost its place (a failover left it running)
        still holds the node's control key; it must not move fences, copy into DRAM room or
        make the NVMe tier forget extents the master that mounted the node now allocates."""
        mine = self.master_run()
        if not mine or run == mine:
            return None
        self.refused += 1
        named = f"master run {run:x}" if run else "no master run"
        return (
            f"{method} naming {named}, but this node's last mount reply came from run "
            f"{mine:x}: refused (only the master that mounted the node acts on it)"
        )

    def _copy_refused(self, method: str, run: int, segment_id: int) -> pb.Status | None:
        """Asked again right before a Fetch or Move writes into a DRAM segment: the request was
        checked when it came (`_other_run`), but its copy may land seconds later (a slow
        source, an NVMe read), by when another master run may have mounted the node and
        handed that room to its own puts."""
        problem = self._other_run(method, run)
        if problem is None and not self.gate.takes_master_copies(segment_id):
            problem = f"{method} into segment {segment_id:x}, which is being mounted again"
        if problem is None:
            return None
        return pb.Status(code=AccessDeniedError.code, message=problem + "; nothing was written")

    async def Move(self, request: pb.MoveRequest, context: object) -> pb.MoveResponse:
        await self._check("Move", request, context)
        problem = self._other_run("Move", request.master_run)
        if problem is not None:
            refused = pb.Status(code=AccessDeniedError.code, message=problem)
            return pb.MoveResponse(statuses=[refused] * len(request.tasks))
        loop = asyncio.get_running_loop()
        statuses = await loop.run_in_executor(
            self.executor, self._move_all, list(request.tasks), request.master_run
        )
        return pb.MoveResponse(statuses=statuses)

    def _move_all(self, tasks: list[pb.MoveTask], run: int) -> list[pb.Status]:
        statuses: list[pb.Status] = []
        indexed: dict[int, list[tuple[int, BlockRecord]]] = {}
        for i, task in enumerate(tasks):
            refused = self._copy_refused("Move", run, task.dst_segment)
            if task.dst_segment in self.dram and refused is not None:
                statuses.append(refused)
                continue
            try:
                block = self._move(task)
            except (ChecksumMismatchError, DataPathError) as exc:
                statuses.append(pb.Status(code=exc.code, message=exc.message))
                continue
            except (OSError, ValueError) as exc:
                statuses.append(pb.Status(code=DataPathError.code, message=f"move failed: {exc}"))
                continue
            statuses.append(pb.Status(code=OK))
            if block is not None:
                indexed.setdefault(task.dst_segment, []).append((i, block))
        for segment_id, entries in indexed.items():
            tier = self.nvme[segment_id]
            try:
                tier.sync()
                tier.index([block for _, block in entries])
                self.demoted += len(entries)
            except OSError as exc:
                for i, _ in entries:
                    statuses[i] = pb.Status(code=DataPathError.code, message=f"sync failed: {exc}")
        return statuses

    def _move(self, task: pb.MoveTask) -> BlockRecord | None:
        """Copy a block between DRAM and a staged tier (NVMe or GPU), checking its checksum:
        the DRAM source before it is written out, the DRAM destination after it is read in.
        A block written to NVMe comes back as the record to index."""
        extent = aligned(task.size_bytes)
        src, dst = task.src_segment, task.dst_segment
        out_to = self.nvme.get(dst) or self.gpu.get(dst)
        if src in self.dram and out_to is not None:
            source = self.dram[src][task.src_offset : task.src_offset + extent]
            if checksum(source[: task.size_bytes]) != task.checksum:
                self.checksum_failures += 1
                raise ChecksumMismatchError(f"DRAM copy of {task.key!r} is corrupt")
            out_to.write(source, task.dst_offset)
            if dst in self.nvme:  # demoted: the caller indexes it
                return BlockRecord(
                    task.key, task.dst_offset, task.size_bytes, task.checksum,
                    bytes(task.fingerprint), task.parent_key, bytes(task.tag),
                )  # fmt: skip
            self.promoted += 1  # up to the GPU
            return None
        in_from = self.nvme.get(src) or self.gpu.get(src)
        if dst in self.dram and in_from is not None:
            dest = self.dram[dst][task.dst_offset : task.dst_offset + extent]
            in_from.read(dest, task.src_offset)
            if checksum(dest[: task.size_bytes]) != task.checksum:
                self.checksum_failures += 1
                tier = "NVMe" if src in self.nvme else "GPU"
                raise ChecksumMismatchError(f"{tier} copy of {task.key!r} is corrupt")
            if src in self.nvme:
                self.promoted += 1  # up from NVMe
            else:
                self.demoted += 1  # down from the GPU
            return None
        raise DataPathError(f"no move from segment {src:x} to {dst:x}")

    async def Verify(self, request: pb.VerifyRequest, context: object) -> pb.VerifyResponse:
        """Hash each extent where it lies and compare it with its recorded checksum (the master
        checks a reader's corrupt report this way before deleting anything)."""
        await self._check("Verify", request, context)
        loop = asyncio.get_running_loop()
        extents = list(request.extents)
        statuses = await loop.run_in_executor(
            self.executor, lambda: [self._verify(e) for e in extents]
        )
        return pb.VerifyResponse(statuses=statuses)

    def _verify(self, extent: pb.VerifyExtent) -> pb.Status:
        size, offset = extent.size_bytes, extent.offset
        pool = self.dram.get(extent.segment_id)
        staged = self.nvme.get(extent.segment_id) or self.gpu.get(extent.segment_id)
        try:
            if pool is not None:
                if size <= 0 or offset + size > len(pool):
                    return pb.Status(code=DataPathError.code, message="extent is out of the pool")
                data = pool[offset : offset + size]
            elif staged is not None:
                page_aligned = memoryview(mmap.mmap(-1, aligned(size)))  # O_DIRECT wants it
                staged.read(page_aligned, offset)
                data = page_aligned[:size]
            else:
                return pb.Status(code=DataPathError.code, message="no such segment on this node")
        except (OSError, ValueError) as exc:
            return pb.Status(code=DataPathError.code, message=f"read failed: {exc}")
        if checksum(data) != extent.checksum:
            return pb.Status(
                code=ChecksumMismatchError.code, message="the extent fails its checksum"
            )
        return pb.Status(code=OK)

    async def Fetch(self, request: pb.FetchRequest, context: object) -> pb.FetchResponse:
        await self._check("Fetch", request, context)
        problem = self._other_run("Fetch", request.master_run)
        if problem is not None:
            refused = pb.Status(code=AccessDeniedError.code, message=problem)
            return pb.FetchResponse(statuses=[refused] * len(request.tasks))
        loop = asyncio.get_running_loop()
        statuses = await loop.run_in_executor(
            self.executor, self._fetch_all, list(request.tasks), request.master_run
        )
        return pb.FetchResponse(statuses=statuses)

    def _fetch_all(self, tasks: list[pb.FetchTask], run: int) -> list[pb.Status]:
        """Fetch each block, reusing one connection per source node."""
        conns: dict[str, socket.socket] = {}
        try:
            return [self._fetch(t, conns, run) for t in tasks]
        finally:
            for sock in conns.values():
                sock.close()

    def _staging(self, size_bytes: int) -> memoryview:
        """This I/O thread's staging buffer, at least `size_bytes` (kept: its pages stay warm)."""
        buf: bytearray | None = getattr(self._local, "staging", None)
        if buf is None or len(buf) < size_bytes:
            buf = self._local.staging = bytearray(size_bytes)
        return memoryview(buf)[:size_bytes]

    def _fetch(self, task: pb.FetchTask, conns: dict[str, socket.socket], run: int) -> pb.Status:
        """Read a block from another node's data path into a staging buffer, check it against
        the block's checksum, and only then copy it into this node's pool: a bad or broken
        source never writes a byte into the pool."""
        pool = self.dram.get(task.dst_segment)
        if pool is None:
            return pb.Status(code=DataPathError.code, message="fetch target is not a DRAM segment")
        if task.dst_offset + task.size_bytes > len(pool) or task.size_bytes <= 0:
            return pb.Status(code=DataPathError.code, message="fetch target is out of the pool")
        staged = self._staging(task.size_bytes)
        try:
            sock = conns.get(task.src_endpoint)
            if sock is None:
                host, port = split_host_port(task.src_endpoint)
                sock = socket.create_connection((host, port), self.fetch_timeout_s)
                if self.tls is not None:
                    sock = self.tls.wrap_socket(sock, server_hostname=host)
                conns[task.src_endpoint] = sock
            sock.sendall(pack_request(Op.READ, task.grant, task.src_offset, task.size_bytes))
            header = bytearray(RESPONSE.size)
            _recv_exact(sock, memoryview(header))
            status, _, length = RESPONSE.unpack(header)
            if status != OK:
                message = bytearray(min(length, MAX_ERROR_BYTES))
                _recv_exact(sock, memoryview(message))
                conns.pop(task.src_endpoint).close()  # the source may close it: start afresh
                return pb.Status(code=status, message=message.decode(errors="replace"))
            if length != task.size_bytes:
                conns.pop(task.src_endpoint).close()
                return pb.Status(code=DataPathError.code, message="source sent a wrong size")
            _recv_exact(sock, staged)
        except (OSError, ValueError) as exc:  # ValueError: a malformed endpoint
            dropped = conns.pop(task.src_endpoint, None)
            if dropped is not None:
                dropped.close()
            return pb.Status(code=DataPathError.code, message=f"fetch failed: {exc}")
        if checksum(staged) != task.checksum:
            self.checksum_failures += 1
            problem = f"fetched copy of {task.key!r} failed its checksum; nothing was written"
            return pb.Status(code=ChecksumMismatchError.code, message=problem)
        refused = self._copy_refused("Fetch", run, task.dst_segment)
        if refused is not None:
            return refused
        pool[task.dst_offset : task.dst_offset + task.size_bytes] = staged
        self.fetched += 1
        self.fetched_bytes += task.size_bytes
        return pb.Status(code=OK)

    async def FenceWrites(self, request: pb.FenceWritesRequest, context: object) -> pb.Status:
        """The master's write fences (issue 11): each replaces the segment's previous pushed
        one (node/write_gate.py, which also shows it to same-host clients), and the seals of
        the generations it ends are dropped.
        Master-signed like Fetch/Move/Release: an unsigned fence could lower the floor and
        make ended write grants work again."""
        await self._check("FenceWrites", request, context)
        problem = self._other_run("FenceWrites", request.master_run)
        if problem is not None:
            for fence in request.fences:  # not taken, but that run's generations are out
                if fence.segment_id in self.dram:
                    self.gate.saw(WriteFence(fence.floor, frozenset(fence.open)))
            return pb.Status(code=AccessDeniedError.code, message=problem)
        now_ms = self.gate.clock.now_ms()
        for fence in request.fences:
            if fence.segment_id in self.dram:
                fenced = WriteFence(fence.floor, frozenset(fence.open))
                self.gate.fenced(fence.segment_id, fenced, now_ms)
        # The master frees the room of the puts a fence ends once it is acknowledged: give a
        # same-host copy that checked the fences just before it was published time to land
        # (common/shm_fence.py).
        await asyncio.sleep(FENCE_ACK_GRACE_S)
        return pb.Status(code=OK)

    async def Release(self, request: pb.ReleaseRequest, context: object) -> pb.Status:
        await self._check("Release", request, context)
        problem = self._other_run("Release", request.master_run)
        if problem is not None:
            return pb.Status(code=AccessDeniedError.code, message=problem)
        tier = self.nvme.get(request.segment_id)
        loop = asyncio.get_running_loop()
        if tier is not None and request.blocks:  # `offsets` too, for nodes that predate it
            blocks = [(b.offset, b.key, b.checksum) for b in request.blocks]
            await loop.run_in_executor(self.executor, tier.release, blocks)
        elif tier is not None and request.offsets:  # an older master's: by offset alone
            await loop.run_in_executor(self.executor, tier.forget, list(request.offsets))
        return pb.Status(code=OK)


def _recv_exact(sock: socket.socket, dest: memoryview) -> None:
    got = 0
    while got < len(dest):
        n = sock.recv_into(dest[got:])
        if n == 0:
            raise OSError("source node closed the connection")
        got += n
