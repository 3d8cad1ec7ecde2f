"""Issue 13's table rules, with an injected clock: soft pins, placement hints, the lease check
of remove without force, and the bounded key scan behind ListKeys."""

import pytest

from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.placement import choose_segments
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mount(table: ObjectTable, name: str, segment_id: int, size: int = 4 * MiB) -> None:
    node = NodeInfo(name, 1, f"{name}:data", f"shm-{name}", f"{name}:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, segment_id, Tier.DRAM, size), None)])


@pytest.fixture
def clock():
    return Clock()


def new_table(clock, nodes=1, size=4 * MiB):
    t = ObjectTable(TableConfig(lease_ttl_s=5, put_timeout_s=30), clock=clock)
    for i in range(nodes):
        mount(t, f"node-{i}", 100 + i, size)
    return t


def commit(t, key, size=MiB, **options):
    out = t.put_start(key, size, **options)
    t.put_end(key, 7)
    t.commit_put_end(key)
    return out


def test_soft_pinned_objects_go_after_unpinned_ones(clock):
    t = new_table(clock)
    commit(t, "soft", soft_pin_ttl_s=60)  # oldest: LRU would evict it first
    commit(t, "plain")
    commit(t, "hard-1", pin_ttl_s=0)
    commit(t, "hard-2", pin_ttl_s=0)
    commit(t, "new-1")  # the pool is full: the unpinned object goes, not the soft-pinned one
    assert t.exists("soft") and not t.exists("plain")
    t.read("new-1")  # leased: not evictable either
    commit(t, "new-2")  # nothing unpinned is evictable: the soft pin yields
    assert not t.exists("soft") and t.exists("hard-1") and t.exists("new-1")
    t.validate()


def test_soft_pin_ends_with_its_ttl(clock):
    t = new_table(clock)
    commit(t, "soft", soft_pin_ttl_s=10)
    for i in range(3):
        commit(t, f"plain-{i}")
    clock.now += 11  # the soft pin is over: plain LRU order again
    commit(t, "new")
    assert not t.exists("soft") and t.exists("plain-0")


def test_preferred_nodes_get_the_replica_when_they_have_room(clock):
    t = new_table(clock, nodes=3)
    for name in ("node-0", "node-2:data"):  # a node id or a data endpoint
        placed = commit(t, f"k-{name}", preferred_nodes=[name]).placements
        assert [seg.node_id for seg, _ in placed] == [name.split(":")[0]]
    commit(t, "fill", 3 * MiB, preferred_nodes=["node-1"])
    # node-1 is now full: the hint yields to a node with room
    placed = t.put_start("spill", 2 * MiB, preferred_nodes=["node-1"]).placements
    assert [seg.node_id for seg, _ in placed] != ["node-1"]


def test_choose_segments_puts_preferred_first():
    class Seg:
        def __init__(self, node_id, free):
            self.node_id, self.free_bytes, self.largest_free = node_id, free, free

    segs = [Seg("a", 100), Seg("b", 10), Seg("c", 50)]
    assert [s.node_id for s in choose_segments(segs, 5, 2, {"b"})] == ["b", "a"]
    assert [s.node_id for s in choose_segments(segs, 20, 1, {"b"})] == ["a"]  # no room


def test_leased_until_the_read_lease_ends(clock):
    t = new_table(clock)
    commit(t, "k")
    assert not t.leased("k")
    t.read("k")
    assert t.leased("k")
    clock.now += 6
    assert not t.leased("k") and not t.leased("missing")


def test_scan_keys_pages_through_committed_keys_in_bounded_slices(clock):
    t = new_table(clock, size=64 * MiB)
    for i in range(25):
        commit(t, f"a/{i}", 4096)
    t.put_start("pending", 4096)  # not committed: never listed
    t.remove("a/3")
    seen, start = [], 0
    while start >= 0:
        rows, start = t.scan_keys(start, limit=4, budget=6)
        assert len(rows) <= 4
        seen += [key for key, size, replicas in rows if size == 4096 and replicas == 1]
    assert sorted(seen) == sorted(f"a/{i}" for i in range(25) if i != 3)
    assert len(seen) == len(set(seen))
    rows, _ = t.scan_keys(0, limit=100, prefix="a/2")
    assert sorted(k for k, _, _ in rows) == ["a/2", "a/20", "a/21", "a/22", "a/23", "a/24"]


def test_contributed_node_gets_a_node_token_never_the_client_token(monkeypatch):
    from mooncake_store.compat.segment import node_environment

    monkeypatch.setenv("MOONCAKE_TOKEN", "client-token")
    monkeypatch.setenv("MOONCAKE_TOKEN_FILE", "/client/file")
    monkeypatch.delenv("MOONCAKE_NODE_TOKEN", raising=False)
    monkeypatch.delenv("MOONCAKE_NODE_TOKEN_FILE", raising=False)
    env = node_environment()
    assert "MOONCAKE_TOKEN" not in env and "MOONCAKE_TOKEN_FILE" not in env  # local file then
    monkeypatch.setenv("MOONCAKE_NODE_TOKEN", "node-token")
    env = node_environment()
    assert env["MOONCAKE_TOKEN"] == "node-token" and "MOONCAKE_TOKEN_FILE" not in env
