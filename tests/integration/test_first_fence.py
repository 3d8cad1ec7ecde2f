"""A node takes no put before it took a write fence of this master run (master/membership.py
`awaiting_first_fence`): that proves the node took the run's mount reply.  Its first fence goes
out on its own a moment after the mount (master/server.py `_first_fences`), so a node mounted
while another one stalls is offered to puts at once, and puts that arrive meanwhile wait for
that push (milliseconds) instead of evicting elsewhere or waiting for the stalled node.

Found by review of e189327: a node mounted while another node's event loop stalled stayed
"mounting" behind the fence push that node held for 5 s; a put then evicted an acknowledged
block on a full node though the new one was empty, and one preferring the new node waited
for the stalled push.  The stall is real: the other node's event loop is blocked."""

from __future__ import annotations

import os
import threading
import time

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER, wait_until

MiB = 1 << 20
BLOCK = os.urandom(MiB)
STALL_S = 4.0  # the fence push's deadline is 5 s: it stays in flight throughout


def _stall(cluster: InProcessCluster, index: int) -> threading.Thread:
    """Block node `index`'s event loop (its control service: FenceWrites) for STALL_S."""

    async def busy() -> None:
        time.sleep(STALL_S)  # a loop stalled by blocking work, as a busy node's would be

    thread = threading.Thread(target=cluster.nodes[index].call, args=(busy(),), daemon=True)
    thread.start()
    return thread


def _wait_for_a_push_in_flight(cluster: InProcessCluster) -> None:
    """Until the tick sends the fences (one push at a time: master/server.py `_fencing`)."""
    master = cluster.master.server  # type: ignore[union-attr]
    wait_until(lambda: master._fencing is not None, what="the tick's fence push")


def _nodes_of(cluster: InProcessCluster, key: str) -> set[str]:
    table = cluster.master.server.table  # type: ignore[union-attr]
    return {table.mounted_segment(r.segment_id).node_id for r in table.get(key).replicas}


def test_a_node_mounted_while_another_stalls_takes_puts_at_once(tmp_path):
    args = [*FAST_MASTER, "--heartbeat-ttl", "20s"]
    with InProcessCluster(tmp_path, nodes=2, dram="8MiB", master_args=args) as cluster:
        table = cluster.master.server.table  # type: ignore[union-attr]
        with Client(cluster.master_address) as store:
            for i in range(16):  # both nodes full of acknowledged blocks
                store.put(f"full/{i}", BLOCK)
            stalled = _stall(cluster, 1)
            store.put("ends-a-put", b"x" * 4096)  # a put ends: a push goes out, held by node-1
            _wait_for_a_push_in_flight(cluster)
            evicted = table.counters["evictions"]
            fresh = cluster.add_node().server.node_id  # 8 MiB free, its mount reply in
            store.put("new", BLOCK)  # waits for the new node's first fence, pushed on its own
            assert stalled.is_alive()  # the push node-1 holds is still in flight
            assert _nodes_of(cluster, "new") == {fresh}
            assert table.counters["evictions"] == evicted  # nothing acknowledged was evicted
            stalled.join()


def test_a_put_preferring_a_node_just_mounted_goes_there(tmp_path):
    args = [*FAST_MASTER, "--heartbeat-ttl", "20s"]
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=args) as cluster:
        with Client(cluster.master_address) as store:
            stalled = _stall(cluster, 1)
            store.put("ends-a-put", b"x" * 4096)  # a push goes out and hangs on node-1
            _wait_for_a_push_in_flight(cluster)
            fresh = cluster.add_node().server.node_id
            for i in range(3):  # a co-located engine prefers its own node
                store.put_many({f"local/{i}": BLOCK}, preferred_nodes=[fresh])
                assert _nodes_of(cluster, f"local/{i}") == {fresh}
            assert stalled.is_alive()
            states = {n.node_id: n.state for n in store.list_nodes()}
            assert states[fresh] == "valid"
            stalled.join()
            wait_until(lambda: all(n.state == "valid" for n in store.list_nodes()),
                       what="every node valid")  # fmt: skip
