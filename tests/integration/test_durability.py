"""Durability modes: a host crash in the default window mode loses at most the last
--sync-interval of commits, and the store treats them as evictions.

A host crash is simulated by restoring the master's RocksDB directory from a copy taken
before the last commits while the node (and the bytes it holds) lives on.
"""

from __future__ import annotations

import os
import shutil
import signal

import pytest

from mooncake_store import Client, ObjectNotFoundError
from mooncake_store.client.transport import ShmMapper
from tests.conftest import FAST_MASTER, replica_list

MiB = 1 << 20


def test_commits_lost_with_the_host_are_evictions_and_their_space_is_reused(tmp_path):
    from mooncake_store.cluster import LocalCluster

    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        kept = {f"kept/{i}": os.urandom(MiB) for i in range(4)}
        lost = {f"lost/{i}": os.urandom(MiB) for i in range(8)}
        with Client(master) as store:
            store.put_many(kept)
        assert cluster.master.stop() == 0  # a clean stop fsyncs the log
        snapshot = tmp_path / "snapshot"
        shutil.copytree(cluster.data_dir, snapshot)  # the disk as a host crash would leave it

        cluster.start_master()
        cluster.wait_for_nodes(1)
        with Client(master) as store:
            for i in range(0, 8, 4):  # acknowledged: in RocksDB's log, and in the node's pool
                store.put_many(dict(list(lost.items())[i : i + 4]))
            assert store.get_many(list(lost)) == list(lost.values())
        where = {key: replica_list(master, key).replicas[0] for key in lost}

        cluster.master.signal(signal.SIGKILL)  # the host "crashes": the log tail never synced
        cluster.master.proc.wait()
        shutil.rmtree(cluster.data_dir)
        shutil.copytree(snapshot, cluster.data_dir)
        cluster.start_master()
        cluster.wait_for_nodes(1)

        mapper = ShmMapper()  # the node still holds the lost blocks' bytes
        try:
            for key, loc in where.items():
                pool = mapper.map(loc)
                assert pool is not None
                assert bytes(pool[loc.offset : loc.offset + MiB]) == lost[key]
        finally:
            mapper.close()

        with Client(master) as store:
            assert store.get_many(list(kept)) == list(kept.values())
            for key in lost:  # lost with the host: a miss, never stale bytes
                with pytest.raises(ObjectNotFoundError):
                    store.get(key)
            assert store.exists_many(list(lost)) == [False] * len(lost)
            # Reconciliation freed the lost extents: 11 MiB more fit beside the 4 kept
            # blocks in the 16 MiB pool without evicting anything.
            fresh = {f"fresh/{i}": os.urandom(MiB) for i in range(11)}
            for i in range(0, 11, 4):  # in batches: pending puts may hold at most half a pool
                store.put_many(dict(list(fresh.items())[i : i + 4]))
            assert store.get_many(list(fresh)) == list(fresh.values())
            assert store.get_many(list(kept)) == list(kept.values())
            reused = {
                (loc.segment_id, loc.offset) for loc in where.values()
            } & {(r.segment_id, r.offset) for r in (
                replica_list(master, key).replicas[0] for key in fresh
            )}  # fmt: skip
            assert reused  # the fresh blocks landed where the lost ones were
            store.put("lost/0", lost["lost/0"])  # a lost key can be written again (the last
            assert store.get("lost/0") == lost["lost/0"]  # free MiB), and reads right
