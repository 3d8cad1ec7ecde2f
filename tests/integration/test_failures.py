"""Faults with real processes: corruption, forged grants, master restarts, nodes killed mid-put.

The rule under test: a read returns the right bytes or a clear error, never wrong bytes, and a
put that fails half-way leaves nothing visible.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time

import pytest

from mooncake_store import (
    AccessDeniedError,
    AsyncClient,
    ChecksumMismatchError,
    Client,
    DataPathError,
    GrantExpiredError,
    ObjectNotFoundError,
)
from mooncake_store.client.master_client import MasterClient
from mooncake_store.client.transport import ShmMapper, TcpPool
from mooncake_store.client.types import PutSpec, ReplicaLocation, Retry
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER, replica_list, wait_until


class _MasterSession:
    """One master connection held open on a loop thread of its own: a put it started stays
    pending (its write grant valid) until the test ends, since the master revokes a closed
    connection's pending puts (a framed one at once, a gRPC one within about a second: see
    master/grpc_owners.py).  A test that wrote with the grant of a put whose connection had
    already closed raced that revocation."""

    def __init__(self, master: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def connect() -> MasterClient:
            return MasterClient(master, timeout_s=5, retry=Retry(), framed=False)

        self.client = self.run(connect())

    def run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def close(self) -> None:
        self.run(self.client.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


_sessions: dict[str, _MasterSession] = {}


@pytest.fixture(autouse=True)
def _close_master_sessions():
    yield
    while _sessions:
        _sessions.popitem()[1].close()


def put_start(master: str, key: str, size: int):
    """Start a put of one replica over gRPC on a connection that stays open until the test
    ends (so the put stays pending until then, or until --put-timeout)."""
    session = _sessions.get(master) or _sessions.setdefault(master, _MasterSession(master))
    return session.run(session.client.put_start([PutSpec(key, size, 1)]))[0]


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Read exactly size bytes.  MSG_WAITALL is no help here: a socket with a timeout is
    non-blocking underneath, and its recv returns whatever has arrived."""
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError(f"peer closed after {got} of {size} bytes")
        got += n
    return bytes(data)


def raw_request(
    loc: ReplicaLocation, op: Op, grant: bytes, offset: int, size: int, payload: bytes = b""
) -> tuple[int, bytes]:
    host, _, port = loc.endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(pack_request(op, grant, offset, size) + payload)
        status, _, length = RESPONSE.unpack(recv_exact(sock, RESPONSE.size))
        body = recv_exact(sock, length)
        return status, body


def corrupt(loc: ReplicaLocation) -> None:
    """Flip a byte of a replica in place, through the node's shared memory."""
    mapper = ShmMapper()
    pool = mapper.map(loc)
    assert pool is not None
    pool[loc.offset] ^= 0xFF
    mapper.close()


@pytest.fixture(scope="module")
def cluster3(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    with InProcessCluster(
        root, nodes=3, dram="64MiB", master_args=[*FAST_MASTER, "--put-timeout", "1s"]
    ) as c:
        yield c


@pytest.mark.parametrize("local_shm", [True, False])
def test_corrupt_replica_is_never_returned(cluster3, local_shm):
    key = f"corrupt/{local_shm}"
    value = os.urandom(200_000)
    with Client(cluster3.master_address, local_shm=local_shm) as store:
        store.put(key, value, replicas=2)
        info = replica_list(cluster3.master_address, key)
        corrupt(info.replicas[0])
        assert store.get(key) == value  # served from the healthy replica
        corrupt(info.replicas[1])
        out = bytearray(len(value))
        with pytest.raises(ChecksumMismatchError):
            store.get_into(key, out)
        assert store.counters["checksum_failures"] >= 3
        # Every replica failed: the read reported it and the master deleted the object, so
        # the key can be written again (issue 11: poisoned keys heal).
        assert store.counters["corrupt_reported"] == 1
        with pytest.raises(ObjectNotFoundError):
            store.get(key)


def test_node_refuses_forged_expired_and_out_of_range_grants(cluster3):
    with Client(cluster3.master_address) as store:
        store.put("granted", os.urandom(10_000))
    loc = replica_list(cluster3.master_address, "granted").replicas[0]
    status, body = raw_request(loc, Op.READ, loc.grant, loc.offset, 10_000)
    assert status == 0 and len(body) == 10_000  # the genuine grant works

    forged = bytearray(loc.grant)
    forged[8] ^= 0x10  # point the grant somewhere else
    status, body = raw_request(loc, Op.READ, bytes(forged), loc.offset, 100)
    assert status == AccessDeniedError.code and b"signature" in body
    status, body = raw_request(loc, Op.READ, loc.grant, loc.offset + 8192, 10_000)
    assert status == AccessDeniedError.code and b"outside the granted extent" in body
    status, body = raw_request(loc, Op.WRITE, loc.grant, loc.offset, 4, b"evil")
    assert status == AccessDeniedError.code  # a read grant does not allow writing

    plan = put_start(cluster3.master_address, "expiring", 4096)  # put window: 1s
    wloc = plan.replicas[0]

    def expired() -> bool:
        status, body = raw_request(wloc, Op.WRITE, wloc.grant, wloc.offset, 4, b"late")
        return status == GrantExpiredError.code and b"expired" in body

    wait_until(expired, timeout_s=5, what="the write grant to expire")
    with Client(cluster3.master_address) as store:
        wait_until(lambda: not store.stats().processing, what="the zombie put to be reclaimed")
        store.put("expiring", b"a fresh put of the reclaimed key works")
        assert store.get("expiring") == b"a fresh put of the reclaimed key works"


def test_tcp_client_maps_node_errors_to_access_denied(cluster3):
    with Client(cluster3.master_address) as store:
        store.put("denied", b"x" * 100)
    loc = replica_list(cluster3.master_address, "denied").replicas[0]
    bad = ReplicaLocation(
        loc.node_id,
        loc.segment_id,
        loc.endpoint,
        "",
        loc.offset,
        loc.size_bytes,
        b"\0" * len(loc.grant),
    )

    async def read() -> None:
        pool = TcpPool(timeout_s=5)
        try:
            await pool.exchange(bad, Op.READ, memoryview(bytearray(100)))
        finally:
            pool.close()

    with pytest.raises(AccessDeniedError):
        asyncio.run(read())


def test_refused_tcp_writes_raise_their_refusal_not_a_reset(cluster3):
    """A refused WRITE whose payload is far larger than the socket buffers: the node reads and
    discards the payload, so both SDK transports raise the refusal itself (AccessDeniedError,
    GrantExpiredError), never a reset connection, and the node goes on serving."""
    from mooncake_store.client.transport import BlockingNodeConnections

    size = 8 << 20
    value = os.urandom(size)
    with Client(cluster3.master_address) as store:
        store.put("refused-write", value)
    loc = replica_list(cluster3.master_address, "refused-write").replicas[0]
    payload = memoryview(os.urandom(size))
    wloc = put_start(cluster3.master_address, "refused-expired", size).replicas[0]

    def sync_write(target: ReplicaLocation) -> None:
        nodes = BlockingNodeConnections(timeout_s=5)
        try:
            nodes.exchange(target, Op.WRITE, payload)
        finally:
            nodes.close()

    async def async_write(target: ReplicaLocation) -> None:
        pool = TcpPool(timeout_s=5)
        try:
            await pool.exchange(target, Op.WRITE, payload)
        finally:
            pool.close()

    for _ in range(3):  # a reset would show up as DataPathError in some of them
        with pytest.raises(AccessDeniedError, match="outside the granted extent"):
            sync_write(loc)  # a read grant does not allow writing
        with pytest.raises(AccessDeniedError, match="outside the granted extent"):
            asyncio.run(async_write(loc))

    def write_refused_as_expired() -> bool:
        try:
            sync_write(wloc)
        except GrantExpiredError:
            return True
        except AccessDeniedError as exc:  # the put was revoked (its gRPC connection closed, or it
            # timed out) before the grant expired, or the first write sealed its bytes: refused
            # too, not yet as expired
            if "write grant ended" not in exc.message and "already used" not in exc.message:
                raise
        return False  # still within the put window

    wait_until(write_refused_as_expired, timeout_s=30, what="the write grant to expire")
    with pytest.raises(GrantExpiredError):
        asyncio.run(async_write(wloc))
    with Client(cluster3.master_address) as store:  # nothing of the refused writes landed
        assert store.get("refused-write") == value


def test_master_restart_keeps_committed_blocks(tmp_path):
    """SIGTERM and kill -9 of the master: daemon subprocesses (the other tests of the
    module share an in-process cluster)."""
    args = [*FAST_MASTER, "--put-timeout", "1s"]
    with LocalCluster(tmp_path, nodes=3, dram="64MiB", master_args=args) as cluster3:
        values = {f"durable/{i}": os.urandom(50_000 + i) for i in range(40)}
        with Client(cluster3.master_address) as store:
            store.put_many(values)
        for how in (signal.SIGTERM, signal.SIGKILL):
            if how == signal.SIGTERM:
                assert cluster3.master.stop() == 0
            else:
                cluster3.master.signal(signal.SIGKILL)
                cluster3.master.proc.wait()
            cluster3.start_master()
            cluster3.wait_for_nodes(3)  # the nodes notice and mount again
            with Client(cluster3.master_address) as store:
                assert store.get_many(list(values)) == list(values.values())
                assert all(store.exists_many(list(values)))
                # New puts do not overwrite restored extents.
                store.put_many({f"post-restart/{how}/{i}": os.urandom(60_000) for i in range(20)})
                assert store.get_many(list(values)) == list(values.values())


def test_node_killed_mid_put_leaves_nothing_visible(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="64MiB", master_args=FAST_MASTER) as cluster:
        node = cluster.nodes[0]
        with Client(cluster.master_address, local_shm=False, timeout_s=30) as store:
            node.signal(signal.SIGSTOP)  # the 32 MiB TCP write stalls once socket buffers fill
            errors: list[BaseException] = []

            def put() -> None:
                try:
                    store.put("half-written", os.urandom(32 << 20))
                except BaseException as exc:
                    errors.append(exc)

            writer = threading.Thread(target=put)
            writer.start()
            wait_until(lambda: store.stats().processing == 1, what="the put to start")
            node.signal(signal.SIGKILL)
            writer.join(30)
            assert not writer.is_alive()
            assert errors and isinstance(errors[0], DataPathError), errors
            assert not store.exists("half-written")
            with pytest.raises(ObjectNotFoundError):
                store.get("half-written")
            assert store.stats().processing == 0
            # The dead node is dropped after its heartbeat TTL; a new node takes puts again.
            cluster.wait_for_nodes(0)
            cluster.add_node()
            cluster.wait_for_nodes(1)
            store.put("half-written", b"whole")
            assert store.get("half-written") == b"whole"


def test_reads_fall_over_to_a_live_replica(tmp_path):
    with LocalCluster(tmp_path, nodes=2, dram="32MiB", master_args=FAST_MASTER) as cluster:
        values = {f"fallover/{i}": os.urandom(100_000) for i in range(10)}
        with Client(cluster.master_address, local_shm=False) as store:
            store.put_many(values, replicas=2)
            cluster.nodes[0].signal(signal.SIGKILL)
            # Before the master notices, the client skips the dead replica itself...
            assert store.get_many(list(values)) == list(values.values())
            cluster.wait_for_nodes(1)
            # ...and afterwards the master lists only the live one.
            assert store.get_many(list(values)) == list(values.values())


def test_restarted_node_is_remounted_and_its_dead_pool_unmapped(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as store:
            store.put("before", b"old pool")
            assert store.get("before") == b"old pool"
            old_segment = store.list_nodes()[0].segment_id
            assert store._async.flows.shm.mapped_segments() == [old_segment]
            cluster.nodes[0].signal(signal.SIGKILL)
            cluster.nodes[0].proc.wait()
            cluster.restart_node(0)

            def remounted() -> bool:
                segments = [n.segment_id for n in store.list_nodes()]
                return len(segments) == 1 and segments[0] != old_segment

            # Same node id, new pool: the master replaces the old segment at once.
            wait_until(remounted, what="the restarted node to mount")
            with pytest.raises(ObjectNotFoundError):
                store.get("before")  # DRAM contents died with the process
            store.put("after", b"new pool")
            assert store.get("after") == b"new pool"
            new_segment = store.list_nodes()[0].segment_id
            assert store._async.flows.shm.mapped_segments() == [new_segment]


def test_unsynced_commits_survive_a_master_kill(tmp_path):
    """--no-sync-commits skips the fsync, not the write: a kill -9 loses no acknowledged put."""
    args = [*FAST_MASTER, "--no-sync-commits"]
    with LocalCluster(tmp_path, nodes=1, dram="32MiB", master_args=args) as cluster:
        values = {f"unsynced/{i}": os.urandom(4096 + i) for i in range(50)}
        with Client(cluster.master_address) as store:
            for key, value in values.items():  # one commit each, the last just before the kill
                store.put(key, value)
        cluster.master.signal(signal.SIGKILL)
        cluster.master.proc.wait()
        cluster.start_master()
        cluster.wait_for_nodes(1)
        with Client(cluster.master_address) as store:
            assert store.get_many(list(values)) == list(values.values())


@pytest.mark.parametrize("client", ["sync", "async"])
def test_read_whose_grant_expired_asks_the_master_again(tmp_path, client):
    """A batch read reaching the node after its lease ended is refused (GrantExpiredError; as
    one READV, then item by item) and retried once with fresh replica lists, so a slow batch
    does not fail spuriously."""
    args = [*FAST_MASTER, "--lease-ttl", "200ms"]
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as cluster:
        values = {f"slow-read/{i}": os.urandom(100_000 + i) for i in range(3)}
        with Client(cluster.master_address, local_shm=False) as store:
            store.put_many(values)
            gets_before = store.stats().counters["gets"]

        async def read_async() -> list[bytes]:
            async with AsyncClient(cluster.master_address, local_shm=False) as reader:
                return await reader.get_many(list(values))

        def read() -> list[bytes]:
            if client == "async":
                return asyncio.run(read_async())
            with Client(cluster.master_address, local_shm=False) as reader:
                return reader.get_many(list(values))

        node = cluster.nodes[0]
        node.signal(signal.SIGSTOP)  # the requests will wait in the node's socket
        got: list[list[bytes]] = []
        reader = threading.Thread(target=lambda: got.append(read()))
        reader.start()
        time.sleep(0.6)  # three leases long
        node.signal(signal.SIGCONT)
        reader.join(timeout=10)
        assert got == [list(values.values())]
        with Client(cluster.master_address) as store:
            assert store.stats().counters["gets"] == gets_before + 2 * len(values)  # one refresh


def test_pipelined_transfers_survive_refusals_in_the_middle(tmp_path):
    """A batch pipelined on one node socket: a refused read or write is answered with its
    refusal and leaves the rest served (the node discards a refused write's payload and keeps
    the connection)."""
    from dataclasses import replace

    from mooncake_store.client.transport import BlockingNodeConnections

    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        value = os.urandom(20_000)
        with Client(master) as store:
            store.put("pipe/r", value)
        loc = replica_list(master, "pipe/r").replicas[0]
        forged = bytearray(loc.grant)
        forged[-1] ^= 0x01
        nodes = BlockingNodeConnections(timeout_s=5)
        try:
            bufs = [memoryview(bytearray(loc.size_bytes)) for _ in range(3)]
            bad = replace(loc, grant=bytes(forged))
            results = nodes.exchange_many(
                [(loc, Op.READ, bufs[0]), (bad, Op.READ, bufs[1]), (loc, Op.READ, bufs[2])]
            )
            assert results[0] is None and results[2] is None
            assert isinstance(results[1], AccessDeniedError)
            assert bytes(bufs[0]) == bytes(bufs[2]) == value

            wlocs = [put_start(master, f"pipe/w{i}", 4096).replicas[0] for i in range(3)]
            wbad = replace(wlocs[1], grant=bytes(forged))
            payload = memoryview(os.urandom(4096))
            results = nodes.exchange_many(
                [(wlocs[0], Op.WRITE, payload), (wbad, Op.WRITE, payload),
                 (wlocs[2], Op.WRITE, payload)]
            )  # fmt: skip
            assert results[0] is None and results[2] is None
            assert type(results[1]) is AccessDeniedError
            assert "signature" in results[1].message
            # The same connection serves the next batch.
            sock = nodes._socks[loc.endpoint]
            again = nodes.exchange_many([(loc, Op.READ, bufs[0]), (loc, Op.READ, bufs[1])])
            assert again == [None, None] and bytes(bufs[1]) == value
            assert nodes._socks[loc.endpoint] is sock
        finally:
            nodes.close()


def test_node_serves_readv_and_refuses_it_whole(tmp_path):
    """READV: many DRAM extents in one reply; one bad grant refuses the whole request, and the
    connection goes on serving."""
    from mooncake_store.common.wire import pack_readv

    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        values = {f"readv/{i}": os.urandom(5000 + 4096 * i) for i in range(4)}
        with Client(cluster.master_address) as store:
            store.put_many(values)
        locs = [replica_list(cluster.master_address, k).replicas[0] for k in values]
        host, _, port = locs[0].endpoint.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:

            def reply() -> tuple[int, bytes]:
                status, _, length = RESPONSE.unpack(recv_exact(sock, RESPONSE.size))
                return status, recv_exact(sock, length)

            entries = [(loc.grant, loc.offset, loc.size_bytes) for loc in locs]
            sock.sendall(pack_readv(entries))
            status, body = reply()
            assert status == 0 and body == b"".join(values.values())

            forged = bytearray(locs[2].grant)
            forged[-1] ^= 0x01
            entries[2] = (bytes(forged), locs[2].offset, locs[2].size_bytes)
            sock.sendall(pack_readv(entries))
            status, body = reply()
            assert status == AccessDeniedError.code and b"signature" in body

            sock.sendall(pack_request(Op.READ, locs[0].grant, locs[0].offset, locs[0].size_bytes))
            status, body = reply()  # the same connection still serves
            assert status == 0 and body == values["readv/0"]


def test_transports_hash_transfers_as_bytes_move(tmp_path):
    """Both TCP transports feed a read's hasher the bytes it receives, for a lone READ, the
    extents of a READV, and a READV refused whole and retried item by item, and a write's
    hasher the payload it sends: the digest is the checksum of exactly those bytes."""
    from dataclasses import replace

    from mooncake_store.client.transport import BlockingNodeConnections, Hasher
    from mooncake_store.common.checksum import checksum

    with InProcessCluster(tmp_path, nodes=1, dram="64MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        values = {f"hash/{i}": os.urandom(size) for i, size in enumerate((1, 70_000, 3 << 20))}
        with Client(master) as store:
            for key, value in values.items():
                store.put(key, value)
        locs = [replica_list(master, key).replicas[0] for key in values]
        forged = bytearray(locs[0].grant)
        forged[-1] ^= 0x01
        bad = replace(locs[0], grant=bytes(forged))
        want = [checksum(v) for v in values.values()]

        def batch(with_bad: bool) -> tuple[list, list[memoryview], list[Hasher]]:
            chosen = [*locs, bad] if with_bad else locs
            bufs = [memoryview(bytearray(loc.size_bytes)) for loc in chosen]
            return (
                [(loc, Op.READ, b) for loc, b in zip(chosen, bufs, strict=True)],
                bufs,
                [Hasher() for _ in chosen],
            )

        nodes = BlockingNodeConnections(timeout_s=5)
        try:
            lone = memoryview(bytearray(locs[2].size_bytes))
            hasher = Hasher()
            nodes.exchange(locs[2], Op.READ, lone, hasher=hasher)
            assert hasher.intdigest() == want[2] and bytes(lone) == values["hash/2"]
            for with_bad in (False, True):  # one READV; then refused whole, one by one
                transfers, bufs, hashers = batch(with_bad)
                results = nodes.exchange_many(transfers, hashers)
                assert results[:3] == [None, None, None]
                assert [h.intdigest() for h in hashers[:3]] == want
                assert [bytes(b) for b in bufs[:3]] == list(values.values())
                if with_bad:
                    assert isinstance(results[3], AccessDeniedError)
        finally:
            nodes.close()

        async def over_the_pool() -> None:
            pool = TcpPool(timeout_s=5)
            try:
                hasher = Hasher()
                await pool.exchange(locs[2], Op.READ, memoryview(bytearray(3 << 20)), hasher=hasher)
                assert hasher.intdigest() == want[2]
                for with_bad in (False, True):
                    transfers, bufs, hashers = batch(with_bad)
                    results = await pool.exchange_many(transfers, hashers)
                    assert [bytes(b) for b in bufs[:3]] == list(values.values())
                    assert results[:3] == [None, None, None]
                    assert [h.intdigest() for h in hashers[:3]] == want
                    if with_bad:
                        assert isinstance(results[3], AccessDeniedError)
            finally:
                pool.close()

        asyncio.run(over_the_pool())

        payload = memoryview(os.urandom((5 << 20) + 77))  # pieces of 1 MiB and a short one
        digest = checksum(payload)
        nodes = BlockingNodeConnections(timeout_s=5)
        try:
            hasher = Hasher()
            nodes.exchange(put_start(master, "hash/w1", len(payload)).replicas[0], Op.WRITE,
                           payload, hasher=hasher)  # fmt: skip
            assert hasher.intdigest() == digest
            hashers = [Hasher(), None]
            targets = [put_start(master, f"hash/w{i}", len(payload)).replicas[0] for i in (2, 3)]
            assert nodes.exchange_many([(t, Op.WRITE, payload) for t in targets], hashers) == [
                None,
                None,
            ]
            assert hashers[0].intdigest() == digest
        finally:
            nodes.close()

        lone, batched = (put_start(master, f"hash/w{i}", len(payload)).replicas[0] for i in (4, 5))

        async def write_over_the_pool() -> None:
            pool = TcpPool(timeout_s=5)
            try:
                hasher = Hasher()
                await pool.exchange(lone, Op.WRITE, payload, hasher=hasher)
                assert hasher.intdigest() == digest
                hashers = [Hasher()]
                assert await pool.exchange_many([(batched, Op.WRITE, payload)], hashers) == [None]
                assert hashers[0].intdigest() == digest
            finally:
                pool.close()

        asyncio.run(write_over_the_pool())
