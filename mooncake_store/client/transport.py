"""The client's data paths to store nodes: same-host shared memory and TCP.

`ShmMapper` maps a node's pool once, after receiving its memfd over the node's abstract unix
socket; a put or get is then a single copy between the caller's buffer and the pool.  A node
whose socket cannot be reached is on another host, and that answer is remembered.

TCP connections speak TLS when the client has TLS settings (common/tls.py).  `TcpPool` (the
async client's) keeps up to 8 connections per node; each is a BufferedProtocol
that reads a READ reply straight into the destination buffer (no intermediate copies).
`BlockingNodeConnections` (the sync client's, one set per thread) does the same with blocking
sockets and pipelines batches.  Both send a node's DRAM reads of a batch as READV requests
(`plan_node_requests`).  Failures are DataPathError (AccessDeniedError, GrantExpiredError when
the node refused the grant).

A transfer's buffer is one memoryview or a list of them (a scatter-gather object: its parts
are sent one after the other as one payload, or a reply lands in them one after the other), so
an object made of several caller buffers moves with no staging copy.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import mmap
import os
import socket
from collections.abc import Callable, Sequence
from ssl import SSLContext

from mooncake_store.client.cuda import forget_pool
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.addresses import split_host_port
from mooncake_store.common.checksum import CHUNK_BYTES, ChunkedHasher
from mooncake_store.common.errors import (
    OK,
    DataPathError,
    MooncakeError,
    error_for_code,
)
from mooncake_store.common.grant import GRANT_BYTES
from mooncake_store.common.shm_handoff import HELLO, HandoffRefused, parse_hello
from mooncake_store.common.tls import describe_tls_failure
from mooncake_store.common.wire import (
    MAX_ERROR_BYTES,
    MAX_READV_ENTRIES,
    RESPONSE,
    Op,
    pack_readv,
    pack_request,
)

Hasher = ChunkedHasher  # the object checksum (common/checksum.py), fed piece by piece

Buffer = memoryview | list[memoryview]  # one buffer, or the parts of one object in order


def nbytes(buffer: Buffer) -> int:
    """Bytes of a transfer's buffer (the sum of its parts)."""
    return len(buffer) if isinstance(buffer, memoryview) else sum(len(p) for p in buffer)


def flatten(
    buffers: Sequence[Buffer], hashers: Sequence[Hasher | None]
) -> tuple[list[memoryview], list[Hasher | None]]:
    """The destinations of several reads in reply order, each with its read's hasher (a
    scatter-gather read feeds one hasher from each of its parts in turn)."""
    views: list[memoryview] = []
    fed: list[Hasher | None] = []
    for buffer, hasher in zip(buffers, hashers, strict=True):
        parts = [buffer] if isinstance(buffer, memoryview) else buffer
        views += parts
        fed += [hasher] * len(parts)
    return views, fed


_READV_BYTES = 64 * 1024 * 1024  # per READV reply: the node queues it all at once

log = logging.getLogger("mooncake.client")


class ShmMapper:
    """Same-host pool mappings, keyed by segment id."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[mmap.mmap, memoryview]] = {}
        self._node_segment: dict[str, int] = {}
        self._remote: set[str] = set()

    def cached(self, loc: ReplicaLocation) -> memoryview | None:
        """The mapped pool of `loc`'s segment, if it is mapped already."""
        entry = self._maps.get(loc.segment_id)
        return entry[1] if entry is not None else None

    def worth_probing(self, loc: ReplicaLocation) -> bool:
        """False when `loc`'s node is known to be on another host, or refused us its pool."""
        return bool(loc.shm_socket) and loc.shm_socket not in self._remote

    def map(self, loc: ReplicaLocation) -> memoryview | None:
        """Map the pool of `loc`'s node if it is on this host and hands it to this process
        (blocking; run in an executor).  None: use TCP."""
        view = self.cached(loc)
        if view is not None or not self.worth_probing(loc):
            return view
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect("\0" + loc.shm_socket)
            msg, fds, _, _ = socket.recv_fds(sock, HELLO.size, 1)
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                self._remote.add(loc.shm_socket)
            return None
        finally:
            sock.close()
        try:
            segment_id, size, fd = parse_hello(msg, fds)
        except HandoffRefused:
            log.info("node %s keeps its pool to its own uid (and group): using TCP", loc.node_id)
            self._remote.add(loc.shm_socket)  # it will refuse again: do not ask every time
            return None
        except ValueError as exc:
            log.warning("node %s: %s; using TCP", loc.node_id, exc)
            return None
        try:
            if segment_id != loc.segment_id:
                return None
            mapping = mmap.mmap(
                fd,
                size,
                flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        except (OSError, ValueError, OverflowError) as exc:
            log.warning("cannot map the pool of node %s (%s); using TCP", loc.node_id, exc)
            return None
        finally:
            os.close(fd)
        view = memoryview(mapping)
        self._maps[segment_id] = (mapping, view)
        # A node seen with a new segment restarted: its old pool is dead, and holding the
        # mapping would keep the whole pool's memory alive.
        previous = self._node_segment.get(loc.node_id)
        self._node_segment[loc.node_id] = segment_id
        if previous is not None and previous != segment_id:
            self._unmap(previous)
        return view

    def mapped_segments(self) -> list[int]:
        return list(self._maps)

    def _unmap(self, segment_id: int) -> None:
        entry = self._maps.pop(segment_id, None)
        if entry is None:
            return
        mapping, view = entry
        forget_pool(segment_id)  # a pool registered with CUDA is unregistered first
        try:
            view.release()
            mapping.close()
        except BufferError:  # a copy still holds a slice; freed when the process exits
            pass

    def close(self) -> None:
        for segment_id in list(self._maps):
            self._unmap(segment_id)
        self._node_segment.clear()


def plan_node_requests(
    transfers: list[tuple[ReplicaLocation, Op, Buffer]], items: list[int], readv: bool
) -> list[tuple[bytes, Buffer | None, list[int]]]:
    """A node's requests as (frame, payload, transfers covered): its DRAM reads in READVs
    of up to MAX_READV_ENTRIES entries and _READV_BYTES bytes, the rest one by one."""
    out: list[tuple[bytes, Buffer | None, list[int]]] = []
    group: list[int] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal group, group_bytes
        if len(group) == 1:
            loc, op, _ = transfers[group[0]]
            out.append((pack_request(op, loc.grant, loc.offset, loc.size_bytes), None, group))
        elif group:
            entries = [(transfers[i][0].grant, transfers[i][0].offset,
                        transfers[i][0].size_bytes) for i in group]  # fmt: skip
            out.append((pack_readv(entries), None, group))
        group, group_bytes = [], 0

    for i in items:
        loc, op, buffer = transfers[i]
        if readv and op is Op.READ and loc.tier == "DRAM" and len(loc.grant) == GRANT_BYTES:
            size = nbytes(buffer)
            if len(group) == MAX_READV_ENTRIES or group_bytes + size > _READV_BYTES:
                flush()
            group.append(i)
            group_bytes += size
            continue
        flush()
        frame = pack_request(op, loc.grant, loc.offset, loc.size_bytes)
        out.append((frame, buffer if op is Op.WRITE else None, [i]))
    flush()
    return out


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


class BlockingNodeConnections:
    """Blocking TCP connections to store nodes, one per node, for one thread (the sync Client
    keeps a set per thread): a transfer is a sendall and a recv_into straight into the caller's
    buffer, as fast as loopback TCP goes, with no event loop in between."""

    def __init__(self, *, timeout_s: float, ssl: SSLContext | None = None) -> None:
        self.timeout_s = timeout_s
        self.ssl = ssl
        self._socks: dict[str, socket.socket] = {}

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

    def _connect(self, endpoint: str) -> socket.socket:
        host, port = split_host_port(endpoint)
        try:
            sock = socket.create_connection((host, port), timeout=self.timeout_s)
        except OSError as exc:
            raise _connect_failed(endpoint, exc) from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.ssl is not None:
            try:
                sock = self.ssl.wrap_socket(sock, server_hostname=host)
            except OSError as exc:
                sock.close()
                raise _connect_failed(endpoint, exc) from exc
        self._socks[endpoint] = sock
        return sock

    def _drop(self, endpoint: str) -> None:
        sock = self._socks.pop(endpoint, None)
        if sock is not None:
            sock.close()

    def exchange(
        self, loc: ReplicaLocation, op: Op, buffer: Buffer, *, hasher: Hasher | None = None
    ) -> None:
        """WRITE `buffer` to the replica, or READ the replica into `buffer`, feeding `hasher`
        the bytes as they go out or land."""
        reused = loc.endpoint in self._socks
        sock = self._socks.get(loc.endpoint) or self._connect(loc.endpoint)
        try:
            self._exchange(sock, loc, op, buffer, hasher)
        except _StaleConnection:
            # The node closed an idle connection (it restarted, or dropped it): one retry on
            # a fresh one, as the async pool does.  Both operations are idempotent.
            self._drop(loc.endpoint)
            if not reused:
                raise DataPathError(f"store node {loc.endpoint} closed the connection") from None
            if hasher is not None:  # nothing of the reply came: start the hash afresh
                hasher.reset()
            try:
                self._exchange(self._connect(loc.endpoint), loc, op, buffer, hasher)
            except _StaleConnection:
                self._drop(loc.endpoint)
                raise DataPathError(f"store node {loc.endpoint} closed the connection") from None
            except BaseException:
                self._drop(loc.endpoint)
                raise
        except BaseException:
            self._drop(loc.endpoint)  # mid-transfer failures leave the stream unusable
            raise

    def _exchange(
        self,
        sock: socket.socket,
        loc: ReplicaLocation,
        op: Op,
        buffer: Buffer,
        hasher: Hasher | None,
    ) -> None:
        try:
            sock.sendall(pack_request(op, loc.grant, loc.offset, loc.size_bytes))
        except OSError as exc:
            raise _StaleConnection() from exc
        try:
            if op is Op.WRITE:
                write_hashed(sock.sendall, buffer, hasher)
        except (ConnectionResetError, BrokenPipeError) as exc:
            raise _StaleConnection() from exc
        except OSError as exc:
            raise self._failed(loc, exc) from exc
        reads, fed = flatten([buffer], [hasher]) if op is not Op.WRITE else ([], [])
        refused = self._receive(sock, loc, reads, fed, first=True)
        if refused is not None:
            raise refused

    def exchange_many(
        self,
        transfers: list[tuple[ReplicaLocation, Op, Buffer]],
        hashers: Sequence[Hasher | None] | None = None,
        *,
        readv: bool = True,
    ) -> list[MooncakeError | None]:
        """Many transfers, pipelined: every request goes out on its node's socket first, then
        the replies are read in order (a node answers one connection's requests in order).
        A node's DRAM reads travel as READV requests (one reply carries many extents); a READV
        the node refuses is retried item by item, so each item gets its own answer.  A
        transfer's hasher (`hashers[i]`, if given) is fed the bytes it sends or receives.
        The result is one MooncakeError or None per transfer."""
        fed = hashers or [None] * len(transfers)
        results: list[MooncakeError | None] = [None] * len(transfers)
        by_node: dict[str, list[int]] = {}
        for i, (loc, _, _) in enumerate(transfers):
            by_node.setdefault(loc.endpoint, []).append(i)
        plans = {e: plan_node_requests(transfers, items, readv) for e, items in by_node.items()}
        sending: dict[str, tuple[socket.socket, int, DataPathError | None]] = {}
        for endpoint, requests in plans.items():  # every node gets its requests first
            try:
                sending[endpoint] = self._send_all(endpoint, requests, fed)
            except MooncakeError as exc:
                for i in by_node[endpoint]:
                    results[i] = exc
        one_by_one: list[int] = []
        for endpoint, (sock, sent, failure) in sending.items():
            requests = plans[endpoint]
            for _, _, items in requests[sent:]:  # never fully sent: not done
                for i in items:
                    results[i] = failure
            broken: MooncakeError | None = failure
            for n, (_, _, items) in enumerate(requests[:sent]):
                loc, op, _ = transfers[items[0]]
                read_items = [i for i in items if transfers[i][1] is not Op.WRITE]
                reads, fed_reads = flatten(
                    [transfers[i][2] for i in read_items], [fed[i] for i in read_items]
                )
                try:
                    refused = self._receive(sock, loc, reads, fed_reads)
                except MooncakeError as exc:  # the stream broke: nothing after it is readable
                    for _, _, rest in requests[n:sent]:
                        for j in rest:
                            results[j] = exc
                    broken = exc
                    break
                if len(items) > 1:  # a READV: refused whole, asked again one by one
                    if refused is not None:
                        one_by_one += items
                    continue
                results[items[0]] = refused
                if refused is not None and op is Op.WRITE:
                    # A refused WRITE makes the node hang up: the rest of this node's transfers
                    # are not done (the caller fails them over or revokes them).
                    broken = DataPathError(f"connection to {endpoint} lost mid-batch")
                    for _, _, rest in requests[n + 1 : sent]:
                        for j in rest:
                            results[j] = broken
                    break
            if broken is not None:
                self._drop(endpoint)
        if one_by_one:
            again = self.exchange_many(
                [transfers[i] for i in one_by_one], [fed[i] for i in one_by_one], readv=False
            )
            for i, result in zip(one_by_one, again, strict=True):
                results[i] = result
        return results

    def _send_all(
        self,
        endpoint: str,
        requests: list[tuple[bytes, Buffer | None, list[int]]],
        hashers: Sequence[Hasher | None],
    ) -> tuple[socket.socket, int, DataPathError | None]:
        """Send the requests; (socket, how many were sent in full, the send failure or None).
        A failure on the first request of a reused connection (the node dropped it while it
        was idle) is retried once on a fresh one."""
        reused = endpoint in self._socks
        sock = self._socks.get(endpoint) or self._connect(endpoint)
        sent, failure = _send_requests(sock, requests, hashers)
        if failure is not None and sent == 0 and reused:
            self._drop(endpoint)
            sock = self._connect(endpoint)
            if requests[0][1] is not None and (hasher := hashers[requests[0][2][0]]):
                hasher.reset()  # part of the first payload may have been fed
            sent, failure = _send_requests(sock, requests, hashers)
        if failure is None:
            return sock, sent, None
        return sock, sent, DataPathError(f"sending to store node {endpoint} failed: {failure}")

    def _receive(
        self,
        sock: socket.socket,
        loc: ReplicaLocation,
        buffers: list[memoryview],
        hashers: Sequence[Hasher | None],
        *,
        first: bool = False,
    ) -> MooncakeError | None:
        """Read one reply (a READ's, a READV's, a WRITE's) into `buffers`, feeding each
        buffer's hasher: None, or the node's refusal (then no payload came); raises when the
        stream broke.  With `first` (a lone
        request on a reused connection), a connection the node had already closed raises
        _StaleConnection, for one retry on a fresh one."""
        try:
            header = bytearray(RESPONSE.size)
            got = sock.recv_into(header)
            if got == 0:
                if first:
                    raise _StaleConnection()
                raise DataPathError("store node closed the connection mid-reply")
            _recv_exactly(sock, memoryview(header)[got:])
            status, _, size = RESPONSE.unpack(header)
            if status != OK:
                if size > MAX_ERROR_BYTES:
                    raise DataPathError(f"node sent an error reply of {size} bytes")
                message = bytearray(size)
                _recv_exactly(sock, memoryview(message))
                return error_for_code(status, message.decode(errors="replace"))
            expected = sum(len(buffer) for buffer in buffers)
            if size != expected:
                raise DataPathError(f"node sent {size} bytes, expected {expected}")
            for buffer, hasher in zip(buffers, hashers, strict=True):
                _recv_exactly(sock, buffer, hasher)
            return None
        except (ConnectionResetError, BrokenPipeError) as exc:
            if first:
                raise _StaleConnection() from exc
            raise self._failed(loc, exc) from exc
        except OSError as exc:
            raise self._failed(loc, exc) from exc

    def _failed(self, loc: ReplicaLocation, exc: OSError) -> DataPathError:
        if isinstance(exc, TimeoutError):
            return DataPathError(
                f"store node {loc.endpoint} did not answer within {self.timeout_s:g}s"
            )
        return DataPathError(f"transfer with store node {loc.endpoint} failed: {exc}")


_HASH_STEP = CHUNK_BYTES  # a payload is hashed this much at a time, just before it is sent


def write_hashed(
    write: Callable[[memoryview], object], payload: Buffer, hasher: Hasher | None
) -> None:
    """Send `payload` (a buffer, or parts sent in order) with `write`; with a hasher, in steps
    that are hashed first, so the send reads them from cache instead of memory."""
    if not isinstance(payload, memoryview):
        for part in payload:
            write_hashed(write, part, hasher)
        return
    if hasher is None:
        write(payload)
        return
    for start in range(0, len(payload), _HASH_STEP):
        piece = payload[start : start + _HASH_STEP]
        hasher.update(piece)
        write(piece)


def _send_requests(
    sock: socket.socket,
    requests: list[tuple[bytes, Buffer | None, list[int]]],
    hashers: Sequence[Hasher | None],
) -> tuple[int, OSError | None]:
    """Send (frame, payload) requests in order, feeding a payload's hasher (by the request's
    transfer): how many went out in full, and the failure."""
    sent = 0
    try:
        for frame, payload, covered in requests:
            sock.sendall(frame)
            if payload is not None:
                write_hashed(sock.sendall, payload, hashers[covered[0]])
            sent += 1
    except OSError as exc:
        return sent, exc
    return sent, None


class _StaleConnection(Exception):
    pass


def _connect_failed(endpoint: str, exc: BaseException) -> DataPathError:
    explained = describe_tls_failure(exc, f"store node {endpoint}")
    if explained is not None:
        return DataPathError(explained)
    return DataPathError(f"cannot connect to store node {endpoint}: {exc!r}")


def _recv_exactly(sock: socket.socket, view: memoryview, hasher: Hasher | None = None) -> None:
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise DataPathError("store node closed the connection mid-reply")
        if hasher is not None:
            hasher.update(view[:n])  # just landed: still in cache
        view = view[n:]
