"""Write grants end at once (issue 11): a put's grant cannot rewrite the bytes it wrote, even
before the master's next write fence, and a node mounted afresh refuses older grants.

Puts are driven by hand here (MasterClient PutStart, a raw data-path WRITE with the grant,
PutEnd), as a client misusing its own grant would, against a real master and node (in-process:
InProcessCluster)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.ops import master_metadata
from mooncake_store.client.master_client import MasterClient, put_end_call, put_revoke_call
from mooncake_store.client.types import PutPlan, PutSpec, ReplicaLocation, Retry
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.checksum import checksum
from mooncake_store.common.errors import OK, AccessDeniedError, SegmentNotFoundError
from mooncake_store.common.grant import grant_generation
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER, wait_until

VALUE = os.urandom(256 * 1024)
# No tick within a test: no write fence is pushed, so only the seal can refuse a write.
SLOW_TICKS = [*FAST_MASTER, "--tick-interval", "1h"]


@pytest.fixture(scope="module")
def no_fences(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    root = tmp_path_factory.mktemp("grants")
    with InProcessCluster(root, nodes=1, dram="16MiB", master_args=SLOW_TICKS) as cluster:
        yield cluster


class Master:
    """One MasterClient connection kept for a whole test (the master revokes a connection's
    pending puts when it closes), driven from blocking test code."""

    def __init__(self, address: str) -> None:
        self.loop = asyncio.new_event_loop()

        async def connect() -> MasterClient:  # grpc.aio binds the channel to this loop
            return MasterClient(address, timeout_s=5, retry=Retry())

        self.client = self.loop.run_until_complete(connect())

    def __enter__(self) -> Master:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.loop.run_until_complete(self.client.close())
        self.loop.close()

    def run(self, call: object) -> object:
        return self.loop.run_until_complete(self.client.run(call))  # type: ignore[arg-type]

    def put_start(self, key: str, size: int) -> ReplicaLocation:
        [plan] = self.loop.run_until_complete(self.client.put_start([PutSpec(key, size)]))
        assert isinstance(plan, PutPlan) and not plan.already_exists, plan
        (loc,) = plan.replicas
        return loc


def write(sock: socket.socket, loc: ReplicaLocation, data: bytes, at: int = 0) -> tuple[int, str]:
    """One data-path WRITE of `data` at `at` bytes into the replica: (status, message)."""
    sock.sendall(pack_request(Op.WRITE, loc.grant, loc.offset + at, len(data)) + data)
    header = sock.recv(RESPONSE.size, socket.MSG_WAITALL)
    status, _, length = RESPONSE.unpack(header)
    message = sock.recv(length, socket.MSG_WAITALL) if length else b""
    return status, message.decode()


def connect(loc: ReplicaLocation) -> socket.socket:
    host, _, port = loc.endpoint.rpartition(":")
    return socket.create_connection((host, int(port)), timeout=10)


def test_a_put_grant_cannot_rewrite_its_committed_bytes_before_any_fence(no_fences):
    master = no_fences.master_address
    half = len(VALUE) // 2
    with Master(master) as calls, connect(loc := calls.put_start("sealed", len(VALUE))) as sock:
        # One grant, several writes at disjoint ranges: all of them work.
        assert write(sock, loc, VALUE[:half]) == (OK, "")
        assert write(sock, loc, VALUE[half:], at=half) == (OK, "")
        [replicas] = calls.run(put_end_call([("sealed", checksum(VALUE), [], 0)]))
        assert replicas == 1
        # The master ticks once an hour, so no fence has reached the node: the seal refuses.
        for at, size in ((0, len(VALUE)), (half, 4096), (half - 1, 2)):
            status, message = write(sock, loc, b"\xee" * size, at=at)
            assert status == AccessDeniedError.code
            assert "already used for these bytes" in message
        assert write(sock, loc, b"", at=0) == (OK, "")  # zero bytes overlap nothing
    with Client(master) as store:
        assert store.get("sealed") == VALUE


def test_a_write_cut_off_mid_payload_seals_nothing(no_fences):
    master = no_fences.master_address
    with Master(master) as calls:
        loc = calls.put_start("cut", len(VALUE))
        with connect(loc) as sock:  # half the payload, then the connection is gone
            sock.sendall(pack_request(Op.WRITE, loc.grant, loc.offset, len(VALUE)) + VALUE[:999])

        def retried() -> bool:  # refused only until the node has seen that connection go
            with connect(loc) as sock:
                status, message = write(sock, loc, VALUE)
            assert status == OK or "being written" in message, message
            return status == OK

        wait_until(retried, what="the node to drop the cut-off write")  # then it works
        assert calls.run(put_end_call([("cut", checksum(VALUE), [], 0)])) == [1]
    with Client(master) as store:
        assert store.get("cut") == VALUE


def test_a_revoked_puts_written_bytes_are_sealed_too(no_fences):
    with Master(no_fences.master_address) as calls:
        loc = calls.put_start("revoked", len(VALUE))
        sock = connect(loc)
        assert write(sock, loc, VALUE) == (OK, "")
        assert calls.run(put_revoke_call(["revoked"])) == [None]
    with sock:
        status, message = write(sock, loc, VALUE)
        assert status == AccessDeniedError.code and "already used" in message


def test_a_node_mounted_again_refuses_grants_issued_before_the_mount(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        with Master(master) as calls:  # granted, never written
            loc = calls.put_start("before-restart", len(VALUE))
        assert cluster.master is not None
        cluster.master.stop()
        cluster.start_master()  # same port and data: the node mounts on it again
        cluster.wait_for_nodes(1)
        with Client(master) as store:  # the new master's puts (its generations) are served
            store.put("after-restart", VALUE)
            assert store.get("after-restart") == VALUE
        with connect(loc) as sock:
            status, message = write(sock, loc, b"\xee" * len(VALUE))
        assert status == AccessDeniedError.code
        assert "write grant ended" in message
        with Client(master) as store:
            assert store.get("after-restart") == VALUE


def test_a_node_the_master_forgot_refuses_grants_of_its_earlier_mount(tmp_path):
    """The master drops the node (here: an UnmountSegment, as after a missed-heartbeat drop) and
    with it the pending put; the node learns it from its next heartbeat, mounts again under the
    same incarnation and segment, and the earlier mount's grants no longer work there."""
    args = [*SLOW_TICKS, "--auth", "off"]  # the test sends the node's UnmountSegment itself
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as cluster:
        master, node = cluster.master_address, cluster.nodes[0]
        with Master(master) as calls:
            loc = calls.put_start("forgotten", len(VALUE))
            with grpc.insecure_channel(master) as channel:
                pb_grpc.MasterServiceStub(channel).UnmountSegment(
                    pb.UnmountSegmentRequest(
                        node_id=node.node_id, incarnation=node.server.incarnation
                    ),
                    timeout=5,
                )
            cluster.wait_for_nodes(1)  # mounted again, the same segment id
            with Client(master) as store:
                store.put("remounted", VALUE)
                assert store.get("remounted") == VALUE
            with connect(loc) as sock:
                status, message = write(sock, loc, b"\xee" * len(VALUE))
            assert status == AccessDeniedError.code
            assert "write grant ended" in message
        with Client(master) as store:
            assert store.get("remounted") == VALUE


def test_a_lease_a_deduplicated_put_wrote_over_tcp_is_replaced_not_reused(no_fences):
    """A leased put of a key already stored wrote the value into the lease over TCP before the
    master said "deduplicated": that lease's grant is sealed over those bytes, so the client
    releases it rather than keeping it, and the next put of that size is still one call."""
    value = os.urandom(len(VALUE))
    with Client(no_fences.master_address, leases=True, local_shm=False) as store:
        store.put("dedup/a", value)  # two-phase; its PutEnd brings a lease
        assert store.put("dedup/a", value).deduplicated  # leased: written, then deduplicated
        calls = store.counters["framed_calls"]
        other = os.urandom(len(VALUE))
        assert not store.put("dedup/b", other).deduplicated
        assert store.counters["framed_calls"] == calls + 1  # no refused write, no retry
        assert store.counters["leased_puts"] == 1
        assert store.get_many(["dedup/a", "dedup/b"]) == [value, other]


class PoseAsMaster(pb_grpc.MasterServiceServicer):
    """A process on the master's port while the master is down (see README "Threat model"):
    it answers the node's mount with a fence that would reopen every generation, unsigned."""

    def __init__(self) -> None:
        self.mounts = 0

    def MountSegment(self, request: pb.MountSegmentRequest, context: object) -> object:
        self.mounts += 1
        fences = [pb.WriteFence(segment_id=s.segment_id, floor=0) for s in request.segments]
        return pb.MountSegmentResponse(status=pb.Status(code=OK), heartbeat_interval_s=0.2,
                                       fences=fences, fences_signature="1.2.3")  # fmt: skip

    def Heartbeat(self, request: pb.HeartbeatRequest, context: object) -> object:
        return pb.HeartbeatResponse(status=pb.Status(code=SegmentNotFoundError.code))


def test_a_mount_reply_not_signed_by_the_master_reopens_no_grant(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        node = cluster.nodes[0]
        with Master(cluster.master_address) as calls:
            loc = calls.put_start("kept", len(VALUE))
            with connect(loc) as sock:
                assert write(sock, loc, VALUE) == (OK, "")
            assert calls.run(put_end_call([("kept", checksum(VALUE), [], 0)])) == [1]
        gate = node.server.access.gate
        # The master's next tick fences the put's generation, and the node drops its seals.
        wait_until(lambda: gate.generations() == 0, what="the write fence")
        assert cluster.master is not None
        port = cluster.master_port
        cluster.master.stop()
        impostor = grpc.server(concurrent.futures.ThreadPoolExecutor(2))
        fake = PoseAsMaster()
        pb_grpc.add_MasterServiceServicer_to_server(fake, impostor)
        impostor.add_insecure_port(f"127.0.0.1:{port}")
        impostor.start()
        try:
            wait_until(lambda: fake.mounts >= 2, what="the node to mount on the impostor")
            with connect(loc) as sock:  # the grant is unexpired, and no seal holds any more
                status, message = write(sock, loc, b"\xee" * len(VALUE))
            assert status == AccessDeniedError.code and "write grant ended" in message
        finally:
            impostor.stop(None)
        cluster.start_master()
        cluster.wait_for_nodes(1)
        with Client(cluster.master_address) as store:
            assert store.get("kept") == VALUE


MiB = 1 << 20


def fill_past_free_room(master: str, count: int) -> dict[str, bytes]:
    """Another client's `count` puts of 1 MiB into the 16 MiB pool, the last finding no free
    room: the master then takes back unused leases and puts whose grant ended, waits for the
    node's write fence, and gives that extent to the put (each acknowledged: returned here)."""
    stored = {}
    with Client(master, leases=False) as other:
        for i in range(count):
            stored[f"cut/b{i}"] = value = os.urandom(MiB)
            other.put(f"cut/b{i}", value)
    return stored


def test_a_tcp_write_still_landing_when_a_fence_ends_its_lease_is_cut_off(tmp_path):
    """A write admitted under a lease is still receiving its payload (a slow client, a large
    value) when another client's put takes the lease's room back.  The node answers the fence
    at once and the extent goes to that put, so the rest of the payload must not land: it is
    discarded and the write refused, and the block put there reads back intact (it was a
    ChecksumMismatchError: an acknowledged block lost)."""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address, local_shm=False) as store:
            store.put("cut/x0", os.urandom(MiB))  # two-phase; its PutEnd brings one lease
            [held] = store._flows._leases._held.values()
            lease = held.pop()  # written by hand below, not by the client
            (loc,) = lease.locations
            with connect(loc) as sock:
                sock.sendall(pack_request(Op.WRITE, loc.grant, loc.offset, MiB))
                sock.sendall(b"\xee" * (MiB // 2))  # admitted: half of it has landed
                stored = fill_past_free_room(cluster.master_address, 15)  # past x0 and the lease
                sock.sendall(b"\xee" * (MiB // 2))
                status, _, length = RESPONSE.unpack(sock.recv(RESPONSE.size, socket.MSG_WAITALL))
                message = sock.recv(length, socket.MSG_WAITALL).decode()
            assert status == AccessDeniedError.code, message
            assert "while its payload was being received" in message
        with Client(cluster.master_address) as reader:
            assert reader.get_many(list(stored)) == list(stored.values())


def test_a_grpc_write_still_landing_when_its_put_is_revoked_is_cut_off(tmp_path):
    """The same over the gRPC data path, for a two-phase put revoked mid-stream: once the
    node took the fence that ends the put, no further chunk of its stream lands."""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        md = master_metadata(master)
        gate = cluster.nodes[0].server.access.gate
        with grpc.insecure_channel(master) as channel:  # one connection: the put's owner
            stub = pb_grpc.MasterServiceStub(channel)
            start = stub.PutStart(pb.PutStartItem(key="cut/g", size_bytes=MiB), metadata=md)
            (loc,) = start.replicas
            go_on = threading.Event()

            def chunks() -> Iterator[pb.WriteChunk]:
                yield pb.WriteChunk(grant=loc.grant, offset=loc.offset, size_bytes=MiB,
                                    data=b"\xee" * (MiB // 2))  # fmt: skip
                go_on.wait(30)
                yield pb.WriteChunk(data=b"\xee" * (MiB // 2))

            with grpc.insecure_channel(loc.grpc_endpoint) as node, \
                    concurrent.futures.ThreadPoolExecutor(1) as pool:  # fmt: skip
                sent = pool.submit(pb_grpc.DataServiceStub(node).Write, chunks())
                wait_until(lambda: gate.generations() == 1, what="the write admitted")
                assert stub.PutRevoke(pb.KeyRequest(key="cut/g"), metadata=md).code == OK
                stored = fill_past_free_room(master, 16)  # the last takes cut/g's extent
                go_on.set()
                reply = sent.result(timeout=30)
            assert reply.status.code == AccessDeniedError.code, reply.status
        with Client(master) as reader:
            assert reader.get_many(list(stored)) == list(stored.values())


def test_control_requests_of_another_master_run_are_refused(tmp_path):
    """A master that lost its place (a failover left it running) still holds each node's
    control key: its pushes must not replace the fences of the run that mounted the node, or
    the grants of puts that run ended would work again, and its copies and releases must not
    touch room that run allocates."""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        master, node = cluster.master.server, cluster.nodes[0].server
        gate = node.access.gate
        with Master(cluster.master_address) as calls:
            loc = calls.put_start("revoked", len(VALUE))  # granted, never written
            assert calls.run(put_revoke_call(["revoked"])) == [None]
            generation = grant_generation(loc.grant)
            wait_until(lambda: gate.ended(loc.segment_id, generation), what="the write fence")

            def push(run: int) -> pb.Status:
                request = pb.FenceWritesRequest(
                    fences=[pb.WriteFence(segment_id=loc.segment_id, floor=0)], master_run=run
                )  # a floor of 0 would reopen every generation above the mount's
                signed = master.mover._signed(node.node_id, "FenceWrites", request)
                with grpc.insecure_channel(f"127.0.0.1:{node.control_port}") as channel:
                    stub = pb_grpc.NodeServiceStub(channel)
                    return stub.FenceWrites(request, timeout=5, metadata=signed)

            run = master._servicer.master_run
            for other in (run ^ 0x10, 0):  # signed with the node's key: another run, or none
                status = push(other)
                assert status.code == AccessDeniedError.code and "master run" in status.message
                assert gate.ended(loc.segment_id, generation)
            with connect(loc) as sock:
                status_code, message = write(sock, loc, VALUE)
            assert status_code == AccessDeniedError.code and "write grant ended" in message

            # Nor may it copy into DRAM room (a Fetch, a promotion's Move) or make the NVMe
            # tier forget extents: the node acts for the run that mounted it only.
            pool = node.access.dram[loc.segment_id]
            before = bytes(pool[loc.offset : loc.offset + 64])
            fetch = pb.FetchRequest(
                tasks=[pb.FetchTask(key="copied", src_endpoint=loc.endpoint, grant=loc.grant,
                                    src_offset=loc.offset, size_bytes=64, checksum=1,
                                    dst_segment=loc.segment_id, dst_offset=loc.offset)],
                master_run=run ^ 0x10,
            )  # fmt: skip
            move = pb.MoveRequest(
                tasks=[pb.MoveTask(key="moved", src_segment=loc.segment_id, dst_segment=1,
                                   size_bytes=64)],
                master_run=run ^ 0x10,
            )  # fmt: skip
            release = pb.ReleaseRequest(segment_id=1, offsets=[0], master_run=run ^ 0x10)
            with grpc.insecure_channel(f"127.0.0.1:{node.control_port}") as channel:
                stub = pb_grpc.NodeServiceStub(channel)
                replies = [
                    stub.Fetch(fetch, timeout=5, metadata=master.mover._signed(
                        node.node_id, "Fetch", fetch)).statuses[0],
                    stub.Move(move, timeout=5, metadata=master.mover._signed(
                        node.node_id, "Move", move)).statuses[0],
                    stub.Release(release, timeout=5, metadata=master.mover._signed(
                        node.node_id, "Release", release)),
                ]  # fmt: skip
            for reply in replies:
                assert reply.code == AccessDeniedError.code and "master run" in reply.message
            assert bytes(pool[loc.offset : loc.offset + 64]) == before
            assert push(run).code == OK  # the run that mounted the node moves its fences
