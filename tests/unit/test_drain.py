"""Draining a node (pure core): no new puts or copies onto it; its single-copy objects move."""

from __future__ import annotations

import pytest

from mooncake_store.common.errors import NoSpaceError, SegmentNotFoundError
from mooncake_store.master.drain import Drains
from mooncake_store.master.leases import grant_leases
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.replication import Replication, ReplicationConfig
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

MiB = 1 << 20


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(nodes=3):
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock)
    for i in range(nodes):
        node = NodeInfo(f"n{i}", 7, f"n{i}:data", "shm", f"n{i}:control", b"k" * 32)
        table.mount(node, [(SegmentInfo(node, 100 + i, Tier.DRAM, 16 * MiB), None)])
    replication = Replication(table, ReplicationConfig(max_replicas=3), clock=clock)
    drains = Drains(table, replication)
    table.draining = replication.avoid = drains.draining  # as the server wires them
    return table, replication, drains


def commit(table, key, replicas=1):
    table.put_start(key, MiB, replicas)
    table.put_end(key, 5)
    table.commit_put_end(key)


def nodes_of(table, key):
    return sorted(table.segment(r.segment_id).node_id for r in table.get(key).replicas)


def test_single_copy_objects_are_copied_off_a_draining_node():
    table, replication, drains = cluster()
    for i in range(12):
        commit(table, f"k{i}")
    commit(table, "two", replicas=2)
    on_n0 = sorted(k for k in (f"k{i}" for i in range(12)) if nodes_of(table, k) == ["n0"])
    assert on_n0  # placement spread them over the three nodes
    progress = drains.drain("n0", 7)
    assert progress.remaining == len(on_n0) and progress.saved == 0
    assert drains.at_risk("n0") == on_n0  # "two" has a replica elsewhere: not at risk

    # No new put lands on the draining node.
    for i in range(9):
        commit(table, f"new{i}")
        assert "n0" not in nodes_of(table, f"new{i}")

    tasks = drains.plan()
    assert sorted(t.key for t in tasks) == on_n0
    assert all(t.src.node_id == "n0" and t.dst.node_id != "n0" for t in tasks)
    assert drains.drain("n0", 7).copying == len(on_n0)
    for task in tasks:
        assert replication.complete(task, ok=True)
    progress = drains.drain("n0", 7)
    assert (progress.remaining, progress.copying, progress.saved) == (0, 0, len(on_n0))
    assert drains.plan() == []

    table.unmount("n0", 7)
    drains.forget("n0")
    for key in [f"k{i}" for i in range(12)] + ["two"]:
        assert table.exists(key), key  # nothing was lost with the node
    assert replication.counters["drain_copies"] == len(on_n0)
    table.validate()


def test_a_failed_drain_copy_is_planned_again():
    table, replication, drains = cluster(nodes=2)
    commit(table, "k")
    source = nodes_of(table, "k")[0]
    drains.drain(source, 7)
    (task,) = drains.plan()
    assert not replication.complete(task, ok=False)
    assert drains.drain(source, 7).remaining == 1
    (again,) = drains.plan()
    assert replication.complete(again, ok=True)
    assert drains.drain(source, 7).remaining == 0


def test_repairs_do_not_copy_onto_a_draining_node():
    table, replication, drains = cluster(nodes=3)
    commit(table, "k", replicas=2)
    holders = nodes_of(table, "k")
    spare = ({"n0", "n1", "n2"} - set(holders)).pop()
    drains.drain(spare, 7)
    table.unmount(holders[0], 7)
    assert replication.plan() == []  # the only other node is draining


def test_draining_every_node_refuses_puts_with_a_clear_error():
    table, _, drains = cluster(nodes=1)
    drains.drain("n0", 7)
    with pytest.raises(NoSpaceError, match="draining"):
        table.put_start("k", MiB)


def test_an_unknown_node_or_incarnation_cannot_be_drained():
    table, _, drains = cluster(nodes=2)
    with pytest.raises(SegmentNotFoundError):
        drains.drain("nope", 7)
    with pytest.raises(SegmentNotFoundError):
        drains.drain("n0", 8)
    assert drains.draining == {}
    assert drains.drain("n0", 0).remaining == 0  # 0: whichever process is mounted (an operator)
    assert drains.draining == {"n0": 7}
    drains.forget("n0")
    # A node that comes back as a new process without asking is no longer draining.
    drains.drain("n1", 7)
    node = NodeInfo("n1", 9, "n1:data", "shm", "n1:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, 200, Tier.DRAM, 16 * MiB), None)])
    drains.plan()
    assert "n1" not in drains.draining


def test_a_drain_gives_back_the_unused_leases_on_its_node():
    table, _, drains = cluster(nodes=2)
    leases = dict(grant_leases(table, MiB, 1, 2, owner=7))  # one per node: free room first
    on = {key: table.segment(outcome.placements[0][1].segment_id).node_id
          for key, outcome in leases.items()}  # fmt: skip
    assert sorted(on.values()) == ["n0", "n1"]
    drains.drain("n0", 7)
    assert {key for key in leases if key in table._lease_keys} == {
        key for key, node in on.items() if node == "n1"
    }
