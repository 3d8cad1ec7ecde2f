"""The node's gRPC DataService: Write and Read of granted extents, for clients in any language.

The same grants as the TCP data path (node/data_server.py) decide every access, through the
same `DataAccess` checks (a write's bytes are sealed against its grant once the stream has
delivered all of them); the bytes go straight into (or out of) the node's tiers.  Replies
carry a `Status` (absent or code 0 on success, see docs/PROTOCOL.md) instead of gRPC errors, so
a refusal is always told as a refusal.  Writes report the chunked checksum of what arrived
(docs/CHECKSUM.md); reads verify the stored checksum first when the client passes it, so a
client with no xxh3 of its own still never receives a corrupt block.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from concurrent.futures import Executor
from typing import Any

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.checksum import checksum
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    ChecksumMismatchError,
    DataPathError,
    InvalidArgumentError,
    MooncakeError,
)
from mooncake_store.common.grant import GrantMode
from mooncake_store.node.data_server import DataAccess
from mooncake_store.node.nvme import aligned
from mooncake_store.node.write_gate import CUT_OFF

CHUNK_BYTES = 1 << 20  # per ReadChunk: well inside gRPC's default 4 MiB message cap


def _status(exc: MooncakeError) -> pb.Status:
    return pb.Status(code=exc.code, message=exc.message)


def _wanted_checksum(request: pb.ReadRequest) -> int:
    if request.checksum_str:
        try:
            return int(request.checksum_str)
        except ValueError:
            raise InvalidArgumentError(
                f"checksum_str must be a decimal integer, got {request.checksum_str!r}"
            ) from None
    return int(request.checksum)


class DataServicer(pb_grpc.DataServiceServicer):
    def __init__(self, access: DataAccess, executor: Executor | None = None) -> None:
        self.access = access
        self.executor = executor
        self.writes = 0
        self.reads = 0

    async def Write(
        self, request_iterator: AsyncIterator[pb.WriteChunk], context: Any
    ) -> pb.WriteResult:
        write = None
        try:
            view, size = None, 0
            received = 0
            async for chunk in request_iterator:
                if view is None:
                    size = chunk.size_bytes
                    if size == 0:
                        raise InvalidArgumentError("the first WriteChunk must give size_bytes > 0")
                    write = self.access.admit_write(chunk.grant, chunk.offset, size)
                    view = self.access.dram[write.segment_id][chunk.offset : chunk.offset + size]
                data = chunk.data
                if received + len(data) > size:
                    raise DataPathError(f"more than size_bytes ({size}) bytes in the stream")
                assert write is not None
                if self.access.gate.ended(write.segment_id, write.generation):
                    self.access.denied += 1  # a fence ended it meanwhile: its extent may be
                    raise AccessDeniedError(CUT_OFF)  # another put's (node/write_gate.py)
                view[received : received + len(data)] = data
                received += len(data)
            if view is None:
                raise InvalidArgumentError("empty Write stream: send the grant first")
            if received != size:
                raise DataPathError(f"the stream ended after {received} of {size} bytes")
            assert write is not None
            self.access.finish_write(write)  # sealed: its grant cannot write it again
            write = None
            loop = asyncio.get_running_loop()
            digest = await loop.run_in_executor(self.executor, checksum, view)
        except MooncakeError as exc:
            return pb.WriteResult(status=_status(exc))
        finally:
            if write is not None:  # failed part-way (or the call was cancelled): not sealed
                self.access.abandon_write(write)
        self.writes += 1
        return pb.WriteResult(status=pb.Status(code=OK), checksum=digest, checksum_str=str(digest))

    async def Read(self, request: pb.ReadRequest, context: Any) -> AsyncIterator[pb.ReadChunk]:
        size = request.size_bytes
        staged_buf = None
        tier = None
        try:
            if size == 0:
                raise InvalidArgumentError("size_bytes must be > 0")
            wanted = _wanted_checksum(request)
            segment = self.access.check(request.grant, request.offset, size, GrantMode.READ)
            loop = asyncio.get_running_loop()
            tier = self.access.staged(segment)
            if tier is None:
                view = self.access.dram[segment][request.offset : request.offset + size]
            else:
                staged_buf = tier.staging.take(size)
                staged = memoryview(staged_buf)
                await loop.run_in_executor(
                    self.access.io_executor, tier.read, staged[: aligned(size)], request.offset
                )
                view = staged[:size]
            if wanted:
                digest = await loop.run_in_executor(self.executor, checksum, view)
                if digest != wanted:
                    raise ChecksumMismatchError(
                        "the replica failed its checksum on the node; read another replica"
                    )
            for start in range(0, size, CHUNK_BYTES):
                yield pb.ReadChunk(data=bytes(view[start : start + CHUNK_BYTES]))
        except MooncakeError as exc:
            yield pb.ReadChunk(status=_status(exc))
            return
        except (OSError, ValueError) as exc:
            yield pb.ReadChunk(status=pb.Status(code=DataPathError.code, message=f"{exc}"))
            return
        finally:
            if staged_buf is not None and tier is not None:
                tier.staging.give(staged_buf)
        self.reads += 1
        self.access.reads += 1
        self.access.read_bytes += size
        yield pb.ReadChunk(status=pb.Status(code=OK))
