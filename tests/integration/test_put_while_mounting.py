"""A put that starts while a node has just mounted (before it took this master run's first write
fence, normally a few milliseconds) waits for that fence when the node would give it a replica
it could not get otherwise: else it is acknowledged short for good (the chaos harness lost a
block that way once a second fault took the one node it was on)."""

from __future__ import annotations

import os

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.master import server as master_server
from tests.conftest import FAST_MASTER, wait_until


def test_a_put_waits_for_the_first_fence_of_a_node_that_gives_it_a_replica(tmp_path, monkeypatch):
    # Widen the moment between a mount and its first fence from 20 ms to half a second, so that
    # the puts below surely start inside it (the rule is the same at any width).
    monkeypatch.setattr(master_server, "FIRST_FENCE_DELAY_S", 0.5)
    value = os.urandom(200_000)
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address, replicas=2) as store:
            assert store.put("alone", value).replicas == 1  # one node in all: no wait, best effort
            cluster.add_node()  # mounted; its first fence comes in 0.5 s
            assert store.put("both", value).replicas == 2
            cluster.add_node()  # a batch that wants three: the same wait
            results = store.put_many({f"k{i}": value for i in range(4)}, replicas=3)
            assert [r.replicas for r in results] == [3, 3, 3, 3]
            assert store.get("both") == value and store.get("k3") == value


def test_a_node_that_takes_no_first_fence_holds_puts_up_once_not_for_ever(tmp_path, monkeypatch):
    """A node that mounted and then takes no fence (stalled; its control port cut off) costs
    the puts during its first push (FIRST_FENCE_TIMEOUT_S at most, 0.3 s here) and no more:
    later puts go on short without waiting for it, and once it takes a fence they get it."""
    import asyncio

    from mooncake_store.node.control import NodeControl

    monkeypatch.setattr(master_server, "FIRST_FENCE_TIMEOUT_S", 0.3)
    value = os.urandom(100_000)
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        table = cluster.master.server.table  # type: ignore[union-attr]
        taking = NodeControl.FenceWrites

        async def stalled(self, request, context):  # type: ignore[no-untyped-def]
            await asyncio.sleep(2.0)  # past the push's deadline: the master counts it untaken
            return await taking(self, request, context)

        with Client(cluster.master_address, replicas=2) as store:
            monkeypatch.setattr(NodeControl, "FenceWrites", stalled)
            cluster.add_node()
            assert store.put("first", value).replicas == 1  # waited for the push, in vain
            assert table.counters["puts_waited_for_mounting"] == 1
            assert [store.put(f"k{i}", value).replicas for i in range(5)] == [1] * 5
            assert table.counters["puts_waited_for_mounting"] == 1  # not waited for again
            assert table.awaiting_first_fence()
            monkeypatch.setattr(NodeControl, "FenceWrites", taking)  # it answers again
            wait_until(lambda: not table.awaiting_first_fence(), what="its first fence taken")
            assert store.put("after", value).replicas == 2
            assert store.get("first") == value and store.get("k4") == value
