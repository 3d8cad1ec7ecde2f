"""Put/get through real daemons: every size, both data paths, every API form, exact bytes."""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest

from mooncake_store import AsyncClient, Client

SIZES = [1, 7, 4095, 4096, 4097, 64 * 1024, 1 << 20, 4 << 20, 16 << 20]


@pytest.fixture(scope="module", params=["shm", "tcp"])
def store(request, cluster):
    with Client(cluster.master_address, local_shm=request.param == "shm") as client:
        client.path = request.param
        yield client


def test_put_get_every_size_exact_bytes(store):
    for size in SIZES:
        key = f"{store.path}/size/{size}"
        value = os.urandom(size)
        result = store.put(key, value)
        assert result.replicas == 1 and not result.deduplicated
        assert store.get(key) == value
        assert store.exists(key)
        assert store.remove(key) is True
        assert not store.exists(key)
        assert store.remove(key) is False
    other = "tcp" if store.path == "shm" else "shm"
    assert store.counters[f"{store.path}_writes"] >= len(SIZES)
    assert store.counters[f"{store.path}_reads"] >= len(SIZES)
    assert store.counters[f"{other}_writes"] == store.counters[f"{other}_reads"] == 0


def test_get_into_accepts_every_buffer_kind(store):
    value = os.urandom(1 << 20)
    key = f"{store.path}/into"
    store.put_from(key, np.frombuffer(value, dtype=np.uint8))
    into_array = np.zeros(1 << 20, dtype=np.uint8)
    assert store.get_into(key, into_array) == len(value)
    assert into_array.tobytes() == value
    into_bytearray = bytearray(len(value) + 100)  # a larger buffer is fine
    assert store.get_into(key, into_bytearray) == len(value)
    assert bytes(into_bytearray[: len(value)]) == value
    into_view = memoryview(bytearray(len(value)))
    store.get_into(key, into_view)
    assert into_view.tobytes() == value
    floats = np.zeros(len(value) // 4, dtype=np.float32)
    store.get_into(key, floats)
    assert floats.tobytes() == value


def test_numpy_kv_block_round_trip(store):
    kv = np.random.default_rng(1).standard_normal((2, 8, 16, 64)).astype(np.float16)
    store.put_from(f"{store.path}/kv", kv)
    out = np.empty_like(kv)
    store.get_into(f"{store.path}/kv", out)
    assert np.array_equal(out, kv)


def test_batch_forms(store):
    items = {f"{store.path}/batch/{i}": os.urandom(1000 + 4096 * i) for i in range(20)}
    results = store.put_many(items)
    assert [r.key for r in results] == list(items)
    keys = list(items)
    assert store.get_many(keys) == list(items.values())
    assert store.exists_many([*keys, "nope"]) == [True] * 20 + [False]
    buffers = [bytearray(len(v)) for v in items.values()]
    assert store.get_many_into(keys, buffers) == [len(v) for v in items.values()]
    assert [bytes(b) for b in buffers] == list(items.values())
    assert store.remove_many([*keys[:10], "nope"]) == [True] * 10 + [False]
    assert store.exists_many(keys) == [False] * 10 + [True] * 10
    again = store.put_many(items)  # existing keys deduplicate, removed ones are rewritten
    assert [r.deduplicated for r in again] == [False] * 10 + [True] * 10


def test_put_of_existing_key_is_a_deduplicated_success(store):
    key = f"{store.path}/dedupe"
    assert not store.put(key, b"first").deduplicated
    assert store.put(key, b"first").deduplicated
    assert store.get(key) == b"first"
    repeated = store.put_many(
        [(f"{key}/r", b"same"), (f"{key}/s", b"other"), (f"{key}/r", b"same")]
    )
    assert [(r.key, r.replicas, r.deduplicated) for r in repeated] == [
        (f"{key}/r", 1, False),
        (f"{key}/s", 1, False),
        (f"{key}/r", 0, True),
    ]
    assert store.get_many([f"{key}/r", f"{key}/r"]) == [b"same", b"same"]


def test_replicas_land_on_distinct_nodes(store, cluster):
    before = {n.node_id: n.objects for n in store.list_nodes()}
    result = store.put(f"{store.path}/three", os.urandom(5000), replicas=3)
    assert result.replicas == 3
    after = {n.node_id: n.objects for n in store.list_nodes()}
    assert {k: after[k] - before[k] for k in after} == {"node-0": 1, "node-1": 1, "node-2": 1}
    assert store.put(f"{store.path}/five", b"x", replicas=5).replicas == 3  # best effort


def test_async_client(cluster):
    async def main() -> None:
        async with AsyncClient(cluster.master_address) as store:
            values = {f"async/{i}": os.urandom(100_000) for i in range(8)}
            await asyncio.gather(*(store.put(k, v) for k, v in values.items()))
            got = await asyncio.gather(*(store.get(k) for k in values))
            assert got == list(values.values())
            assert await store.remove("async/0")

    asyncio.run(main())


def test_concurrent_threads_share_one_client(cluster):
    from concurrent.futures import ThreadPoolExecutor

    with Client(cluster.master_address) as store:

        def work(i: int) -> bool:
            value = os.urandom(300_000 + i)
            store.put(f"threads/{i}", value)
            return store.get(f"threads/{i}") == value

        with ThreadPoolExecutor(4) as pool:
            assert all(pool.map(work, range(32)))


def test_stats_count_objects(store):
    stats = store.stats()
    assert stats.nodes == 3 and stats.capacity_bytes == 3 * 64 * 2**20
    assert stats.objects > 0 and stats.used_bytes >= stats.bytes_stored > 0
    assert stats.counters["puts_committed"] >= stats.objects


def test_sync_tcp_path_uses_a_blocking_socket_and_reconnects(cluster):
    import socket
    import time

    value = os.urandom(3 << 20)
    with Client(cluster.master_address, local_shm=False) as store:
        store.put("tcp/blocking", value)
        assert store.get("tcp/blocking") == value
        socks = store._local.nodes._socks  # this thread's node sockets: the blocking path ran
        assert len(socks) == 1
        for sock in socks.values():
            sock.shutdown(socket.SHUT_WR)  # the node sees the end of the stream and hangs up
        time.sleep(0.2)
        assert store.get("tcp/blocking") == value  # a fresh connection, not an error
        assert store.counters["tcp_reads"] == 2 and store.counters["tcp_writes"] == 1
