"""Membership rules with an injected clock: suspect before dead, the grace window, identity
conflicts (master/membership.py), and the thread-safe heartbeat record (master/liveness.py)."""

from __future__ import annotations

import threading

import pytest

from mooncake_store.common.errors import IdentityConflictError, ReplicaUnavailableError
from mooncake_store.master.liveness import Heartbeats
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from tests.unit.test_object_table import Clock, MiB, commit, mount, node_info

TTL_S, GRACE_S = 10.0, 20.0


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock):
    t = ObjectTable(
        TableConfig(heartbeat_ttl_s=TTL_S, suspect_grace_s=GRACE_S, restore_grace_s=60),
        clock=clock,
    )
    for i in range(3):
        mount(t, f"node-{i}", 100 + i)
    yield t
    t.validate()


def beat(table: ObjectTable, *names: str) -> None:
    for name in names:
        assert table.heartbeat(name, table.node(name).info.incarnation)


def on_node(table: ObjectTable, node_id: str, count: int, replicas: int = 1) -> list[str]:
    """Commit objects until `count` of them have a replica on `node_id`."""
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        key = f"{node_id}/{replicas}/{i}"
        out = commit(table, key, replicas=replicas)
        if any(seg.node_id == node_id for seg, _ in out.placements):
            keys.append(key)
        i += 1
    return keys


def test_a_silent_node_is_suspect_then_offered_again_with_every_replica(table, clock) -> None:
    keys = on_node(table, "node-1", 5)
    objects = table.object_count()
    clock.now += TTL_S + 1
    beat(table, "node-0", "node-2")
    result = table.tick()
    assert [n.node_id for n in result.suspect_nodes] == ["node-1"]
    assert not result.dead_nodes and not result.deleted_keys
    # Not offered: not listed, not readable, not chosen for new puts, but nothing is deleted.
    assert "node-1" not in {s.node_id for s in table.segments()}
    assert table.object_count() == objects
    assert not any(table.exists(k) for k in keys)
    with pytest.raises(ReplicaUnavailableError):
        table.read(keys[0])
    for i in range(6):
        out = table.put_start(f"new/{i}", MiB, 1)
        assert all(seg.node_id != "node-1" for seg, _ in out.placements)
    table.validate()
    # Back within the grace window, same incarnation: its replicas are valid again.
    clock.now += GRACE_S - 2
    beat(table, "node-0", "node-1", "node-2")
    result = table.tick()
    assert [n.node_id for n in result.revived_nodes] == ["node-1"]
    assert all(table.exists(k) for k in keys)
    assert table.read(keys[0]).live[0][0].node_id == "node-1"
    assert table.counters["nodes_suspected"] == 1 and table.counters["nodes_expired"] == 0


def test_node_conditions_list_suspect_and_draining_nodes_with_time_to_drop(table, clock) -> None:
    """What ListNodes shows an operator: every mounted node, suspect ones too (issue 11)."""

    def conditions() -> dict[str, tuple[str, float]]:
        return {s.info.node_id: (c.value, d) for s, c, d in table.node_conditions()}

    assert conditions() == {f"node-{i}": ("valid", 0.0) for i in range(3)}
    table.draining = {"node-2": 1}
    clock.now += TTL_S + 1
    beat(table, "node-0", "node-2")
    table.tick()
    assert "node-1" not in {s.node_id for s in table.segments()}  # not offered...
    found = conditions()  # ...but listed, with the seconds left before it is dropped
    assert found["node-0"] == ("valid", 0.0) and found["node-2"] == ("draining", 0.0)
    assert found["node-1"] == ("suspect", pytest.approx(GRACE_S - 1))
    clock.now += 2
    assert conditions()["node-1"] == ("suspect", pytest.approx(GRACE_S - 3))
    beat(table, "node-1")
    table.tick()
    assert conditions()["node-1"] == ("valid", 0.0)


def test_a_node_silent_past_the_grace_window_is_dropped_with_its_objects(table, clock) -> None:
    single = on_node(table, "node-1", 4)
    double = on_node(table, "node-1", 4, replicas=2)
    clock.now += TTL_S + 1
    beat(table, "node-0", "node-2")
    assert table.tick().suspect_nodes
    clock.now += GRACE_S
    beat(table, "node-0", "node-2")
    result = table.tick()
    assert [n.node_id for n in result.dead_nodes] == ["node-1"]
    # Only the objects no replica of which can come back are deleted.
    assert set(result.deleted_keys) == set(single)
    assert table.counters["objects_lost"] == len(single)  # counted, as evictions are not
    assert all(table.exists(k) for k in double)
    assert not table.heartbeat("node-1", 1)  # forgotten: it must mount again


def test_repairs_start_while_a_node_is_suspect(table, clock) -> None:
    keys = on_node(table, "node-1", 3, replicas=2)
    table.under_replicated.clear()
    clock.now += TTL_S + 1
    beat(table, "node-0", "node-2")
    table.tick()
    assert set(keys) <= table.under_replicated


def test_a_late_tick_judges_nodes_by_when_their_heartbeats_arrived(clock) -> None:
    """The heartbeat record is written by another thread while the table's loop is stalled: a
    tick that runs late sees the beats that arrived meanwhile and drops nobody."""
    table = ObjectTable(TableConfig(heartbeat_ttl_s=TTL_S), clock=clock)
    mount(table, "node-0", 100)
    keys = on_node(table, "node-0", 3)
    for _ in range(5):  # the loop is stalled for 5 TTLs; beats land from another thread
        clock.now += TTL_S - 1
        worker = threading.Thread(target=table.heartbeats.beat, args=("node-0", 1))
        worker.start()
        worker.join()
    result = table.tick()
    assert not result.suspect_nodes and not result.dead_nodes
    assert all(table.exists(k) for k in keys)


def test_a_second_live_node_under_the_same_id_is_refused_and_changes_nothing(table) -> None:
    keys = on_node(table, "node-1", 4)
    intruder = NodeInfo("node-1", 7, "elsewhere:9", "shm-x", "elsewhere:10", b"k" * 32)
    with pytest.raises(IdentityConflictError) as refused:
        table.mount(intruder, [(SegmentInfo(intruder, 900, Tier.DRAM, 16 * MiB), None)])
    message = str(refused.value)
    assert "node-1" in message and "node-1:data" in message and "elsewhere:9" in message
    assert table.node("node-1").info.incarnation == 1
    assert table.segment(900) is None
    assert all(table.exists(k) for k in keys)


def test_a_restart_at_the_same_endpoint_or_after_the_ttl_replaces_the_node(table, clock) -> None:
    on_node(table, "node-1", 2)
    mount(table, "node-1", 201, incarnation=2)  # same data endpoint: the old one is gone
    assert table.node("node-1").info.incarnation == 2
    moved = NodeInfo("node-1", 3, "elsewhere:9", "shm-x", "elsewhere:10", b"k" * 32)
    spec = [(SegmentInfo(moved, 301, Tier.DRAM, 16 * MiB), None)]
    with pytest.raises(IdentityConflictError):
        table.mount(moved, spec)
    table.mount(moved, spec, replace=True)  # the caller found the old endpoint dead
    assert table.node("node-1").info.endpoint == "elsewhere:9"
    clock.now += TTL_S + 1  # silent past its TTL (suspect): a new process may take the id
    beat(table, "node-0", "node-2")
    table.tick()
    again = NodeInfo("node-1", 4, "third:9", "shm-y", "third:10", b"k" * 32)
    table.mount(again, [(SegmentInfo(again, 401, Tier.DRAM, 16 * MiB), None)])
    assert table.node("node-1").info.incarnation == 4 and not table.node("node-1").suspect


def test_a_segment_id_owned_by_another_mounted_node_is_refused(table, clock) -> None:
    keys = on_node(table, "node-2", 3)
    thief = node_info("node-9")
    with pytest.raises(IdentityConflictError) as refused:
        table.mount(thief, [(SegmentInfo(thief, 102, Tier.DRAM, 16 * MiB), None)])
    assert "102" in str(refused.value) and "node-2" in str(refused.value)
    assert "node-9" in str(refused.value)
    assert table.node("node-9") is None
    assert table.segment(102).node_id == "node-2"
    assert all(table.exists(k) for k in keys)
    clock.now += TTL_S + 1  # suspect: it may come back with the segment's replicas
    beat(table, "node-0", "node-1")
    table.tick()
    with pytest.raises(IdentityConflictError, match="suspect node 'node-2'"):
        table.mount(thief, [(SegmentInfo(thief, 102, Tier.DRAM, 16 * MiB), None)])
    clock.now += GRACE_S  # dropped: the id is free
    beat(table, "node-0", "node-1")
    table.tick()
    table.mount(thief, [(SegmentInfo(thief, 102, Tier.DRAM, 16 * MiB), None)])
    assert table.node("node-9") is not None


def test_heartbeats_know_only_the_mounted_incarnation(clock) -> None:
    heartbeats = Heartbeats(clock)
    assert not heartbeats.beat("n", 1) and heartbeats.last("n") is None
    heartbeats.expect("n", 1)
    clock.now += 3
    assert heartbeats.beat("n", 1) and heartbeats.last("n") == clock.now
    assert not heartbeats.beat("n", 2)
    heartbeats.forget("n")
    assert not heartbeats.beat("n", 1)
