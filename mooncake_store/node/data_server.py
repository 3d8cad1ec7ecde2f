"""The node's TCP data path: framed READ/WRITE straight between sockets and the tiers.

Each connection is an asyncio BufferedProtocol.  For a DRAM segment, `get_buffer` hands out a
slice of the pool itself for WRITE payloads, so the kernel copies bytes directly into place,
and READ replies write a memoryview of the pool.  An NVMe or GPU segment is read (O_DIRECT or
device-to-host, on the I/O thread pool) into a page-aligned staging buffer that is then sent;
clients write only DRAM (blocks reach the other tiers by demotion and promotion).  NVMe reads
are not `sendfile`d: on these machines sendfile was slower than sending from memory at 4 MiB
and above, and it would need the page cache, which O_DIRECT keeps out of the way.  Every
access is checked against a grant signed by the master (segment, extent, mode, expiry) before
a byte moves; a WRITE also against the segment's write gate (node/write_gate.py: the master's
fences, and the bytes its grant already wrote, sealed once its payload has landed).  See
common/wire.py for the framing.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import struct
from concurrent.futures import Executor
from ssl import SSLContext

from mooncake_store.common.checksum import chunk_digests
from mooncake_store.common.errors import OK, AccessDeniedError, DataPathError, GrantExpiredError
from mooncake_store.common.grant import GRANT_BYTES, Grant, GrantMode, verify_grant
from mooncake_store.common.wire import (
    MAGIC,
    MAX_DRAIN_BYTES,
    MAX_READV_ENTRIES,
    READV_ENTRY,
    REQUEST,
    Op,
    pack_response,
)
from mooncake_store.node.gpu import GpuTier
from mooncake_store.node.nvme import NvmeTier, aligned
from mooncake_store.node.write_gate import CUT_OFF, PendingWrite, WriteGate

log = logging.getLogger("mooncake.node")

_MAX_GRANT_BYTES = 256
# Where the payload of a refused WRITE is read and discarded (shared: its bytes are never read,
# and the event loop fills one connection's buffer at a time).
_SCRATCH = memoryview(bytearray(64 * 1024))


class DataAccess:
    """The node's segments plus what it needs to check grants against them."""

    def __init__(self, secret: bytes, io_executor: Executor) -> None:
        self.secret = secret
        self.io_executor = io_executor
        self.dram: dict[int, memoryview] = {}
        self.nvme: dict[int, NvmeTier] = {}
        self.gpu: dict[int, GpuTier] = {}
        # Per DRAM segment, which write grants still work and what they wrote (fences from
        # the mount reply and FenceWrites, seals): node/write_gate.py.
        self.gate = WriteGate()
        self.reads = 0
        self.writes = 0
        self.denied = 0
        self.read_bytes = 0  # bytes sent to clients and peers on the TCP data path
        self.write_bytes = 0  # bytes received into the tiers on the TCP data path

    def staged(self, segment_id: int) -> NvmeTier | GpuTier | None:
        """The tier of a segment that is read through a staging buffer (NVMe, GPU)."""
        return self.nvme.get(segment_id) or self.gpu.get(segment_id)

    def size_of(self, segment_id: int) -> int:
        if segment_id in self.dram:
            return len(self.dram[segment_id])
        tier = self.staged(segment_id)
        return tier.size_bytes if tier is not None else 0

    def check(self, grant_blob: bytes, offset: int, size_bytes: int, mode: GrantMode) -> int:
        """Return the granted segment id, or raise AccessDeniedError."""
        return self._check(grant_blob, offset, size_bytes, mode).segment_id

    def admit_write(self, grant_blob: bytes, offset: int, size_bytes: int) -> PendingWrite:
        """Check a WRITE and note it as being received: `finish_write` once its payload has
        completely landed (its bytes are then sealed against its grant), `abandon_write` when
        it fails part-way.  Raises AccessDeniedError (GrantExpiredError) when refused."""
        grant = self._check(grant_blob, offset, size_bytes, GrantMode.WRITE)
        return self.gate.begin(
            grant.segment_id, grant.generation, offset, offset + size_bytes, grant.expires_ms
        )

    def finish_write(self, write: PendingWrite) -> None:
        self.gate.finish(write, self.gate.clock.now_ms())
        self.writes += 1
        self.write_bytes += write.end - write.start

    def abandon_write(self, write: PendingWrite) -> None:
        self.gate.abandon(write)

    def _check(self, grant_blob: bytes, offset: int, size_bytes: int, mode: GrantMode) -> Grant:
        grant = verify_grant(self.secret, grant_blob)
        problem = None
        refusal: type[AccessDeniedError] = AccessDeniedError
        if grant is None:
            problem = "grant signature is invalid (not issued by this node's master)"
        elif grant.segment_id not in self.dram and self.staged(grant.segment_id) is None:
            problem = f"grant is for segment {grant.segment_id:x}, which this node does not hold"
        elif grant.expires_ms < self.gate.clock.now_ms():  # the master's clock
            problem = "grant expired (put timed out or read lease ended); ask the master again"
            refusal = GrantExpiredError
        elif not grant.covers(offset, size_bytes, mode):
            problem = f"{mode.name} of [{offset}, +{size_bytes}) is outside the granted extent"
        elif offset + size_bytes > self.size_of(grant.segment_id):
            problem = "extent lies beyond the end of the segment"
        elif mode is GrantMode.WRITE and grant.segment_id not in self.dram:
            problem = "only the DRAM tier is written by clients"
        elif mode is GrantMode.WRITE and self.gate.clock.stale():
            problem = (
                "this node has not had the master's time for longer than its heartbeat TTL, "
                "so it cannot tell whether the grant ended: write refused until it hears again"
            )
        elif mode is GrantMode.WRITE:
            problem = self.gate.refusal(
                grant.segment_id, grant.generation, offset, offset + size_bytes
            )
        if problem is not None:
            self.denied += 1
            raise refusal(problem)
        assert grant is not None
        return grant


class _Connection(asyncio.BufferedProtocol):
    def __init__(self, access: DataAccess) -> None:
        self.access = access
        self.transport: asyncio.Transport | None = None
        self._header = bytearray(REQUEST.size)
        self._grant = bytearray(_MAX_GRANT_BYTES)
        self._target: memoryview = memoryview(self._header)
        self._filled = 0
        self._stage = "header"
        self._op = Op.PING
        self._offset = 0
        self._size = 0
        self._grant_len = 0
        self._drain_left = 0  # payload bytes of a refused WRITE still to discard
        self._write: PendingWrite | None = None  # the WRITE whose payload is being received
        self._staging: tuple[NvmeTier | GpuTier, mmap.mmap] | None = None  # last staged reply

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._drop_staging()
        if self._write is not None:  # lost mid-payload: nothing of it is sealed
            self.access.abandon_write(self._write)
            self._write = None

    def get_buffer(self, sizehint: int) -> memoryview:
        write = self._write
        if write is not None and self.access.gate.ended(write.segment_id, write.generation):
            self._cut_off(write)
        return self._target[self._filled :]

    def _cut_off(self, write: PendingWrite) -> None:
        """A fence ended this WRITE's grant while its payload was landing.  The master gives
        the extent to another put once the node answered that fence, so not one more byte
        of the payload goes into the pool (every recv asks `get_buffer` first, on the loop
        that takes fences): the rest is read and discarded, and the WRITE refused."""
        self.access.abandon_write(write)
        self._write = None
        self.access.denied += 1
        self._reply(AccessDeniedError.code, CUT_OFF.encode())
        self._drain_left = len(self._target) - self._filled
        self._drain()

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < len(self._target):
            return
        try:
            self._advance()
        except DataPathError as exc:
            self._fail(exc)

    def _expect(self, stage: str, target: memoryview) -> None:
        self._stage, self._target, self._filled = stage, target, 0
        if len(target) == 0:
            self._advance()

    def _advance(self) -> None:
        if self._stage == "header":
            magic, op, _, grant_len, _, offset, size = REQUEST.unpack(self._header)
            if magic != MAGIC or op not in Op._value2member_map_ or grant_len > _MAX_GRANT_BYTES:
                raise DataPathError("malformed request header")
            self._op, self._offset, self._size, self._grant_len = Op(op), offset, size, grant_len
            if self._op is Op.READV:
                if not 0 < size <= MAX_READV_ENTRIES:
                    raise DataPathError(f"READV of {size} entries (1-{MAX_READV_ENTRIES})")
                entry = READV_ENTRY.size + GRANT_BYTES
                self._expect("readv", memoryview(bytearray(size * entry)))
                return
            self._expect("grant", memoryview(self._grant)[:grant_len])
        elif self._stage == "grant":
            self._dispatch()
        elif self._stage == "readv":
            self._readv(self._target)
        elif self._stage == "payload":
            assert self._write is not None
            self.access.finish_write(self._write)  # sealed: its grant cannot write it again
            self._write = None
            self._reply(OK, b"")
            self._expect("header", memoryview(self._header))
        elif self._stage == "drain":
            self._drain_left -= len(self._target)
            self._drain()

    def _drain(self) -> None:
        """Discard the next piece of a refused WRITE's payload, or go on to the next request."""
        if self._drain_left == 0:
            self._expect("header", memoryview(self._header))
        else:
            self._expect("drain", _SCRATCH[: min(self._drain_left, len(_SCRATCH))])

    def _dispatch(self) -> None:
        grant = bytes(self._grant[: self._grant_len])
        op, offset, size = self._op, self._offset, self._size
        # The client reads a reply completely before its next request, so the previous
        # NVMe staging buffer is no longer referenced by the transport.
        self._drop_staging()
        if op is Op.PING:  # answered only to a holder of one of this node's grants
            if verify_grant(self.access.secret, grant) is None:
                self.access.denied += 1
                raise AccessDeniedError("PING needs a grant signed by this node's master")
            self._reply(OK, b"")
            self._expect("header", memoryview(self._header))
        elif op is Op.DIGESTS:
            segment_id = self.access.check(grant, offset, size, GrantMode.READ)
            dram = self.access.dram.get(segment_id)
            if dram is None:
                raise DataPathError("DIGESTS serves DRAM segments only; read this one whole")
            digests = chunk_digests(dram[offset : offset + size]) if size else []
            assert self.transport is not None
            self.transport.write(pack_response(OK, 8 * len(digests)))
            self.transport.write(struct.pack(f"<{len(digests)}Q", *digests))
            self._expect("header", memoryview(self._header))
        elif op is Op.READ:
            segment_id = self.access.check(grant, offset, size, GrantMode.READ)
            tier = self.access.staged(segment_id)
            if tier is not None:
                self._stage = "busy"
                assert self.transport is not None
                self.transport.pause_reading()
                asyncio.get_running_loop().create_task(self._read_staged(tier, offset, size))
                return
            assert self.transport is not None
            view = self.access.dram[segment_id]
            self.transport.write(pack_response(OK, size))
            self.transport.write(view[offset : offset + size])
            self.access.reads += 1
            self.access.read_bytes += size
            self._expect("header", memoryview(self._header))
        else:
            write = self.access.admit_write(grant, offset, size)
            self._write = write
            view = self.access.dram[write.segment_id]
            self._expect("payload", view[offset : offset + size])

    def _readv(self, entries: memoryview) -> None:
        """Check every entry's grant, then send all the extents after one header."""
        views = []
        pos = 0
        for _ in range(self._size):
            grant_len, offset, size = READV_ENTRY.unpack_from(entries, pos)
            pos += READV_ENTRY.size
            if grant_len != GRANT_BYTES:
                raise DataPathError("READV entries carry the master's fixed-size grants")
            grant = bytes(entries[pos : pos + grant_len])
            pos += grant_len
            segment_id = self.access.check(grant, offset, size, GrantMode.READ)
            view = self.access.dram.get(segment_id)
            if view is None:
                raise DataPathError("READV serves DRAM segments only; read this one alone")
            views.append(view[offset : offset + size])
        assert self.transport is not None
        self.transport.write(pack_response(OK, sum(len(v) for v in views)))
        self.transport.writelines(views)
        self.access.reads += len(views)
        self.access.read_bytes += sum(len(v) for v in views)
        self._expect("header", memoryview(self._header))

    async def _read_staged(self, tier: NvmeTier | GpuTier, offset: int, size: int) -> None:
        buf = tier.staging.take(size)
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(
                self.access.io_executor, tier.read, memoryview(buf)[: aligned(size)], offset
            )
        except (OSError, ValueError) as exc:
            tier.staging.give(buf)
            self._reply(DataPathError.code, f"tier read failed: {exc}".encode())
        else:
            self._staging = (tier, buf)
            if self.transport is not None:
                self.transport.write(pack_response(OK, size))
                self.transport.write(memoryview(buf)[:size])
            self.access.reads += 1
            self.access.read_bytes += size
        if self.transport is not None:
            self.transport.resume_reading()
        self._expect("header", memoryview(self._header))

    def _drop_staging(self) -> None:
        if self._staging is not None:
            tier, buf = self._staging
            tier.staging.give(buf)
            self._staging = None

    def _reply(self, status: int, message: bytes) -> None:
        if self.transport is not None:
            self.transport.write(pack_response(status, len(message)) + message)

    def _fail(self, exc: DataPathError) -> None:
        """Answer a refusal.  The connection goes on serving: a refused WRITE's payload (at
        most MAX_DRAIN_BYTES) is read and discarded first, so the client, still sending it,
        reads the refusal rather than a reset.  Only a malformed header, or a refused WRITE
        announcing more than MAX_DRAIN_BYTES, makes the node hang up after answering."""
        self._reply(exc.code, exc.message.encode())
        if self._stage == "header" or (
            self._op is Op.WRITE and self._stage == "grant" and self._size > MAX_DRAIN_BYTES
        ):
            if self.transport is not None:
                self.transport.close()
        elif self._op is Op.WRITE and self._stage == "grant":
            self._drain_left = self._size
            self._drain()
        else:
            self._expect("header", memoryview(self._header))


async def start_data_server(
    access: DataAccess, host: str, port: int, ssl: SSLContext | None = None
) -> asyncio.Server:
    """Serve the data path on host:port (TLS with an `ssl` context)."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: _Connection(access), host, port, reuse_address=True, backlog=1024, ssl=ssl
    )
