"""Replica maintenance planning: repair after a loss, hot replicas, cooling."""

from __future__ import annotations

from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.replication import Replication, ReplicationConfig
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

MiB = 1 << 20


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(nodes=3, hot_reads=0):
    clock = Clock()
    table = ObjectTable(TableConfig(hot_reads=hot_reads, hot_window_s=10), clock=clock)
    for i in range(nodes):
        node = NodeInfo(f"n{i}", 1, f"n{i}:data", "shm", f"n{i}:control", b"k" * 32)
        table.mount(node, [(SegmentInfo(node, 100 + i, Tier.DRAM, 16 * MiB), None)])
    return table, Replication(table, ReplicationConfig(max_replicas=3), clock=clock), clock


def commit(table, key, replicas=1):
    table.put_start(key, MiB, replicas)
    table.put_end(key, 5)
    table.commit_put_end(key)


def nodes_of(table, key):
    return sorted(table.segment(r.segment_id).node_id for r in table.get(key).replicas)


def test_lost_replicas_are_repaired_on_another_node():
    table, repl, _ = cluster()
    commit(table, "k", replicas=2)
    lost = nodes_of(table, "k")[0]
    assert table.unmount(lost, 1) == []
    assert "k" in table.under_replicated
    (task,) = repl.plan()
    assert task.reason == "repair" and task.dst.node_id not in nodes_of(table, "k")
    assert not table.evictable("k")  # the source is held for the copy
    assert repl.complete(task, ok=True)
    assert len(nodes_of(table, "k")) == 2 and "k" not in table.under_replicated
    assert table.evictable("k")  # the hold ends with the copy
    assert repl.plan() == [] and repl.counters["repairs"] == 1
    table.validate()


def test_a_failed_copy_is_retried_later():
    table, repl, clock = cluster()
    commit(table, "k", replicas=2)
    table.unmount(nodes_of(table, "k")[0], 1)
    (task,) = repl.plan()
    assert not repl.complete(task, ok=False)
    assert "k" in table.under_replicated and repl.plan() == []  # backs off a while
    clock.now += 1.0
    assert len(repl.plan()) == 1


def test_objects_that_cannot_be_repaired_are_not_rescanned_every_tick():
    table, repl, clock = cluster(nodes=2)
    for i in range(10):
        commit(table, f"k{i}", replicas=3)  # 2 nodes: short of one replica, forever
    tried: list[str] = []
    real_get = table.get

    def counting_get(key):
        tried.append(key)
        return real_get(key)

    table.get = counting_get  # type: ignore[method-assign]
    assert repl.plan() == [] and len(tried) == 10  # each tried once
    for _ in range(3):
        clock.now += 0.25  # ticks inside the back-off: nothing is looked at
        assert repl.plan() == []
    assert len(tried) == 10
    clock.now += 1.0
    repl.plan()
    assert len(tried) == 20  # the back-off doubles from here
    clock.now += 1.5
    repl.plan()
    assert len(tried) == 20
    node = NodeInfo("n9", 1, "n9:data", "shm", "n9:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, 999, Tier.DRAM, 64 * MiB), None)])
    assert len(repl.plan()) == 10  # a node came: everyone is tried at once
    assert repl.repairs_waiting() == 0


def test_best_effort_puts_are_topped_up_when_nodes_allow():
    table, repl, _ = cluster(nodes=1)
    commit(table, "k", replicas=2)
    assert nodes_of(table, "k") == ["n0"] and repl.plan() == []
    node = NodeInfo("late", 1, "late:data", "shm", "late:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, 999, Tier.DRAM, 16 * MiB), None)])
    (task,) = repl.plan()
    repl.complete(task, ok=True)
    assert nodes_of(table, "k") == ["late", "n0"]


def test_hot_blocks_get_replicas_and_cool_down():
    table, repl, clock = cluster(hot_reads=3)
    commit(table, "hot")
    commit(table, "cold")
    for _ in range(3):
        table.get_replicas("hot")
    table.get_replicas("cold")
    (task,) = repl.plan()
    assert task.key == "hot" and task.reason == "hot"
    repl.complete(task, ok=True)
    assert len(nodes_of(table, "hot")) == 2 and repl.hot == {"hot"}
    clock.now += 5
    repl.plan()
    assert len(nodes_of(table, "hot")) == 2  # still within its window
    clock.now += 11  # a window without reads
    repl.plan()
    assert len(nodes_of(table, "hot")) == 1 and repl.counters["hot_replicas_dropped"] == 1
    table.validate()
