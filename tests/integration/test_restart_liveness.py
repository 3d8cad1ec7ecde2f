"""A restarted master that is slow to answer its nodes' mounts keeps them (and their blocks).

Found by `scripts/chaos.py --nodes 4`: after a master kill -9 and restart, a master busy with
its clients processed two nodes' mounts but answered too late for the nodes' deadline; the
nodes never learnt the new heartbeat port, went on beating at the old one (nothing listened
there), kept re-asking the busy main port instead of beating, and the master dropped them
after the grace window with 1156 acknowledged blocks whose copies were all there.

Now a master listens on its last run's heartbeat port again when it is free, and a node keeps
beating while it waits (as long as --mount-timeout) for a mount reply.  The test stalls the
restarted master's event loop for longer than the heartbeat TTL and grace together, right
after it mounted the node and before the node can read the reply, as the chaos run's load
did.
"""

from __future__ import annotations

import logging
import socket
import time

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import wait_until

TTL_S, GRACE_S = 1.0, 1.0
MASTER = ["--heartbeat-interval", "200ms", "--heartbeat-ttl", f"{TTL_S}s",
          "--suspect-grace", f"{GRACE_S}s"]  # fmt: skip
STALL_S = TTL_S + GRACE_S + 1.5


class StallAfterMount(logging.Handler):
    """Blocks the master's event loop (the thread that logs the mount) once, for `STALL_S`,
    just after the mount was applied and before its reply is sent."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.stalled = 0.0

    def emit(self, record: logging.LogRecord) -> None:
        if self.armed and record.getMessage().startswith("mounted node"):
            self.armed = False
            started = time.monotonic()
            time.sleep(STALL_S)
            self.stalled = time.monotonic() - started


def liveness_port(cluster: InProcessCluster) -> int:
    assert cluster.master is not None
    return int(cluster.master.server._servicer.liveness_port)


def test_a_slow_restarted_master_keeps_its_nodes_and_their_blocks(tmp_path):
    values = {f"k{i}": bytes([i]) * 5000 for i in range(20)}
    stall = StallAfterMount()
    master_log = logging.getLogger("mooncake.master")
    master_log.addHandler(stall)
    level = master_log.level
    master_log.setLevel(logging.INFO)  # the mount is logged at INFO
    try:
        with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=MASTER) as cluster:
            with Client(cluster.master_address, replicas=1) as store:
                for key, value in values.items():
                    store.put(key, value)
            before = liveness_port(cluster)
            assert cluster.master is not None
            cluster.master.stop()
            stall.armed = True
            cluster.start_master()
            assert liveness_port(cluster) == before  # the port of the last run, free again
            wait_until(lambda: stall.stalled > 0, timeout_s=30, what="the mount and the stall")
            time.sleep(TTL_S + GRACE_S)  # ticks after the stall judge the node
            with Client(cluster.master_address, replicas=1) as store:
                assert [n.node_id for n in store.list_nodes()] == ["node-0"]
                for key, value in values.items():
                    assert store.get(key) == value
                counters = store.stats().counters
            assert counters.get("nodes_expired", 0) == 0 and counters.get("objects_lost", 0) == 0
    finally:
        master_log.removeHandler(stall)
        master_log.setLevel(level)


def test_a_taken_heartbeat_port_is_replaced_and_nodes_learn_the_new_one(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=MASTER) as cluster:
        with Client(cluster.master_address) as store:
            store.put("kept", b"v" * 1000)
        before = liveness_port(cluster)
        assert cluster.master is not None
        cluster.master.stop()
        squatter = socket.socket()
        try:
            squatter.bind(("127.0.0.1", before))
            squatter.listen()
            cluster.start_master()
            after = liveness_port(cluster)
            assert after != before
            node = cluster.nodes[0].server._link
            # The node beats on the main port meanwhile, and learns the new port by mounting.
            wait_until(lambda: node._beat_address.endswith(f":{after}"), timeout_s=20,
                       what="the node heartbeating at the new port")  # fmt: skip
            beats = node.heartbeats
            wait_until(lambda: node.heartbeats > beats + 3, what="heartbeats at the new port")
            with Client(cluster.master_address) as store:
                assert store.get("kept") == b"v" * 1000
                assert store.stats().counters.get("nodes_expired", 0) == 0
        finally:
            squatter.close()
