"""A master whose data directory went back in time never reuses an earlier run's put
generations (master/generations.py): the nodes report what they saw when they mount.

The disk going back is made by hand: the generation floor file is put back to what it held
before the last master run started (as a host crash losing its last write, or a restored
backup, leaves it), against a real master and node (in-process: InProcessCluster)."""

from __future__ import annotations

import os

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import AccessDeniedError
from mooncake_store.common.grant import grant_generation
from mooncake_store.master.generations import FLOOR_FILE, MARGIN, RESERVE
from tests.conftest import FAST_MASTER, wait_until
from tests.integration.test_write_grants import Master, connect, write

VALUE = os.urandom(256 * 1024)


def test_a_master_on_a_disk_gone_back_starts_past_the_generations_its_nodes_saw(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master, floor_file = cluster.master_address, cluster.data_dir / FLOOR_FILE
        assert cluster.master is not None
        cluster.master.stop()
        before = floor_file.read_text()  # the floor the next run starts from (past the clock)
        cluster.start_master()
        cluster.wait_for_nodes(1)
        gate = cluster.nodes[0].server.access.gate
        with Master(master) as calls:
            stale = calls.put_start("granted-then-lost", len(VALUE))  # never written
            generation = grant_generation(stale.grant)
            with Client(master) as store:  # later puts: the master fences the node past them
                store.put_many({f"earlier/{i}": VALUE for i in range(6)})
            wait_until(lambda: gate.generation_seen > generation + 5, timeout_s=10)
            cluster.master.stop()
        floor_file.write_text(before)  # the disk went back: the next run starts where the
        cluster.start_master()  # last one did, and would name its puts as that one did
        cluster.wait_for_nodes(1)

        # The grant the lost run handed out finds its generation ended, not reopened...
        with connect(stale) as sock:
            status, message = write(sock, stale, b"\xee" * len(VALUE))
        assert status == AccessDeniedError.code, message
        assert "write grant ended" in message
        # ...and the new run's own puts are admitted (they are named past the lost run's).
        with Client(master) as store:
            fresh = {f"fresh/{i}": os.urandom(len(VALUE)) for i in range(8)}
            store.put_many(fresh)
            assert store.get_many(list(fresh)) == list(fresh.values())
        # The floor on disk moved past the new names before they were handed out, so a later
        # restart on this directory starts past them too.
        assert int(floor_file.read_text()) >= generation + MARGIN + RESERVE // 2
        cluster.master.stop()
        cluster.start_master()
        cluster.wait_for_nodes(1)
        with Client(master) as store:
            store.put("after-restart", VALUE)
            assert store.get("after-restart") == VALUE
            assert store.get_many(list(fresh)) == list(fresh.values())
