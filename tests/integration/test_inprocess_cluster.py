"""The in-process cluster (mooncake_store/cluster_inprocess.py): real master and nodes on threads
of the test process, with the same flags as the daemons, the real shared-memory hand-off, and a
stop that leaves no thread, socket or pool behind."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import click
import pytest

from mooncake_store import AsyncClient, Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.master.grpc_owners import read_established
from tests.conftest import FAST_MASTER, wait_until


def daemon_threads() -> list[str]:
    return [t.name for t in threading.enumerate()
            if t.name == "mooncake-master" or t.name.startswith("mooncake-node-")]  # fmt: skip


def refuses(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return True
    return False


def test_puts_and_gets_take_the_real_shared_memory_and_tcp_paths(tmp_path):
    value = os.urandom(300_000)
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        assert cluster.master.server.config.heartbeat_interval_s == pytest.approx(0.2)
        # Each node's link is a connection of its own, as from separate processes.
        wait_until(lambda: len(read_established(cluster.master_port) or ()) == 2,
                   what="one connection per node link")  # fmt: skip
        with Client(cluster.master_address, replicas=2) as store:
            store.put("shared", value)
            assert store.get("shared") == value
            # The nodes are this process: the pool still came over the unix socket's hand-off.
            assert store.counters["shm_writes"] == 2 and store.counters["shm_reads"] == 1
            assert len(store._async.flows.shm.mapped_segments()) == 2
        with Client(cluster.master_address, local_shm=False) as store:
            assert store.get("shared") == value
            assert store.counters["tcp_reads"] == 1 and store.counters["shm_reads"] == 0

        async def through_async() -> bytes:
            async with AsyncClient(cluster.master_address, local_shm=False) as store:
                await store.put("async", value[:1000])
                return await store.get("async")

        assert asyncio.run(through_async()) == value[:1000]
        with Client(cluster.master_address) as store:
            listed = {n.endpoint for n in store.list_nodes()}
        assert {cluster.node_endpoint(i) for i in range(2)} == listed
        ports = [cluster.master_port, *(n.server.port for n in cluster.nodes)]
    assert daemon_threads() == []
    assert all(refuses(port) for port in ports)


def test_a_stopped_node_drains_and_a_restarted_one_mounts_under_its_id(tmp_path):
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=FAST_MASTER) as cluster:
        values = {f"drain/{i}": os.urandom(50_000) for i in range(20)}
        with Client(cluster.master_address, replicas=1) as store:
            store.put_many(values)
            cluster.nodes[0].stop()  # as on SIGTERM: its single copies go to node-1 first
            assert not cluster.nodes[0].alive()
            wait_until(lambda: [n.node_id for n in store.list_nodes()] == ["node-1"],
                       what="node-0 unmounted")  # fmt: skip
            assert store.get_many(list(values)) == list(values.values())
            cluster.restart_node(0)
            cluster.wait_for_nodes(2)
            assert sorted(n.node_id for n in store.list_nodes()) == ["node-0", "node-1"]
        with pytest.raises(RuntimeError, match="still running"):
            cluster.restart_node(1)
    assert daemon_threads() == []


def test_a_halted_node_is_dropped_by_missed_heartbeats(tmp_path):
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as store:
            cluster.nodes[1].halt()  # no drain, no unmount: the master must notice by itself
            wait_until(lambda: [n.node_id for n in store.list_nodes()] == ["node-0"],
                       what="node-1 dropped")  # fmt: skip
            store.put("after", b"still served")
            assert store.get("after") == b"still served"


def test_the_master_restarts_on_its_port_and_data(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as store:
            store.put("kept", b"committed before the restart")
        port = cluster.master_port
        assert cluster.master is not None
        cluster.master.stop()
        cluster.start_master()
        assert cluster.master_port == port
        cluster.wait_for_nodes(1)
        with Client(cluster.master_address) as store:
            assert store.get("kept") == b"committed before the restart"


def test_bad_flags_fail_as_the_daemon_would_and_leave_nothing_running(tmp_path):
    with pytest.raises(click.UsageError, match="no-such-flag"):
        with InProcessCluster(tmp_path, nodes=1, master_args=["--no-such-flag"]):
            pass
    with pytest.raises(InvalidArgumentError, match="bad value for --dram"):
        with InProcessCluster(tmp_path / "b", nodes=1, dram="lots"):  # the master started
            pass
    assert daemon_threads() == []
