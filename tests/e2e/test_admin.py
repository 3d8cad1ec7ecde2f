"""`mooncake-admin nodes | stats | keys | remove | drain` against a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER

ADMIN = str(Path(sys.executable).parent / "mooncake-admin")


def admin(cluster: InProcessCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ADMIN, *args, "--master", cluster.master_address],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


@pytest.fixture(scope="module")
def managed(tmp_path_factory):
    with InProcessCluster(tmp_path_factory.mktemp("admin"), nodes=2, dram="16MiB",
                      master_args=FAST_MASTER) as cluster:  # fmt: skip
        with Client(cluster.master_address) as store:
            for i in range(5):
                store.put(f"adm/{i}", b"v" * 4096)
            store.put("other", b"w" * 4096)
            assert store.get("adm/0") == b"v" * 4096
            assert store.exists("adm/0")
            with pytest.raises(KeyError):
                store.get("adm/missing")
        yield cluster


def test_nodes_table_and_json(managed):
    out = admin(managed, "nodes")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["NODE", "TIER", "ENDPOINT", "STATE", "SIZE", "USED", "FILL",
                                "OBJECTS", "HEARTBEAT"]  # fmt: skip
    assert [line.split()[0] for line in lines[1:]] == ["node-0", "node-1"]
    assert [line.split()[3] for line in lines[1:]] == ["valid", "valid"]
    data = json.loads(admin(managed, "nodes", "--json").stdout)
    assert [d["node_id"] for d in data] == ["node-0", "node-1"]
    assert [(d["state"], d["drop_in_s"]) for d in data] == [("valid", 0.0), ("valid", 0.0)]
    assert sum(d["objects"] for d in data) == 6
    assert all(d["tier"] == "DRAM" and d["size_bytes"] == 16 * 2**20 for d in data)


def test_stats_shows_hit_rate_and_fill(managed):
    data = json.loads(admin(managed, "stats", "--json").stdout)
    assert data["objects"] == 6 and data["nodes"] == 2
    assert data["counters"]["get_hits"] >= 1 and data["counters"]["get_misses"] >= 1
    assert 0 < data["get_hit_rate"] < 1
    assert data["tiers"]["DRAM"]["objects"] == 6
    assert data["tiers"]["DRAM"]["size_bytes"] == 2 * 16 * 2**20
    text = admin(managed, "stats").stdout
    assert "get hit rate" in text and "DRAM" in text


def test_unreachable_master_is_one_line(tmp_path):
    out = subprocess.run([ADMIN, "nodes", "--master", "127.0.0.1:1", "--connect-timeout", "1"],
                         capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith("mooncake-admin: error:") and "127.0.0.1:1" in out.stderr


def test_keys_are_listed_page_by_page(managed):
    from mooncake_store.admin.keys import iter_pages

    data = json.loads(admin(managed, "keys", "--prefix", "adm/", "--json").stdout)
    assert sorted(d["key"] for d in data) == [f"adm/{i}" for i in range(5)]
    assert all(d["size_bytes"] == 4096 and d["replicas"] >= 1 for d in data)  # drain copies
    limited = json.loads(admin(managed, "keys", "--limit", "3", "--json").stdout)
    assert len(limited) == 3
    table = admin(managed, "keys", "--prefix", "other").stdout.splitlines()
    assert table[0].split() == ["KEY", "SIZE", "REPLICAS"] and table[1].split()[0] == "other"
    with Client(managed.master_address) as store:  # pages of 2 keys still give every key once
        pages = list(iter_pages(store, "adm/", page=2))
    keys = [info.key for page in pages for info in page]
    assert sorted(keys) == [f"adm/{i}" for i in range(5)] and len(pages) >= 3


def test_remove_by_prefix_leaves_the_other_keys(managed):
    out = admin(managed, "remove", "--prefix", "adm/", "--yes", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"prefix": "adm/", "removed": 5}
    with Client(managed.master_address) as store:
        assert store.exists_many([f"adm/{i}" for i in range(5)]) == [False] * 5
        assert store.get("other") == b"w" * 4096
    assert "no keys start with 'adm/'" in admin(managed, "remove", "--prefix", "adm/").stdout


def test_drain(managed):
    # Last in the module: a drained node stays draining (no new puts), and its blocks gain a
    # replica elsewhere.
    out = admin(managed, "drain", "node-1", "--json")
    if not hasattr(pb, "DrainNodeRequest"):  # this build's master has no DrainNode
        assert out.returncode == 1
        assert "not supported by this master" in out.stderr
        return
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["remaining"] == 0
