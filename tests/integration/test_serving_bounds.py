"""Bounds on what one client can make the master's serving loop do (master/batches.py,
master/framed_server.py, master/grpc_admission.py): batch caps (and the client's slices of a
bigger batch), batches served in slices, calls in flight per connection, idle connections, and
the connection caps (framed and gRPC)."""

from __future__ import annotations

import asyncio
import inspect
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from mooncake_store import (
    AsyncClient,
    Client,
    IdentityMismatchError,
    InvalidArgumentError,
    MooncakeError,
    ObjectNotFoundError,
)
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.ops import master_metadata
from mooncake_store.client.master_client import MasterClient
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.framed import HEADER, METHOD_IDS, FrameStatus
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.grpc_admission import hard_limit
from mooncake_store.master.server import MasterServer
from mooncake_store.master.service import MasterServicer
from tests.conftest import wait_until
from tests.integration.test_liveness import InProcessMaster


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    root = tmp_path_factory.mktemp("capped")
    with InProcessCluster(
        root, nodes=1, dram="32MiB", master_args=["--max-batch-items", "100"]
    ) as c:
        yield c


@pytest.mark.parametrize("framed", [True, False])
def test_a_batch_over_the_cap_is_refused_whole_naming_the_cap(
    capped: InProcessCluster, framed: bool
) -> None:
    with Client(capped.master_address, framed=framed) as store:
        store.put("k0", b"v")
        keys = [f"k{i}" for i in range(101)]
        master = store._master()
        assert master.max_batch_items == 100  # said by the master's Hello
        for name in ("BatchExists", "BatchGetReplicaList"):  # sent whole, by hand
            with pytest.raises(InvalidArgumentError, match=r"at most 100 .*--max-batch-items"):
                store._run(master._call(name, pb.KeysRequest(keys=keys), idempotent=True))
        leased = pb.BatchLeasedPutRequest(  # leased puts too (none of these leases exists)
            items=[pb.LeasedPutItem(spec=pb.PutStartItem(key=k, size_bytes=1), lease_id="x")
                   for k in keys]
        )  # fmt: skip
        with pytest.raises(InvalidArgumentError, match=r"at most 100 .*--max-batch-items"):
            store._run(master._call("BatchLeasedPut", leased, idempotent=True))
        assert store.exists_many(keys[:100]) == [True] + [False] * 99  # at the cap: served
        assert store.get("k0") == b"v"


def batch_value(key: str) -> bytes:
    return key.encode() * 8


class _Store:
    """The sync Client or an AsyncClient (run on a loop of its own) behind one face."""

    def __init__(self, address: str, framed: bool, sync: bool) -> None:
        self.sync = sync
        if sync:
            self.client: Any = Client(address, framed=framed, local_shm=False).connect()
        else:
            self.loop = asyncio.new_event_loop()
            self.client = AsyncClient(address, framed=framed, local_shm=False)
            self.loop.run_until_complete(self.client.connect())

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.client, name)
        if self.sync or not inspect.iscoroutinefunction(method):
            return method
        return lambda *args, **kw: self.loop.run_until_complete(method(*args, **kw))

    def master(self) -> MasterClient:
        return self.client._master() if self.sync else self.client.flows.master_client()

    def close(self) -> None:
        if self.sync:
            self.client.close()
        else:
            self.loop.run_until_complete(self.client.close())
            self.loop.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_batches_over_the_cap_go_as_slices_with_per_item_outcomes_in_order(
    capped: InProcessCluster, framed: bool, sync: bool
) -> None:
    """A master with --max-batch-items 100 and batches of 1000: the client learns the cap from
    Hello and sends slices of at most 100 (pipelined by the async client), merging the
    per-item outcomes in order; a failure of some items in one slice stays theirs."""
    prefix = f"slices/{'sync' if sync else 'async'}-{'framed' if framed else 'grpc'}"
    keys = [f"{prefix}/{i}" for i in range(1000)]
    store = _Store(capped.master_address, framed, sync)
    try:
        master = store.master()
        assert master.max_batch_items == 100  # learnt from Hello at connect
        calls = dict(store.counters)
        # Two keys in the 5th slice are stored under another identity: only they fail.
        for key in keys[450:452]:
            store.put(key, batch_value(key), fingerprint=b"someone-else")
        outcomes = store.put_many_outcomes({k: batch_value(k) for k in keys})
        assert len(outcomes) == 1000
        for i, (key, outcome) in enumerate(zip(keys, outcomes, strict=True)):
            if i in (450, 451):
                assert isinstance(outcome, IdentityMismatchError), (i, outcome)
            else:
                assert outcome.key == key and not outcome.deduplicated, (i, outcome)
        sent = dict(store.counters)
        endpoint = "framed_calls" if framed else "grpc_calls"
        assert sent[endpoint] - calls[endpoint] >= 20  # PutStart and PutEnd, 10 slices each
        assert store.put_many({k: batch_value(k) for k in keys[:300]})[299].deduplicated

        missing = [f"{prefix}/missing/{i}" for i in range(3)]
        asked = keys[:520] + missing + keys[520:]  # the missing keys sit in the 6th slice
        assert store.exists_many(asked) == [True] * 520 + [False] * 3 + [True] * 480
        assert store.get_many(keys) == [batch_value(k) for k in keys]
        with pytest.raises(ObjectNotFoundError) as lost:
            store.get_many(asked)
        assert sorted(lost.value.keys) == missing
        buffers = [bytearray(len(batch_value(k))) for k in keys]
        assert store.get_many_into(keys, buffers) == [len(b) for b in buffers]
        assert [bytes(b) for b in buffers] == [batch_value(k) for k in keys]
        # A prefix goes slice after slice while the run covers each whole.
        assert store.prefix_match(keys) == 1000
        before = store.counters[endpoint]
        assert store.prefix_match(asked) == 520
        assert store.counters[endpoint] - before == 6  # the 6th slice ended the run
        buffers = [bytearray(len(batch_value(k))) for k in asked]
        read = store.get_prefix_into(asked, buffers)
        assert read.matched == 520 and read.sizes == [len(batch_value(k)) for k in keys[:520]]
        assert [bytes(b) for b in buffers[:520]] == [batch_value(k) for k in keys[:520]]

        # A client that thinks the cap is bigger (an older master that did not say, or one
        # restarted with a smaller cap) learns it from the refusal and splits.
        master.max_batch_items = 100_000
        assert store.exists_many(keys) == [True] * 1000
        assert master.max_batch_items == 100

        assert store.remove_many(asked) == [True] * 520 + [False] * 3 + [True] * 480
        assert store.exists_many(keys) == [False] * 1000
    finally:
        store.close()


def test_a_big_batch_yields_to_the_loop_between_slices(tmp_path: Path) -> None:
    """Driven by hand: each suspension of the coroutine is a yield to the serving loop, where
    other calls (and the tick) run.  A small batch still completes without one."""
    server = MasterServer(MasterConfig(port=0, data_dir=str(tmp_path)))
    servicer = MasterServicer(server.table, None, server.config, server.tiering,  # type: ignore[arg-type]
                              server.replication)  # fmt: skip

    def suspensions(coro: object) -> tuple[int, object]:
        count = 0
        while True:
            try:
                coro.send(None)  # type: ignore[attr-defined]
            except StopIteration as stop:
                return count, stop.value
            count += 1

    big = pb.KeysRequest(keys=[f"key-{i}" for i in range(5000)])
    count, reply = suspensions(servicer.BatchExists(big, None))
    assert count == 4 and list(reply.exists) == [False] * 5000  # 5 slices of <= 1024 keys
    count, reply = suspensions(servicer.BatchGetReplicaList(big, None))
    assert count == 4 and len(reply.results) == 5000
    count, reply = suspensions(servicer.BatchExists(pb.KeysRequest(keys=["a", "b"]), None))
    assert count == 0 and list(reply.exists) == [False, False]


def frame(call_id: int, method: str, request: object) -> bytes:
    payload = request.SerializeToString()  # type: ignore[attr-defined]
    return HEADER.pack(len(payload), call_id, METHOD_IDS[method]) + payload


def read_frame(sock: socket.socket) -> tuple[int, int, bytes]:
    head = b""
    while len(head) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(head))
        if not chunk:
            raise ConnectionError("closed")
        head += chunk
    size, call_id, status = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        chunk = sock.recv(size - len(body))
        if not chunk:
            raise ConnectionError("closed")
        body += chunk
    return call_id, status, body


def closed_by_peer(sock: socket.socket, timeout_s: float) -> bool:
    sock.settimeout(timeout_s)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


@pytest.mark.timeout(120)
def test_framed_connections_are_bounded(tmp_path: Path) -> None:
    # --auth off: the raw sockets below speak frames without an Authenticate first
    # (tests/integration/test_security.py covers that refusal).  The idle timeout is long here:
    # a loaded machine may stall this test for seconds between steps, and no connection may be
    # closed as idle meanwhile; the idle close is checked below on a master with a short one.
    config = MasterConfig(
        port=0, data_dir=str(tmp_path / "capped"), max_calls_per_connection=2, max_connections=3,
        idle_timeout_s=600.0, auth="off",
    )  # fmt: skip
    master = InProcessMaster(config)
    framed = master.server._framed
    assert framed is not None
    address = ("127.0.0.1", master.server.framed_port)
    seen: list[tuple[int, bool]] = []  # (calls in flight, reading paused), sampled in the loop

    async def sample() -> None:
        while True:
            for connection in list(framed.connections):
                seen.append((len(connection.tasks), connection.paused))
            await asyncio.sleep(0)

    sampler = asyncio.run_coroutine_threadsafe(sample(), master.loop)
    try:
        # Pipelined big lookups (each served in slices, so each stays in flight a while): never
        # more than 2 in flight on the connection; the rest wait unread, and every one is
        # answered, in full.
        with socket.create_connection(address) as sock:
            sock.settimeout(60)
            big = pb.KeysRequest(keys=[f"key-{i}" for i in range(20000)])
            sock.sendall(b"".join(frame(i, "BatchExists", big) for i in range(1, 21)))
            replies = {}
            for _ in range(20):
                call_id, status, body = read_frame(sock)
                assert status == FrameStatus.OK
                replies[call_id] = len(pb.BatchExistsResponse.FromString(body).exists)
            assert replies == dict.fromkeys(range(1, 21), 20000)
        sampler.cancel()
        assert max(n for n, _ in seen) <= 2 and any(paused for _, paused in seen)

        # The connection cap: the fourth connection is refused with a frame naming the cap.
        opened = [socket.create_connection(address) for _ in range(3)]
        wait_until(lambda: len(framed.connections) == 3, timeout_s=60, what="three connections")
        with socket.create_connection(address) as extra:
            extra.settimeout(60)
            call_id, status, body = read_frame(extra)
            assert (call_id, status) == (0, FrameStatus.BAD_REQUEST)
            assert b"at most 3 framed connections (--max-connections)" in body
            assert closed_by_peer(extra, 60)
        # An open one still serves.
        opened[0].settimeout(60)
        opened[0].sendall(frame(7, "BatchExists", pb.KeysRequest(keys=["x"])))
        assert read_frame(opened[0])[:2] == (7, FrameStatus.OK)
        for s in opened:
            s.close()
    finally:
        sampler.cancel()
        master.close()

    # All of them go once idle for the timeout (1 s here): each connection is served a call as
    # soon as it opens (so none is idle before it is used), then left quiet.
    config = MasterConfig(port=0, data_dir=str(tmp_path / "idle"), max_connections=3,
                          idle_timeout_s=1.0, auth="off")  # fmt: skip
    master = InProcessMaster(config)
    try:
        address = ("127.0.0.1", master.server.framed_port)
        opened = []
        for call_id in range(3):
            s = socket.create_connection(address)
            opened.append(s)
            s.sendall(frame(call_id, "BatchExists", pb.KeysRequest(keys=["x"])))
        for call_id, s in enumerate(opened):
            s.settimeout(60)
            assert read_frame(s)[:2] == (call_id, FrameStatus.OK)
        assert all(closed_by_peer(s, 60) for s in opened)
        for s in opened:
            s.close()
    finally:
        master.close()


def test_clients_reconnect_after_an_idle_close(tmp_path: Path) -> None:
    config = MasterConfig(port=0, data_dir=str(tmp_path), idle_timeout_s=0.5)
    master = InProcessMaster(config)
    try:
        with Client(f"127.0.0.1:{master.port}") as store:
            assert store.exists_many(["a"]) == [False]
            wait_until(lambda: not master.server._framed.connections, what="idle close")  # type: ignore[union-attr]
            time.sleep(0.1)
            assert store.exists_many(["a", "b"]) == [False, False]
    finally:
        master.close()


@pytest.mark.timeout(120)
def test_a_client_that_does_not_read_its_replies_is_not_buffered_without_bound(
    tmp_path: Path,
) -> None:
    """The issue's repro, scaled down: one client pipelines lookups and reads no reply.  The
    master stops reading that connection once its unsent replies pass the high-water mark,
    instead of queueing megabytes of replies; every reply arrives once the client reads."""
    master = InProcessMaster(MasterConfig(port=0, data_dir=str(tmp_path), auth="off"))  # raw
    framed = master.server._framed
    assert framed is not None
    most = [0]  # the largest reply backlog seen on the connection, sampled in the loop

    async def sample() -> None:
        while True:
            for connection in list(framed.connections):
                if connection.transport is not None:
                    size = connection.transport.get_write_buffer_size()
                    most[0] = max(most[0], size)
            await asyncio.sleep(0.001)

    sampler = asyncio.run_coroutine_threadsafe(sample(), master.loop)
    # ~8 MB of replies: more than the kernel buffers on their way (a send buffer autotuned up
    # to net.ipv4.tcp_wmem's 4 MiB by default, and the small receive buffer set below), so
    # the master must stop reading however fast or slow the machine runs it.
    calls, keys = 400, [f"absent-{i}" for i in range(500)]
    try:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)  # before connecting
            sock.settimeout(60)
            sock.connect(("127.0.0.1", master.server.framed_port))
            request = pb.KeysRequest(keys=keys)
            data = b"".join(frame(i, "BatchGetReplicaList", request) for i in range(calls))
            sender = threading.Thread(target=sock.sendall, args=(data,))
            sender.start()
            # The client reads nothing until the master stopped reading its connection.
            paused = wait_until(lambda: any(c.paused for c in framed.connections),
                                timeout_s=60, what="the master to stop reading")  # fmt: skip
            got = 0
            for _ in range(calls):
                _, status, body = read_frame(sock)
                assert status == FrameStatus.OK
                got += len(pb.BatchGetReplicaListResponse.FromString(body).results) == len(keys)
            sender.join(60)
        reply_bytes = len(body)
        assert got == calls
        assert paused  # it stopped reading the connection
        # Unbounded, the backlog would be every reply (calls * reply_bytes, ~8 MB here).
        assert most[0] < 4 * reply_bytes + 256 * 1024 < calls * reply_bytes
    finally:
        sampler.cancel()
        master.close()


def own_channel(address: str) -> grpc.Channel:
    """A gRPC channel on a TCP connection of its own (channels of one process share one by
    default)."""
    return grpc.insecure_channel(address, options=[("grpc.use_local_subchannel_pool", 1)])


@pytest.mark.timeout(120)
def test_grpc_connections_over_the_cap_are_refused_clearly_and_heartbeats_never(
    tmp_path: Path,
) -> None:
    """--max-connections 3 on gRPC: a 4th connection's calls are refused RESOURCE_EXHAUSTED
    naming the flag (the Python client's too), closing one lets the next in.  The node's
    heartbeats go to this same port (--liveness-port -1) and are never refused: it stays
    valid well past its TTL meanwhile."""
    args = ["--max-connections", "3", "--liveness-port", "-1", "--heartbeat-interval", "200ms",
            "--heartbeat-ttl", "1s", "--suspect-grace", "1s"]  # fmt: skip
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as cluster:
        address = cluster.master_address
        token = master_metadata(address)
        channels = [own_channel(address) for _ in range(5)]
        stubs = [pb_grpc.MasterServiceStub(c) for c in channels]

        def stats(i: int) -> pb.StatsResponse:
            return stubs[i].Stats(pb.StatsRequest(), timeout=10, metadata=token)

        try:
            # Without a token: refused by authentication, and takes no place.
            with pytest.raises(grpc.RpcError) as denied:
                stubs[4].Stats(pb.StatsRequest(), timeout=10)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            wait_until(lambda: _answers(stats, 0), what="a place for the first connection")
            assert stats(1).nodes == 1 and stats(2).nodes == 1
            with pytest.raises(grpc.RpcError) as refused:
                stats(3)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "at most 3 gRPC client connections (--max-connections)" in str(
                refused.value.details()
            )
            with Client(address, framed=False) as store:  # the SDK says so too
                with pytest.raises(MooncakeError, match=r"at most 3 .*--max-connections"):
                    store.stats()
            started = time.monotonic()
            # Past the node's TTL + grace, with the cap full: its heartbeats still land.
            wait_until(lambda: time.monotonic() - started > 2.5 and not _answers(stats, 3),
                       what="2.5 s at the cap")  # fmt: skip
            (node,) = stubs[0].ListNodes(pb.ListNodesRequest(), timeout=10, metadata=token).nodes
            assert node.state == "valid" and node.last_heartbeat_age_s < 1.0, node
            assert stats(0).counters["nodes_expired"] == 0
            channels[1].close()  # frees a place: the refused connection gets in
            wait_until(lambda: _answers(stats, 3), what="the 4th connection to get in")
            assert stats(0).nodes == 1 and stats(2).nodes == 1
            with pytest.raises(grpc.RpcError) as again:
                stubs[4].Stats(pb.StatsRequest(), timeout=10, metadata=token)
            assert again.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            # A flood: past hard_limit(3) connections in all, gRPC closes them at accept
            flood = [socket.create_connection(("127.0.0.1", cluster.master_port))
                     for _ in range(hard_limit(3) + 5)]  # fmt: skip
            try:
                closed = wait_until(
                    lambda: sum(map(_closed, flood)) >= 5,
                    what="the flood's extra connections to close",
                )
                assert closed and not all(map(_closed, flood))
            finally:
                for sock in flood:
                    sock.close()
            (node,) = stubs[0].ListNodes(pb.ListNodesRequest(), timeout=10, metadata=token).nodes
            assert node.state == "valid", node
        finally:
            for channel in channels:
                channel.close()


def _closed(sock: socket.socket) -> bool:
    """Whether the peer closed `sock` (what it sent before is read and dropped)."""
    sock.setblocking(False)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except BlockingIOError:
        return False
    except ConnectionError:
        return True


def _answers(stats: Any, i: int) -> bool:
    try:
        stats(i)
        return True
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            raise
        return False
