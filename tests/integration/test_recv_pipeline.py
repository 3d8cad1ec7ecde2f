"""The pipelined TCP read into device memory (client/recv_pipeline.py), on CPUs: a host array
stands in for the device (`DeviceTarget` with a `HostCopier`, whose copies run late, only when
waited on), so the rotation of the staging buffers, the ordering of copies, short reads, a
failing checksum and a connection cut mid-value are tested against a real node over TCP."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import threading

import numpy as np
import pytest

from mooncake_store import AsyncClient, ChecksumMismatchError, Client, DataPathError
from mooncake_store.client.device import DeviceParts, DeviceTarget
from mooncake_store.client.recv_pipeline import HostCopier, PipelinedReceive
from mooncake_store.client.shm import ShmMapper
from mooncake_store.client.tcp_blocking import BlockingNodeConnections
from mooncake_store.common.checksum import CHUNK_BYTES, checksum
from mooncake_store.common.wire import Op
from tests.conftest import replica_list

MIB = CHUNK_BYTES
SIZES = [1, 4096, MIB - 1, MIB, MIB + 1, 3 * MIB + 5, 9 * MIB + 4097]


def _value(n: int) -> np.ndarray:
    return np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8)


def _host_target(n: int) -> tuple[DeviceTarget, np.ndarray, list[HostCopier]]:
    """A "device" buffer in host memory; the copiers it hands out are kept for inspection."""
    device = np.zeros(n, dtype=np.uint8)
    made: list[HostCopier] = []

    def copier() -> HostCopier:
        made.append(HostCopier(device))
        return made[-1]

    return DeviceTarget(n, copier), device, made


def _feed(pipe: PipelinedReceive, value: np.ndarray, rng: np.random.Generator) -> None:
    """What a transport does: receive into each destination in order, in short reads."""
    pos = 0
    for dest in pipe.dests:
        filled = 0
        while filled < len(dest):
            n = min(len(dest) - filled, int(rng.integers(1, 200_000)))
            dest[filled : filled + n] = value[pos : pos + n].tobytes()
            pipe.update(dest[filled : filled + n])
            filled += n
            pos += n


@pytest.mark.parametrize("n", [1, MIB - 7, MIB, 2 * MIB + 3, 5 * MIB + 12345])
def test_pieces_rotate_through_two_buffers_and_arrive_in_order(n):
    value = _value(n)
    target, device, copiers = _host_target(n)
    staging = np.zeros(n, dtype=np.uint8)
    parts = DeviceParts(memoryview(staging), target)
    pipe = parts.pipeline()
    assert len({id(d.obj) for d in pipe.dests}) == 1  # all in the one staging buffer ...
    assert len(pipe.dests) == -(-n // MIB)
    _feed(pipe, value, np.random.default_rng(n))
    assert pipe.complete
    pipe.finish()
    # The copier ran each copy only when waited on: had the pipeline refilled a buffer before
    # its copy ran, the device would hold the later piece's bytes.
    assert np.array_equal(device, value)
    assert pipe.intdigest() == checksum(value)
    assert copiers[0].copies == len(pipe.dests)
    assert copiers[0].waits == max(0, len(pipe.dests) - 2)
    if n > 2 * MIB:  # ... of which only the first two pieces are used
        assert staging[2 * MIB :].max() == 0


def test_a_lagging_copier_without_the_wait_would_corrupt():
    """The rotation is what the wait protects: feeding a third piece into buffer 0 before the
    first copy ran overwrites its source (checked here with the copier's queue held)."""
    n = 3 * MIB
    value = _value(n)
    device = np.zeros(n, dtype=np.uint8)
    copier = HostCopier(device)
    staging = [memoryview(np.zeros(MIB, dtype=np.uint8)) for _ in range(2)]
    pipe = PipelinedReceive(n, staging, copier)
    copier.wait = lambda token: None  # type: ignore[method-assign]  # a pipeline that skips it
    _feed(pipe, value, np.random.default_rng(0))
    pipe.finish()
    assert not np.array_equal(device[:MIB], value[:MIB])


def test_reset_drops_what_was_received():
    n = 2 * MIB + 10
    value = _value(n)
    target, device, _ = _host_target(n)
    parts = DeviceParts(memoryview(np.zeros(n, dtype=np.uint8)), target)
    pipe = parts.pipeline()
    pipe.dests[0][:100] = value[:100].tobytes()
    pipe.update(pipe.dests[0][:100])
    pipe.reset()
    _feed(pipe, value, np.random.default_rng(1))
    pipe.finish()
    assert pipe.complete and pipe.intdigest() == checksum(value)
    assert np.array_equal(device, value)


@pytest.mark.parametrize("n", SIZES)
def test_tcp_get_into_a_device_target_is_pipelined(cluster, n):
    value = _value(n)
    with Client(cluster.master_address) as writer:
        writer.put(f"pipe/{n}", value)
    with Client(cluster.master_address, local_shm=False) as store:
        target, device, _ = _host_target(n)
        assert store.get_into(f"pipe/{n}", target) == n
        assert np.array_equal(device, value)
        assert store.counters["pipelined_reads"] == 1
        assert target.delivered
        # get_many_into: several device targets and a host buffer in one batch
        t1, d1, _ = _host_target(n)
        host = np.zeros(n, dtype=np.uint8)
        assert store.get_many_into([f"pipe/{n}", f"pipe/{n}"], [t1, host]) == [n, n]
        assert np.array_equal(d1, value) and np.array_equal(host, value)


def test_async_client_pipelines_too(cluster):
    n = 3 * MIB + 5
    value = _value(n)

    async def run() -> np.ndarray:
        async with AsyncClient(cluster.master_address, local_shm=False) as store:
            await store.put("pipe/async", value)
            target, device, _ = _host_target(n)
            assert await store.get_into("pipe/async", target) == n
            assert store.counters["pipelined_reads"] == 1
            return device

    assert np.array_equal(asyncio.run(run()), value)


def test_same_host_reads_of_a_device_target_upload_from_staging(cluster):
    n = 2 * MIB + 1
    value = _value(n)
    with Client(cluster.master_address) as store:
        store.put("pipe/local", value)
        store.get("pipe/local")  # maps the pool
        target, device, copiers = _host_target(n)
        assert store.get_into("pipe/local", target) == n
        assert np.array_equal(device, value)
        assert store.counters.get("pipelined_reads", 0) == 0
        assert copiers[-1].copies == 1  # one upload of the verified staging


def test_a_corrupt_replica_fails_its_checksum_over_the_pipeline(cluster):
    n = 3 * MIB + 7
    value = _value(n)
    with Client(cluster.master_address) as writer:
        writer.put("pipe/corrupt", value, replicas=1)
    loc = replica_list(cluster.master_address, "pipe/corrupt").replicas[0]
    mapper = ShmMapper()
    pool = mapper.map(loc)
    assert pool is not None
    pool[loc.offset + 2 * MIB + 17] ^= 0x01
    mapper.close()
    with Client(cluster.master_address, local_shm=False) as store:
        target, _, copiers = _host_target(n)
        with pytest.raises(ChecksumMismatchError):
            store.get_into("pipe/corrupt", target)
        assert not target.delivered
        assert all(not c._queued for c in copiers)  # every copy drained before the error


class _CuttingProxy:
    """Forwards one connection to a node, passing on only the first `limit` bytes of the
    node's reply (in small sends: short reads on the client side), then closes it."""

    def __init__(self, node: str, limit: int) -> None:
        self.node = node
        self.limit = limit
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        client, _ = self.listener.accept()
        host, port = self.node.rsplit(":", 1)
        upstream = socket.create_connection((host, int(port)))
        client.settimeout(10)
        upstream.settimeout(10)
        try:
            request = client.recv(65536)
            upstream.sendall(request)
            sent = 0
            while sent < self.limit:
                data = upstream.recv(min(4093, self.limit - sent))
                if not data:
                    break
                client.sendall(data)
                sent += len(data)
        finally:
            client.close()
            upstream.close()
            self.listener.close()


def test_a_connection_cut_mid_value_fails_and_the_next_attempt_succeeds(cluster):
    n = 4 * MIB + 3
    value = _value(n)
    with Client(cluster.master_address) as writer:
        writer.put("pipe/cut", value, replicas=1)
    loc = replica_list(cluster.master_address, "pipe/cut").replicas[0]
    proxy = _CuttingProxy(loc.endpoint, limit=2 * MIB + 12345)  # header + ~2 MiB of payload
    target, device, copiers = _host_target(n)
    parts = DeviceParts(memoryview(np.zeros(n, dtype=np.uint8)), target)
    conns = BlockingNodeConnections(timeout_s=10)
    try:
        pipe = parts.pipeline()
        with pytest.raises(DataPathError):
            conns.exchange(dataclasses.replace(loc, endpoint=proxy.endpoint), Op.READ,
                           pipe.dests, hasher=pipe)  # fmt: skip
        pipe.finish()
        assert not pipe.complete
        assert copiers[-1].copies == 2  # the two pieces that landed in full went up
        proxy.thread.join(10)

        again = parts.pipeline()  # the next attempt reuses the staging
        conns.exchange(loc, Op.READ, again.dests, hasher=again)
        again.finish()
        assert again.complete and again.intdigest() == checksum(value)
        assert np.array_equal(device, value)
    finally:
        conns.close()
