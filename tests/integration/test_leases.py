"""Puts through allocation leases against a real master and node: one master call per steady
put (single key and batch, same host and TCP), the right bytes, and a lease that died with its
master costs a retry, never the put."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from mooncake_store import AsyncClient, Client
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("leases")
    with InProcessCluster(root, nodes=1, dram="64MiB", master_args=FAST_MASTER) as c:
        yield c


@pytest.mark.parametrize("local_shm", [True, False])
def test_steady_puts_are_one_master_call(cluster, local_shm):
    with Client(cluster.master_address, leases=True, local_shm=local_shm) as store:
        values = {f"lease/{local_shm}/{i}": os.urandom(MiB - i) for i in range(6)}
        sizes = {len(v) for v in values.values()}
        first = {f"lease/{local_shm}/warm{n}": os.urandom(n) for n in sizes}
        for key, value in first.items():  # two-phase; its PutEnd brings the next lease
            store.put(key, value)
        calls = store.counters["framed_calls"]
        for key, value in values.items():
            assert not store.put(key, value).deduplicated
        assert store.counters["framed_calls"] == calls + len(values)
        assert store.counters["leased_puts"] == len(values)

        batch = [{f"batch/{local_shm}/{b}/{i}": os.urandom(65536) for i in range(8)}
                 for b in range(3)]  # fmt: skip
        store.put_many(batch[0])  # two-phase, then leased
        calls = store.counters["framed_calls"]
        store.put_many(batch[1])
        store.put_many(batch[2])
        assert store.counters["framed_calls"] == calls + 2
        everything = {**values, **batch[0], **batch[1], **batch[2]}
        assert store.get_many(list(everything)) == list(everything.values())
        assert store.put(next(iter(values)), values[next(iter(values))]).deduplicated


def test_async_client_leases_too(cluster):
    async def run() -> None:
        async with AsyncClient(cluster.master_address, leases=True) as store:
            for i in range(4):
                await store.put(f"async-lease/{i}", bytes([i]) * 70_000)
            assert store.counters["leased_puts"] == 3
            got = await store.get_many([f"async-lease/{i}" for i in range(4)])
            assert got == [bytes([i]) * 70_000 for i in range(4)]

    asyncio.run(run())


def test_a_lease_from_a_restarted_master_costs_a_retry_not_the_put(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address, leases=True) as store:
            store.put("before", os.urandom(MiB))  # leaves a lease for the next MiB
            cluster.master.signal(signal.SIGKILL)
            cluster.master.proc.wait()
            cluster.start_master()
            cluster.wait_for_nodes(1)
            value = os.urandom(MiB)
            assert not store.put("after", value).deduplicated  # the lease is gone: two-phase
            assert store.get("after") == value
            assert store.counters["leased_puts"] == 0
            again = os.urandom(MiB)
            store.put("after-2", again)  # the retry's PutEnd brought a fresh lease
            assert store.counters["leased_puts"] == 1 and store.get("after-2") == again
