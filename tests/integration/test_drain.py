"""A node stopped with SIGTERM drains first: the blocks whose only replica it holds are copied to
other nodes before it unmounts, and it says how many it could not save."""

from __future__ import annotations

import hashlib

from mooncake_store import Client
from mooncake_store.cluster import LocalCluster
from tests.conftest import FAST_MASTER, replica_list


def content(key: str, size: int = 64 * 1024) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def test_sigterm_drains_single_copy_blocks_to_the_other_node(tmp_path):
    with LocalCluster(tmp_path, nodes=2, dram="32MiB", master_args=FAST_MASTER) as cluster:
        keys = [f"drain/{i}" for i in range(120)]
        with Client(cluster.master_address, replicas=1) as store:
            store.put_many({k: content(k) for k in keys})
            node_a = cluster.nodes[0].match.group(1)
            on_a = [k for k in keys if replica_list(cluster.master_address, k).replicas[0].node_id
                    == node_a]  # fmt: skip
            assert 10 < len(on_a) < len(keys)  # both nodes hold single-copy blocks
            assert cluster.nodes[0].stop(timeout_s=60) == 0
            log = cluster.nodes[0].log_path.read_text()
            assert f"drained: {len(on_a)} blocks copied to other nodes" in log
            assert len(store.list_nodes()) == 1
            assert store.get_many(keys) == [content(k) for k in keys]
            assert store.stats().counters["drain_copies"] == len(on_a)


def test_a_drain_with_nowhere_to_go_says_what_it_could_not_save(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as store:
            store.put_many({f"alone/{i}": content(f"alone/{i}") for i in range(5)})
        assert cluster.nodes[0].stop(timeout_s=30) == 0
        log = cluster.nodes[0].log_path.read_text()
        assert "drain incomplete (no other node can take them): 5 blocks" in log
