"""Object lifecycle with a real master and real nodes (issue 11): a repeated PutEnd is a
success, a poisoned key heals, a write grant ends with its put."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
import xxhash

from mooncake_store import Client
from mooncake_store.client.master_client import MasterClient, put_end_call, put_start_call
from mooncake_store.client.types import PutSpec, ReplicaLocation, Retry
from mooncake_store.cluster import LocalCluster
from mooncake_store.common.errors import OK
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle")
    with LocalCluster(root, nodes=2, dram="32MiB", master_args=FAST_MASTER) as c:
        yield c


def master_calls(master: str, *calls):
    """Run master calls in order on one MasterClient; return their parsed replies."""

    async def run():
        client = MasterClient(master, timeout_s=5, retry=Retry())
        try:
            return [await client.run(call) for call in calls]
        finally:
            await client.close()

    return asyncio.run(run())


def send(loc: ReplicaLocation, op: Op, offset: int, payload: bytes) -> int:
    """One data-path request with the location's grant; returns the node's status."""
    host, _, port = loc.endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(pack_request(op, loc.grant, offset, len(payload)) + payload)
        header = bytearray(RESPONSE.size)
        view, got = memoryview(header), 0
        while got < len(header):
            n = sock.recv_into(view[got:])
            assert n, "node closed the connection"
            got += n
        status, _, _ = RESPONSE.unpack(header)
        return status


def start_and_write(master: str, key: str, value: bytes) -> ReplicaLocation:
    [[plan]] = master_calls(master, put_start_call([PutSpec(key, len(value), 1)]))
    loc = plan.replicas[0]
    assert send(loc, Op.WRITE, loc.offset, value) == OK
    return loc


def test_a_repeated_put_end_of_a_committed_put_is_a_success(cluster2):
    """A BatchPutEnd the master committed but whose reply was lost, sent again, succeeds."""
    value = os.urandom(50_000)
    start_and_write(cluster2.master_address, "repeat", value)
    end = put_end_call([("repeat", xxhash.xxh3_64_intdigest(value), [])])
    first, again = master_calls(cluster2.master_address, end, end)
    assert first == [1] and again == [1]  # both report one replica, no ObjectNotFoundError
    with Client(cluster2.master_address) as store:
        assert store.get("repeat") == value
        assert store.stats().counters["put_ends_repeated"] == 1
