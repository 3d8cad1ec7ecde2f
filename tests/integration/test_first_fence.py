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


def _stall(cluster: InProcessCluster, index: int, seconds: float = STALL_S) -> threading.Thread:
    """Block node `index`'s event loop (its control service: FenceWrites) for `seconds`."""

    async def busy() -> None:
        time.sleep(seconds)  # a loop stalled by blocking work, as a busy node's would be

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


def test_a_node_that_stalls_as_it_mounts_holds_up_no_put_that_goes_elsewhere(tmp_path):
    """Its first fence push is held (its loop is blocked): a put with room on the other nodes,
    preferring none, is placed there without waiting for that push (found by review of
    2b75a68: every put waited for it, up to its 1 s deadline)."""
    args = [*FAST_MASTER, "--heartbeat-ttl", "20s"]
    with InProcessCluster(tmp_path, nodes=2, dram="32MiB", master_args=args) as cluster:
        master = cluster.master.server  # type: ignore[union-attr]
        with Client(cluster.master_address, leases=False) as store:  # two-phase puts
            store.put("warm", BLOCK)
            fresh = cluster.add_node().server.node_id
            stalled = _stall(cluster, 2, 3.0)  # before its first fence (20 ms after the mount)
            wait_until(lambda: fresh in master._first_fencing, what="its first fence push")
            store.put("elsewhere", BLOCK)
            assert fresh in master._first_fencing  # that push is still in flight
            assert _nodes_of(cluster, "elsewhere") <= {"node-0", "node-1"}
            stalled.join()
            wait_until(lambda: not master.table.awaiting_nodes(), what="its first fence")


def test_a_node_whose_first_fence_push_failed_still_takes_puts_before_evictions(tmp_path):
    """The new node is busy past its first push's 1 s deadline, while another node holds the
    tick's push: a put that finds no free room elsewhere has the new node's first fence
    pushed again and goes there, evicting nothing (found by review of 2b75a68: it evicted an
    acknowledged block on a full node)."""
    args = [*FAST_MASTER, "--heartbeat-ttl", "20s"]
    with InProcessCluster(tmp_path, nodes=2, dram="8MiB", master_args=args) as cluster:
        master = cluster.master.server  # type: ignore[union-attr]
        table = master.table
        with Client(cluster.master_address, leases=False) as store:
            for i in range(16):  # both nodes full of acknowledged blocks
                store.put(f"full/{i}", BLOCK)
            held = _stall(cluster, 1, 6.0)
            store.put("ends-a-put", b"x" * 4096)  # a push goes out, held by node-1
            _wait_for_a_push_in_flight(cluster)
            fresh = cluster.add_node().server.node_id
            _stall(cluster, 2, 1.3).join()  # its first fence push times out (1 s)
            wait_until(lambda: not master._first_fencing, what="that push to end")
            assert held.is_alive() and fresh in table.awaiting_nodes()
            evicted = table.counters["evictions"]
            store.put("new", BLOCK)
            assert held.is_alive()  # not the tick's push: node-1 still holds it
            assert table.counters["evictions"] == evicted
            assert _nodes_of(cluster, "new") == {fresh}
            held.join()
