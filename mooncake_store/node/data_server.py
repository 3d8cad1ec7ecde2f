"""The node's TCP data path: framed READ/WRITE straight between sockets and the pool.

Each connection is an asyncio BufferedProtocol whose `get_buffer` hands out a slice of the pool
itself for WRITE payloads, so the kernel copies bytes directly into place (no intermediate
buffer); READ replies write a memoryview of the pool.  Every access is checked against a grant
signed by the master (segment, extent, mode, expiry) before a byte moves.  See common/wire.py for
the framing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from mooncake_store.common.errors import OK, AccessDeniedError, DataPathError
from mooncake_store.common.grant import GrantMode, verify_grant
from mooncake_store.common.wire import MAGIC, REQUEST, Op, pack_response

log = logging.getLogger("mooncake.node")

_MAX_GRANT_BYTES = 256


class DataAccess:
    """The pool plus what the node needs to check grants against it."""

    def __init__(self, view: memoryview, segment_id: int, secret: bytes) -> None:
        self.view = view
        self.segment_id = segment_id
        self.secret = secret
        self.reads = 0
        self.writes = 0
        self.denied = 0

    def check(self, grant_blob: bytes, offset: int, size_bytes: int, mode: GrantMode) -> None:
        """Raise AccessDeniedError unless the grant allows this access now."""
        grant = verify_grant(self.secret, grant_blob)
        problem = None
        if grant is None:
            problem = "grant signature is invalid (not issued by this node's master)"
        elif grant.segment_id != self.segment_id:
            problem = f"grant is for segment {grant.segment_id:x}, this is {self.segment_id:x}"
        elif grant.expires_ms < time.time() * 1000:
            problem = "grant expired (put timed out or read lease ended); ask the master again"
        elif not grant.covers(offset, size_bytes, mode):
            problem = f"{mode.name} of [{offset}, +{size_bytes}) is outside the granted extent"
        elif offset + size_bytes > len(self.view):
            problem = "extent lies beyond the end of the pool"
        if problem is not None:
            self.denied += 1
            raise AccessDeniedError(problem)


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

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._target[self._filled :]

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
            self._expect("grant", memoryview(self._grant)[:grant_len])
        elif self._stage == "grant":
            self._dispatch()
        elif self._stage == "payload":
            self.access.writes += 1
            self._reply(OK, b"")
            self._expect("header", memoryview(self._header))

    def _dispatch(self) -> None:
        grant = bytes(self._grant[: self._grant_len])
        op, offset, size = self._op, self._offset, self._size
        if op is Op.PING:
            self._reply(OK, b"")
            self._expect("header", memoryview(self._header))
        elif op is Op.READ:
            self.access.check(grant, offset, size, GrantMode.READ)
            assert self.transport is not None
            self.transport.write(pack_response(OK, size))
            self.transport.write(self.access.view[offset : offset + size])
            self.access.reads += 1
            self._expect("header", memoryview(self._header))
        else:
            self.access.check(grant, offset, size, GrantMode.WRITE)
            self._expect("payload", self.access.view[offset : offset + size])

    def _reply(self, status: int, message: bytes) -> None:
        if self.transport is not None:
            self.transport.write(pack_response(status, len(message)) + message)

    def _fail(self, exc: DataPathError) -> None:
        # A refused WRITE leaves its payload unread on the socket: answer, then close.
        self._reply(exc.code, exc.message.encode())
        if self._op is Op.WRITE or self._stage == "header":
            if self.transport is not None:
                self.transport.close()
        else:
            self._expect("header", memoryview(self._header))


async def start_data_server(access: DataAccess, host: str, port: int) -> asyncio.Server:
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: _Connection(access), host, port, reuse_address=True)
