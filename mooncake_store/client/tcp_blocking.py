"""The sync client's TCP data path (client/transport.py: `NodeTransport`).

`BlockingNodeConnections` (one set per thread) moves transfers on blocking sockets and
pipelines a batch: every request sent, then the replies read in order."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from ssl import SSLContext

from mooncake_store.client.busy_poll import BusyPoll
from mooncake_store.client.tcp_wire import (
    _connect_failed,
    _recv_exactly,
    _send_requests,
    _StaleConnection,
    plan_node_requests,
    write_hashed,
)
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


class BlockingNodeConnections:
    """Blocking TCP connections to store nodes, one per node, for one thread (the sync Client
    keeps a set per thread): a transfer is a sendall and a recv_into straight into the caller's
    buffer, as fast as loopback TCP goes, with no event loop in between."""

    def __init__(self, *, timeout_s: float, ssl: SSLContext | None = None) -> None:
        self.timeout_s = timeout_s
        self.ssl = ssl
        self._socks: dict[str, socket.socket] = {}
        self._polls: dict[socket.socket, BusyPoll] = {}
        #: How long a reply is polled for before the read may sleep (client/busy_poll.py);
        #: set by the sync Client before each operation's transfers.
        self.busy_poll_s = 0.0

    def busy_polls(self) -> tuple[int, int]:
        """(polls made, polls that saw the reply arrive) on these sockets (client/busy_poll.py)."""
        polls = list(self._polls.values())
        return sum(p.polls for p in polls), sum(p.hits for p in polls)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._polls.clear()

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
        self._polls[sock] = BusyPoll(sock)  # registered while the socket is open
        return sock

    def _drop(self, endpoint: str) -> None:
        sock = self._socks.pop(endpoint, None)
        if sock is not None:
            self._polls.pop(sock, None)
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
        The result is one MooncakeError or None per transfer.  Interrupted (KeyboardInterrupt,
        or anything else it does not turn into a result), it drops every connection it used:
        their replies may be unread, and the next exchange must not take one for its own (a
        WRITE would take an earlier request's OK)."""
        try:
            return self._exchange_many(transfers, hashers, readv=readv)
        except BaseException:
            for endpoint in {loc.endpoint for loc, _, _ in transfers}:
                self._drop(endpoint)
            raise

    def _exchange_many(
        self,
        transfers: list[tuple[ReplicaLocation, Op, Buffer]],
        hashers: Sequence[Hasher | None] | None,
        *,
        readv: bool,
    ) -> list[MooncakeError | None]:
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
                loc = transfers[items[0]][0]
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
                # A refusal (a WRITE's too: the node discards its payload) leaves the stream in
                # step, so the replies behind it are read as usual.
                results[items[0]] = refused
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
            poll = self._polls.get(sock)  # none once closed (Client.close from another thread)
            if poll is not None:
                poll.wait(self.busy_poll_s)
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
