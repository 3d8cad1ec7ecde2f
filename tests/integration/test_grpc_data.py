"""The node's gRPC DataService: put and get with gRPC alone, under the master's grants.

These tests use only the generated stubs, as a client in another language would; the Node.js
conformance test (test_node_client.py) does the same from JavaScript.
"""

from __future__ import annotations

import os

import grpc
import pytest

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.ops import master_metadata
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.checksum import checksum
from mooncake_store.common.errors import OK, AccessDeniedError, ChecksumMismatchError
from tests.conftest import FAST_MASTER


@pytest.fixture(scope="module")
def grpc_cluster(tmp_path_factory):
    with InProcessCluster(tmp_path_factory.mktemp("grpcdata"), nodes=2, dram="32MiB",
                      master_args=FAST_MASTER) as cluster:  # fmt: skip
        yield cluster


def ok(status: pb.Status) -> bool:
    return status.code == OK


def grpc_put(master: str, key: str, value: bytes, replicas: int = 1, chunk: int = 1 << 20) -> None:
    with grpc.insecure_channel(master) as channel:
        stub = pb_grpc.MasterServiceStub(channel)
        md = master_metadata(master)
        start = stub.PutStart(pb.PutStartItem(key=key, size_bytes=len(value), replicas=replicas),
                              metadata=md)  # fmt: skip
        assert ok(start.status), start.status
        sums = set()
        for loc in start.replicas:
            assert loc.grpc_endpoint
            with grpc.insecure_channel(loc.grpc_endpoint) as node:
                chunks = [pb.WriteChunk(grant=loc.grant, offset=loc.offset,
                                        size_bytes=len(value), data=value[:chunk])]  # fmt: skip
                chunks += [pb.WriteChunk(data=value[i : i + chunk])
                           for i in range(chunk, len(value), chunk)]  # fmt: skip
                result = pb_grpc.DataServiceStub(node).Write(iter(chunks))
            assert ok(result.status), result.status
            assert result.checksum_str == str(result.checksum)
            sums.add(result.checksum)
        assert sums == {checksum(value)}  # the node's checksum of what arrived is the value's
        end = stub.PutEnd(pb.PutEndItem(key=key, checksum=sums.pop()), metadata=md)
        assert ok(end.status), end.status


def grpc_get(master: str, key: str, *, verify: bool = True) -> bytes:
    with grpc.insecure_channel(master) as channel:
        reply = pb_grpc.MasterServiceStub(channel).GetReplicaList(
            pb.KeyRequest(key=key), metadata=master_metadata(master)
        )
    assert ok(reply.status), reply.status
    loc = reply.replicas[0]
    with grpc.insecure_channel(loc.grpc_endpoint) as node:
        request = pb.ReadRequest(grant=loc.grant, offset=loc.offset, size_bytes=reply.size_bytes,
                                 checksum_str=str(reply.checksum) if verify else "")  # fmt: skip
        chunks = list(pb_grpc.DataServiceStub(node).Read(request))
    assert ok(chunks[-1].status), chunks[-1].status
    return b"".join(c.data for c in chunks)


@pytest.mark.parametrize("size", [1, 4096, 3 * (1 << 20) + 17])
def test_grpc_put_is_read_by_the_sdk_and_sdk_put_by_grpc(grpc_cluster, size):
    value = os.urandom(size)
    grpc_put(grpc_cluster.master_address, f"g/grpc-{size}", value, replicas=2)
    with Client(grpc_cluster.master_address) as store:
        assert store.get(f"g/grpc-{size}") == value
        store.put(f"g/sdk-{size}", value[::-1])
    assert grpc_get(grpc_cluster.master_address, f"g/sdk-{size}") == value[::-1]
    assert grpc_get(grpc_cluster.master_address, f"g/grpc-{size}") == value


def test_refusals_are_statuses_not_resets(grpc_cluster):
    value = b"z" * 8192
    with Client(grpc_cluster.master_address) as store:
        store.put("g/refuse", value)
    with grpc.insecure_channel(grpc_cluster.master_address) as channel:
        reply = pb_grpc.MasterServiceStub(channel).GetReplicaList(
            pb.KeyRequest(key="g/refuse"), metadata=master_metadata(grpc_cluster.master_address)
        )
    loc = reply.replicas[0]
    with grpc.insecure_channel(loc.grpc_endpoint) as node:
        data = pb_grpc.DataServiceStub(node)
        forged = bytes(loc.grant[:-1]) + bytes([loc.grant[-1] ^ 1])
        chunks = list(data.Read(pb.ReadRequest(grant=forged, offset=loc.offset, size_bytes=8192)))
        assert len(chunks) == 1 and chunks[0].status.code == AccessDeniedError.code
        assert "signature" in chunks[0].status.message
        # A read grant does not allow writing, and nothing is changed by the refused write.
        result = data.Write(iter([pb.WriteChunk(grant=loc.grant, offset=loc.offset,
                                                size_bytes=8192, data=b"x" * 8192)]))  # fmt: skip
        assert result.status.code == AccessDeniedError.code
        # A wrong checksum is refused before a byte is sent.
        chunks = list(data.Read(pb.ReadRequest(grant=loc.grant, offset=loc.offset,
                                               size_bytes=8192, checksum_str="12345")))  # fmt: skip
        assert [c.data for c in chunks] == [b""]
        assert chunks[0].status.code == ChecksumMismatchError.code
    assert grpc_get(grpc_cluster.master_address, "g/refuse") == value


def test_short_write_stream_is_refused_and_leaves_nothing(grpc_cluster):
    with grpc.insecure_channel(grpc_cluster.master_address) as channel:
        stub = pb_grpc.MasterServiceStub(channel)
        md = master_metadata(grpc_cluster.master_address)
        start = stub.PutStart(pb.PutStartItem(key="g/short", size_bytes=10000), metadata=md)
        loc = start.replicas[0]
        with grpc.insecure_channel(loc.grpc_endpoint) as node:
            first = pb.WriteChunk(grant=loc.grant, offset=loc.offset, size_bytes=10000,
                                  data=b"a" * 5000)  # fmt: skip
            result = pb_grpc.DataServiceStub(node).Write(iter([first]))
        assert result.status.code != OK and "5000 of 10000" in result.status.message
        stub.PutRevoke(pb.KeyRequest(key="g/short"), metadata=md)
    with Client(grpc_cluster.master_address) as store:
        assert not store.exists("g/short")


def test_a_grpc_write_grant_writes_its_bytes_once(grpc_cluster):
    """The gRPC Write seals what it delivered against its grant, as the TCP path does: a stream
    cut short seals nothing, a complete one cannot be sent again (node/write_gate.py)."""
    value = os.urandom(10000)
    master = grpc_cluster.master_address
    with grpc.insecure_channel(master) as channel:
        stub = pb_grpc.MasterServiceStub(channel)
        md = master_metadata(master)
        start = stub.PutStart(pb.PutStartItem(key="g/once", size_bytes=len(value)), metadata=md)
        loc = start.replicas[0]
        with grpc.insecure_channel(loc.grpc_endpoint) as node:
            data = pb_grpc.DataServiceStub(node)

            def write(payload: bytes) -> pb.WriteResult:
                chunk = pb.WriteChunk(
                    grant=loc.grant, offset=loc.offset, size_bytes=len(value), data=payload
                )
                return data.Write(iter([chunk]))

            assert write(value[:5000]).status.code != OK  # cut short: nothing sealed
            assert ok(write(value).status)
            again = write(b"x" * len(value))
            assert again.status.code == AccessDeniedError.code
            assert "already used for these bytes" in again.status.message
        end = stub.PutEnd(pb.PutEndItem(key="g/once", checksum=checksum(value)), metadata=md)
        assert ok(end.status), end.status
    assert grpc_get(master, "g/once") == value
