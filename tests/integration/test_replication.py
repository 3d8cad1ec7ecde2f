"""Replicas under failure: kill -9 under load, repair, SIGSTOP, hot blocks, master restarts."""

from __future__ import annotations

import hashlib
import signal
import threading

import pytest

from mooncake_store import Client, Retry
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER, wait_until


def content(key: str, size: int = 64 * 1024) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def replica_count(store: Client, key: str) -> int:
    """Replicas of `key` (this asks for a replica list: it counts as a read)."""
    return len(store._run(store._async.flows.master_client().get_replica_list([key]))[0].replicas)


def stored_replicas(store: Client) -> int:
    """Replicas of all objects together, without reading any of them."""
    return sum(n.objects for n in store.list_nodes())


@pytest.fixture
def three(tmp_path):
    with LocalCluster(tmp_path, nodes=3, dram="64MiB",
                      master_args=[*FAST_MASTER, "--hot-reads", "0"]) as cluster:  # fmt: skip
        yield cluster


def test_kill_9_under_load_loses_no_acknowledged_block(three):
    acked: list[str] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer() -> None:
        with Client(three.master_address, replicas=2, retry=Retry(attempts=5)) as store:
            i = 0
            while not stop.is_set() and i < 400:
                key = f"load/{i}"
                try:
                    if store.put(key, content(key)).replicas >= 1:
                        acked.append(key)
                except Exception as exc:
                    errors.append(exc)
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    wait_until(lambda: len(acked) >= 50, what="load to start")
    three.nodes[1].signal(signal.SIGKILL)
    wait_until(lambda: len(acked) >= 150 or not thread.is_alive(), what="more load")
    stop.set()
    thread.join(60)
    with Client(three.master_address) as store:
        three.wait_for_nodes(2)
        for key in acked:  # every acknowledged block reads back, byte for byte
            assert store.get(key) == content(key), key
        # Re-replication brings every block back to two replicas on the two live nodes.
        wait_until(lambda: store.stats().counters["under_replicated"] == 0, timeout_s=30,
                   what="re-replication")  # fmt: skip
        assert all(replica_count(store, k) == 2 for k in acked[::7])
        assert store.stats().counters["repairs"] > 0


def test_sigstopped_node_is_declared_dead_and_reads_fall_over(three):
    with Client(three.master_address, replicas=2, local_shm=False) as store:
        keys = [f"stop/{i}" for i in range(30)]
        for key in keys:
            store.put(key, content(key))
        three.nodes[0].signal(signal.SIGSTOP)
        try:
            # Before the master notices, reads skip the silent node after a data-path timeout
            # or go to the other replica first; afterwards it is no longer listed.
            three.wait_for_nodes(2)
            for key in keys:
                assert store.get(key) == content(key)
        finally:
            three.nodes[0].signal(signal.SIGCONT)
        three.wait_for_nodes(3)  # it comes back and mounts again
        wait_until(lambda: store.stats().counters["under_replicated"] == 0, timeout_s=30,
                   what="re-replication")  # fmt: skip


def test_hot_blocks_gain_a_replica_and_lose_it_when_cold(tmp_path):
    master = [*FAST_MASTER, "--hot-reads", "5", "--hot-window", "1s", "--max-replicas", "2"]
    with InProcessCluster(tmp_path, nodes=2, dram="32MiB", master_args=master) as cluster:
        with Client(cluster.master_address) as store:
            store.put("hot", content("hot"))
            store.put("cold", content("cold"))
            assert stored_replicas(store) == 2
            for _ in range(6):
                assert store.get("hot") == content("hot")
            wait_until(lambda: stored_replicas(store) == 3, what="a hot replica")
            counters = store.stats().counters
            assert counters["hot_replicas_added"] == 1 and counters["hot_objects"] == 1
            assert store.get("hot") == content("hot")
            assert replica_count(store, "cold") == 1
            # No more reads for a window: it cools down and loses the extra replica.
            wait_until(lambda: stored_replicas(store) == 2, what="the hot replica to go")
            assert store.stats().counters["hot_replicas_dropped"] == 1
            assert replica_count(store, "hot") == 1
            assert store.get("hot") == content("hot")


def test_clients_ride_out_a_master_kill_9(three):
    with Client(three.master_address, replicas=2) as store:
        keys = [f"m/{i}" for i in range(20)]
        store.put_many({k: content(k) for k in keys})
    three.master.signal(signal.SIGKILL)
    three.master.proc.wait()
    restarter = threading.Timer(1.0, three.start_master)
    restarter.start()
    client = Client(
        three.master_address,
        retry=Retry(attempts=60, backoff_s=0.05, max_backoff_s=0.25),
        timeout_s=2,
    )
    try:
        # Issued while the master is down (an idempotent call): retried with backoff until the
        # master is back, then answered; nothing is lost across the restart.
        assert not restarter.finished.is_set()
        answer = client.exists_many(keys)
        assert restarter.finished.is_set()
        assert len(answer) == len(keys) and all(isinstance(a, bool) for a in answer)
        restarter.join()
        three.wait_for_nodes(3)
        wait_until(lambda: client.exists_many(keys) == [True] * len(keys), what="keys back")
        assert client.get_many(keys) == [content(k) for k in keys]
        client.put("after-restart", b"ok")
        assert client.get("after-restart") == b"ok"
    finally:
        client.close()
