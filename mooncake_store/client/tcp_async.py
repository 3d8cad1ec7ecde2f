"""The async client's TCP data path (client/transport.py: `AsyncNodeTransport`).

`TcpPool` keeps up to 8 connections per node; each is a BufferedProtocol that reads a READ
reply straight into the destination buffer (no intermediate copies)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from ssl import SSLContext

from mooncake_store.client.tcp_wire import _connect_failed, plan_node_requests, write_hashed
from mooncake_store.client.transport import Buffer, Hasher, flatten
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.addresses import split_host_port
from mooncake_store.common.errors import (
    OK,
    DataPathError,
    MooncakeError,
    error_for_code,
)
from mooncake_store.common.wire import (
    MAX_ERROR_BYTES,
    RESPONSE,
    Op,
    pack_request,
)


class _Connection(asyncio.BufferedProtocol):
    """One request at a time over one TCP connection to a node."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._header = bytearray(RESPONSE.size)
        self._target = memoryview(self._header)
        self._filled = 0
        self._stage = "idle"
        self._dests: list[memoryview] | None = None  # where a READ (or READV) reply lands
        self._hashers: Sequence[Hasher | None] = ()  # fed each dest's bytes as they land
        self._hasher: Hasher | None = None  # the current dest's
        self._next = 0
        self._status = OK
        self._done: asyncio.Future[bytes] | None = None
        self.broken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.broken = True
        self.transport = None
        if self._done is not None and not self._done.done():
            self._done.set_exception(DataPathError(f"connection to node lost: {exc or 'closed'}"))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._stage == "idle":
            # TLS asks for a buffer whenever a record arrives, even one with no data for us
            # (a session ticket); only bytes that land here break the protocol.
            return memoryview(bytearray(max(sizehint, 1)))
        return self._target[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        if self._stage == "idle":  # unsolicited bytes: protocol violation
            self.broken = True
            if self.transport is not None:
                self.transport.close()
            return
        self._filled += nbytes
        if self._hasher is not None and nbytes:
            self._hasher.update(self._target[self._filled - nbytes : self._filled])
        if self._filled < len(self._target):
            return
        if self._stage == "header":
            status, _, size = RESPONSE.unpack(self._header)
            self._status = status
            if status != OK:
                if size > MAX_ERROR_BYTES:
                    self._finish(exc=DataPathError(f"node sent an error reply of {size} bytes"))
                    return
                self._stage, self._target, self._filled = "error", memoryview(bytearray(size)), 0
            elif self._dests is not None:
                expected = sum(len(d) for d in self._dests)
                if size != expected:
                    self._finish(exc=DataPathError(f"node sent {size} bytes, expected {expected}"))
                    return
                self._stage, self._target, self._filled = "payload", self._dests[0], 0
                self._hasher = self._hashers[0] if self._hashers else None
                self._next = 1
            else:
                self._stage, self._target, self._filled = "payload", memoryview(b""), 0
            if len(self._target) == 0:
                self.buffer_updated(0)
            return
        if self._stage == "error":
            self._finish(
                exc=error_for_code(self._status, bytes(self._target).decode(errors="replace"))
            )
            return
        if self._dests is not None and self._next < len(self._dests):
            self._target, self._filled = self._dests[self._next], 0  # a READV's next extent
            self._hasher = self._hashers[self._next] if self._hashers else None
            self._next += 1
            return
        self._finish()

    def _finish(self, exc: BaseException | None = None) -> None:
        self._stage = "idle"
        self._dests = None
        self._hashers, self._hasher = (), None
        done, self._done = self._done, None
        if exc is not None:
            self.broken = True  # resynchronising after an error is not worth it: reconnect
            if self.transport is not None:
                self.transport.close()
        if done is not None and not done.done():
            if exc is None:
                done.set_result(b"")
            else:
                done.set_exception(exc)

    def request(
        self,
        frame: bytes,
        payload: Buffer | None,
        dest: memoryview | list[memoryview] | None,
        hashers: Sequence[Hasher | None] = (),
        payload_hasher: Hasher | None = None,
    ) -> asyncio.Future[bytes]:
        if self.transport is None or self.broken or self._stage != "idle":
            # The node closed the connection between it being handed out and used (it died,
            # or dropped it): a data-path failure the caller falls over from.
            self.broken = True
            raise DataPathError("connection to store node lost before the request was sent")
        self._done = asyncio.get_running_loop().create_future()
        self._dests = [dest] if isinstance(dest, memoryview) else dest
        self._hashers, self._hasher = hashers, None
        self._stage, self._target, self._filled = "header", memoryview(self._header), 0
        self.transport.write(frame)
        if payload is not None and len(payload):
            write_hashed(self.transport.write, payload, payload_hasher)
        return self._done


class TcpPool:
    """TCP connections per node endpoint: at most `max_per_node` in use at once (more requests
    wait their turn: a node serves from one event loop, and a burst of connects beyond its
    listen backlog would stall in SYN retries for a second), idle ones kept for reuse."""

    def __init__(
        self, *, timeout_s: float, max_per_node: int = 8, ssl: SSLContext | None = None
    ) -> None:
        self.timeout_s = timeout_s
        self.ssl = ssl
        self.max_idle = max_per_node
        self.max_per_node = max_per_node
        self._idle: dict[str, list[_Connection]] = {}
        self._slots: dict[str, asyncio.Semaphore] = {}

    async def _acquire(self, endpoint: str, *, fresh: bool = False) -> _Connection:
        idle = self._idle.get(endpoint)
        while idle and not fresh:
            conn = idle.pop()
            if not conn.broken and conn.transport is not None:
                return conn
        host, port = split_host_port(endpoint)
        loop = asyncio.get_running_loop()
        connect = loop.create_connection(
            _Connection,
            host,
            port,
            ssl=self.ssl,
            server_hostname=host if self.ssl is not None else None,
        )
        try:
            _, conn = await asyncio.wait_for(connect, self.timeout_s)
        except (TimeoutError, OSError) as exc:
            raise _connect_failed(endpoint, exc) from exc
        return conn

    def _release(self, endpoint: str, conn: _Connection) -> None:
        idle = self._idle.setdefault(endpoint, [])
        if conn.broken or conn.transport is None or len(idle) >= self.max_idle:
            if conn.transport is not None:
                conn.transport.close()
            return
        idle.append(conn)

    async def exchange_many(
        self,
        transfers: list[tuple[ReplicaLocation, Op, Buffer]],
        hashers: Sequence[Hasher | None] | None = None,
    ) -> list[MooncakeError | None]:
        """Many transfers in parallel; a node's DRAM reads travel as READV requests (planned as
        the blocking client plans them).  A refused READV is retried item by item.  A
        transfer's hasher (`hashers[i]`, if given) is fed the bytes it sends or receives."""
        hashers = hashers or [None] * len(transfers)
        by_node: dict[str, list[int]] = {}
        for i, (loc, _, _) in enumerate(transfers):
            by_node.setdefault(loc.endpoint, []).append(i)
        calls = []
        for items in by_node.values():
            for frame, payload, covered in plan_node_requests(transfers, items, True):
                if len(covered) > 1:
                    calls.append((covered, self._readv(transfers, covered, frame, hashers)))
                else:  # the planned frame as it is, not packed again
                    loc, op, buffer = transfers[covered[0]]
                    hasher = hashers[covered[0]]
                    if op is Op.WRITE:
                        call = self._exchange(loc, op, payload, None, (), hasher, frame=frame)
                    else:
                        dests, fed = flatten([buffer], [hasher])
                        call = self._exchange(loc, op, None, dests, fed, frame=frame)
                    calls.append((covered, call))
        outcomes = await asyncio.gather(*(c for _, c in calls), return_exceptions=True)
        results: list[MooncakeError | None] = [None] * len(transfers)
        retry: list[int] = []
        for (covered, _), outcome in zip(calls, outcomes, strict=True):
            if isinstance(outcome, BaseException) and not isinstance(outcome, MooncakeError):
                raise outcome
            if isinstance(outcome, MooncakeError):
                if len(covered) > 1:
                    retry += covered
                else:
                    results[covered[0]] = outcome
        if retry:
            again = await asyncio.gather(
                *(self.exchange(*transfers[i], hasher=hashers[i]) for i in retry),
                return_exceptions=True,
            )
            for i, outcome in zip(retry, again, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, MooncakeError):
                    raise outcome
                results[i] = outcome  # type: ignore[assignment]
        return results

    async def _readv(
        self,
        transfers: list[tuple[ReplicaLocation, Op, Buffer]],
        items: list[int],
        frame: bytes,
        hashers: Sequence[Hasher | None],
    ) -> None:
        loc = transfers[items[0]][0]
        dests, fed = flatten([transfers[i][2] for i in items], [hashers[i] for i in items])
        await self._exchange(loc, Op.READV, None, dests, fed, frame=frame)

    async def _exchange(
        self,
        loc: ReplicaLocation,
        op: Op,
        payload: Buffer | None,
        dest: memoryview | list[memoryview] | None,
        hashers: Sequence[Hasher | None] = (),
        payload_hasher: Hasher | None = None,
        *,
        frame: bytes | None = None,
    ) -> None:
        slots = self._slots.get(loc.endpoint)
        if slots is None:
            slots = self._slots[loc.endpoint] = asyncio.Semaphore(self.max_per_node)
        async with slots:
            await self._exchange_one(loc, op, payload, dest, hashers, payload_hasher, frame)

    async def _exchange_one(
        self,
        loc: ReplicaLocation,
        op: Op,
        payload: Buffer | None,
        dest: memoryview | list[memoryview] | None,
        hashers: Sequence[Hasher | None],
        payload_hasher: Hasher | None,
        frame: bytes | None,
    ) -> None:
        if frame is None:
            frame = pack_request(op, loc.grant, loc.offset, loc.size_bytes)
        conn = await self._acquire(loc.endpoint)
        try:
            reply = conn.request(frame, payload, dest, hashers, payload_hasher)
        except DataPathError:
            # An idle connection the node closed meanwhile: one retry on a new connection.
            # (request() refuses before writing anything, so no hasher was fed.)
            self._release(loc.endpoint, conn)
            conn = await self._acquire(loc.endpoint, fresh=True)
            try:
                reply = conn.request(frame, payload, dest, hashers, payload_hasher)
            except DataPathError:
                self._release(loc.endpoint, conn)
                raise
        try:
            await asyncio.wait_for(reply, self.timeout_s)
        except TimeoutError:
            conn.broken = True
            raise DataPathError(
                f"store node {loc.endpoint} did not answer within {self.timeout_s:g}s"
            ) from None
        except asyncio.CancelledError:
            conn.broken = True
            raise
        finally:
            self._release(loc.endpoint, conn)

    async def exchange(
        self, loc: ReplicaLocation, op: Op, buffer: Buffer, *, hasher: Hasher | None = None
    ) -> None:
        """WRITE `buffer` to the replica, or READ the replica into `buffer`, feeding `hasher`
        the bytes as they go out or land."""
        if op is Op.WRITE:
            await self._exchange(loc, op, buffer, None, (), hasher)
        else:
            dests, fed = flatten([buffer], [hasher])
            await self._exchange(loc, op, None, dests, fed)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                if conn.transport is not None:
                    conn.transport.close()
        self._idle.clear()
