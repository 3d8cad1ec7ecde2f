"""Property-based fuzzing of the node's data-path parser (common/wire.py, node/data_server.py)
and of the client's reply parsing: hostile bytes get a clean error reply or a hang-up, never an
escaped exception, a hang, or an allocation a length field asked for.

The node's protocol object is driven exactly as asyncio drives it (get_buffer, then
buffer_updated), in arbitrary chunkings, over a transport that records what it was told; a last
test sends hostile streams to a real data server over sockets and checks it still serves.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mooncake_store.client.transport import BlockingNodeConnections
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    DataPathError,
    GrantExpiredError,
    MooncakeError,
)
from mooncake_store.common.grant import GRANT_BYTES, Grant, GrantMode, sign_grant, verify_grant
from mooncake_store.common.wire import (
    MAGIC,
    MAX_DRAIN_BYTES,
    MAX_ERROR_BYTES,
    MAX_READV_ENTRIES,
    READV_ENTRY,
    REQUEST,
    RESPONSE,
    Op,
    pack_readv,
    pack_request,
)
from mooncake_store.node.data_server import DataAccess, _Connection, start_data_server

SECRET = b"s" * 32
SEGMENT = 7
POOL_BYTES = 64 * 1024
# The most a request may make the node allocate: a READV's entry table (the pool itself is
# preallocated and handed out as slices).
MAX_ALLOC = MAX_READV_ENTRIES * (READV_ENTRY.size + GRANT_BYTES)
EXAMPLES = int(os.environ.get("MOONCAKE_FUZZ_EXAMPLES", "150"))  # more for a bug hunt
FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RecordingTransport(asyncio.Transport):
    """What the protocol wrote, and whether it hung up."""

    def __init__(self) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.out += data

    def writelines(self, chunks: object) -> None:
        for chunk in chunks:  # type: ignore[attr-defined]
            self.out += chunk

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


def _access() -> DataAccess:
    access = DataAccess(SECRET, ThreadPoolExecutor(1))
    access.dram[SEGMENT] = memoryview(bytearray(POOL_BYTES))
    return access


def _grant(offset: int, size: int, mode: GrantMode, expires_ms: int | None = None) -> bytes:
    expires = int(time.time() * 1000) + 60_000 if expires_ms is None else expires_ms
    return sign_grant(SECRET, Grant(SEGMENT, offset, size, expires, mode))


def _replies(out: bytes) -> list[tuple[int, int]]:
    """(status, size) of each well-formed reply in `out` (asserts they are well-formed)."""
    replies, pos = [], 0
    while pos < len(out):
        assert len(out) - pos >= RESPONSE.size, "truncated reply header"
        status, reserved, size = RESPONSE.unpack_from(out, pos)
        assert reserved == 0
        if status != OK:
            assert size <= MAX_ERROR_BYTES
            out[pos + RESPONSE.size : pos + RESPONSE.size + size].decode()  # a UTF-8 message
        pos += RESPONSE.size + size
        assert pos <= len(out), "reply shorter than its size field"
        replies.append((status, size))
    return replies


def feed(data: bytes, cuts: list[int]) -> tuple[RecordingTransport, DataAccess]:
    """Feed `data` to a fresh node connection in pieces cut at `cuts`."""
    access = _access()
    conn = _Connection(access)
    transport = RecordingTransport()
    conn.connection_made(transport)
    pos = 0
    bounds = sorted({c % (len(data) + 1) for c in cuts} | {len(data)})
    for stop in bounds:
        while pos < stop and not transport.closed:
            buf = conn.get_buffer(stop - pos)
            assert 0 < len(buf) <= max(MAX_ALLOC, POOL_BYTES), len(buf)
            n = min(len(buf), stop - pos)
            buf[:n] = data[pos : pos + n]
            pos += n
            conn.buffer_updated(n)  # must not raise, whatever the bytes
    return transport, access


headers = st.builds(
    lambda magic, op, grant_len, offset, size: REQUEST.pack(
        magic, op, 0, grant_len, 0, offset, size
    ),
    st.sampled_from([MAGIC, MAGIC, MAGIC, 0, 0xFFFF]),
    st.integers(0, 255),
    st.integers(0, 0xFFFF),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
)
cuts = st.lists(st.integers(0, 1 << 20), max_size=6)


@FUZZ
@given(st.binary(max_size=600), cuts)
def test_random_bytes_get_error_replies_or_a_hang_up(data, cut_at):
    transport, _ = feed(data, cut_at)
    _replies(bytes(transport.out))


@FUZZ
@given(st.lists(st.tuples(headers, st.binary(max_size=80)), min_size=1, max_size=4), cuts)
def test_hostile_headers_never_allocate_what_they_ask_for(frames, cut_at):
    transport, access = feed(b"".join(h + body for h, body in frames), cut_at)
    _replies(bytes(transport.out))
    assert access.reads == 0 and access.writes == 0  # nothing unsigned was served or written


@FUZZ
@given(cuts)
def test_refused_writes_are_drained_and_the_connection_kept(cut_at):
    """A refused WRITE's payload is read and discarded: the refusal, then the next request's
    answer, on the same connection."""
    ping = pack_request(Op.PING, _grant(0, 16, GrantMode.READ), 0, 0)
    payload = os.urandom(3 * POOL_BYTES)  # larger than the node's scratch buffer
    read_grant = pack_request(Op.WRITE, _grant(0, POOL_BYTES, GrantMode.READ), 0, len(payload))
    expired = pack_request(Op.WRITE, _grant(0, 64, GrantMode.WRITE, 1), 0, 64)
    stream = read_grant + payload + expired + payload[:64] + ping
    transport, access = feed(stream, cut_at)
    replies = _replies(bytes(transport.out))
    assert [status for status, _ in replies] == [
        AccessDeniedError.code,
        GrantExpiredError.code,
        OK,
    ]
    assert not transport.closed and access.writes == 0


def test_refused_write_announcing_more_than_the_drain_bound_is_hung_up_on():
    frame = pack_request(Op.WRITE, _grant(0, 64, GrantMode.READ), 0, MAX_DRAIN_BYTES + 1)
    transport, _ = feed(frame + b"x" * 64, [])
    assert [status for status, _ in _replies(bytes(transport.out))] == [AccessDeniedError.code]
    assert transport.closed


@st.composite
def signed_requests(draw: st.DrawFn) -> tuple[bytes, Op, int, int]:
    """A request carrying a genuine grant, with an offset and size the grant may not cover."""
    g_off = draw(st.integers(0, POOL_BYTES))
    g_size = draw(st.integers(0, POOL_BYTES))
    mode = draw(
        st.sampled_from([GrantMode.READ, GrantMode.WRITE, GrantMode.READ | GrantMode.WRITE])
    )
    expired = draw(st.booleans())
    grant = _grant(g_off, g_size, mode, 1 if expired else None)
    op = draw(st.sampled_from([Op.READ, Op.WRITE, Op.PING]))
    offset = draw(st.one_of(st.integers(0, POOL_BYTES * 2), st.integers(0, 2**64 - 1)))
    size = draw(st.one_of(st.integers(0, 4096), st.integers(0, 2**64 - 1)))
    return pack_request(op, grant, offset, size), op, offset, size


@FUZZ
@given(signed_requests(), st.binary(max_size=4096), cuts)
def test_signed_requests_outside_their_grant_are_refused(request, payload, cut_at):
    frame, op, offset, size = request
    transport, access = feed(frame + payload, cut_at)
    replies = _replies(bytes(transport.out))
    grant = verify_grant(SECRET, frame[REQUEST.size :])
    assert grant is not None
    allowed = (
        grant.expires_ms > time.time() * 1000
        and grant.covers(offset, size, GrantMode.READ if op is Op.READ else GrantMode.WRITE)
        and offset + size <= POOL_BYTES
    )
    if op is Op.PING:
        assert replies[0] == (OK, 0)
    elif not allowed:
        assert replies and replies[0][0] != OK
        assert access.reads == 0 and access.writes == 0
    elif op is Op.READ:
        assert replies[0] == (OK, size)
    elif len(payload) >= size:  # a WRITE whose payload arrived in full
        assert replies[0] == (OK, 0) and access.writes == 1


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.integers(0, 300), st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.booleans()
        ),
        min_size=1,
        max_size=5,
    ),
    st.integers(0, 2**64 - 1),
    cuts,
)
def test_readv_entries_are_checked_one_by_one(entries, count, cut_at):
    parts = [REQUEST.pack(MAGIC, Op.READV, 0, 0, 0, 0, count % (MAX_READV_ENTRIES + 2))]
    for grant_len, offset, size, genuine in entries:
        grant = _grant(0, POOL_BYTES, GrantMode.READ) if genuine else os.urandom(grant_len)
        parts.append(READV_ENTRY.pack(len(grant), offset, size) + grant)
    transport, _ = feed(b"".join(parts), cut_at)
    _replies(bytes(transport.out))
    transport, _ = feed(pack_readv([(_grant(0, 64, GrantMode.READ), 0, 64)] * 2), cut_at)
    assert _replies(bytes(transport.out)) == [(OK, 128)]


@settings(max_examples=60, deadline=None)
@given(st.binary(min_size=RESPONSE.size, max_size=RESPONSE.size), st.binary(max_size=64))
def test_client_reads_hostile_replies_cleanly(header, rest):
    """A node (or an impostor) answering with any bytes: a clean MooncakeError or a result."""
    a, b = socket.socketpair()
    try:
        a.settimeout(0.5)
        b.sendall(header + rest)
        b.shutdown(socket.SHUT_WR)
        nodes = BlockingNodeConnections(timeout_s=0.5)
        loc = ReplicaLocation("n", SEGMENT, "peer:1", "", 0, 16, b"", "DRAM")
        try:
            outcome = nodes._receive(a, loc, [memoryview(bytearray(16))], [None])
        except MooncakeError:
            return
        status, _, size = RESPONSE.unpack(header)
        assert outcome is None or (status != OK and size <= MAX_ERROR_BYTES)
    finally:
        a.close()
        b.close()


# ---- a real data server keeps serving --------------------------------------------------------


@pytest.fixture(scope="module")
def data_server():
    loop = asyncio.new_event_loop()
    access = _access()
    server = loop.run_until_complete(start_data_server(access, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield server.sockets[0].getsockname()[1], access
    loop.call_soon_threadsafe(server.close)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _ping(port: int) -> tuple[int, int, int]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        # A PING carries one of the node's grants (issue 12): only its holders get an answer.
        sock.sendall(pack_request(Op.PING, _grant(0, 16, GrantMode.READ), 0, 0))
        return RESPONSE.unpack(sock.recv(RESPONSE.size, socket.MSG_WAITALL))


@settings(max_examples=40, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.tuples(headers, st.binary(max_size=64)).map(lambda t: t[0] + t[1]),
    )
)
def test_real_server_survives_hostile_streams(data_server, data):
    port, _ = data_server
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(2)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):  # the node answers and/or hangs up; it never stalls
                pass
        except (ConnectionResetError, BrokenPipeError, OSError) as exc:
            assert not isinstance(exc, TimeoutError), "the node stalled"
    assert _ping(port) == (OK, 0, 0)


def test_oversized_error_replies_are_refused_by_the_client():
    a, b = socket.socketpair()
    with a, b:
        b.sendall(RESPONSE.pack(DataPathError.code, 0, 1 << 60))
        loc = ReplicaLocation("n", SEGMENT, "peer:1", "", 0, 16, b"", "DRAM")
        with pytest.raises(DataPathError, match="error reply of"):
            BlockingNodeConnections(timeout_s=1)._receive(a, loc, [], [])
