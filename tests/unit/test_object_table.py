"""ObjectTable state machine with an injected clock: puts, leases, zombies, dead nodes, restore."""

import pytest

from mooncake_store.common.errors import (
    IdentityMismatchError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidValueError,
    NoSpaceError,
    ObjectBusyError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def node_info(name: str, incarnation: int = 1) -> NodeInfo:
    return NodeInfo(name, incarnation, f"{name}:data", f"shm-{name}", f"{name}:control", b"k" * 32)


def mount(table, name: str, segment_id: int, size: int = 16 * MiB, *, incarnation: int = 1,
          tier: Tier = Tier.DRAM, inventory=None, more=()):  # fmt: skip
    node = node_info(name, incarnation)
    specs = [(SegmentInfo(node, segment_id, tier, size), inventory)]
    specs += [(SegmentInfo(node, sid, t, sz), inv) for sid, t, sz, inv in more]
    table.mount(node, specs)
    return node


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def table(clock):
    t = ObjectTable(
        TableConfig(
            lease_ttl_s=5,
            put_timeout_s=30,
            heartbeat_ttl_s=10,
            restore_grace_s=60,
            suspect_grace_s=0,
        ),  # dropped at the TTL (grace: test_membership.py)
        clock=clock,
    )
    for i in range(3):
        mount(t, f"node-{i}", 100 + i)
    yield t
    t.validate()


def commit(table, key, size=MiB, replicas=1, checksum=42):
    out = table.put_start(key, size, replicas)
    table.put_end(key, checksum)
    table.commit_put_end(key)
    return out


def beat(table):
    for s in table.segments():
        assert table.heartbeat(s.node_id, table.node(s.node_id).info.incarnation)


def used(table):
    return sum(s.allocator.used_bytes for s in table.segments())


def test_put_is_invisible_until_committed(table):
    out = table.put_start("k", MiB, 1)
    assert not out.already_exists and len(out.placements) == 1
    assert not table.exists("k")
    with pytest.raises(ObjectNotFoundError):
        table.get_replicas("k")
    meta = table.put_end("k", 99)
    assert meta.state is ObjectState.COMMITTING and not table.exists("k")
    table.validate()
    assert table.commit_put_end("k") == 1
    assert table.exists("k")
    meta, live = table.get_replicas("k")
    assert meta.checksum == 99 and meta.size_bytes == MiB and len(live) == 1


def test_replicas_go_to_distinct_nodes_best_effort(table):
    out = table.put_start("k", MiB, 3)
    assert len({s.node_id for s, _ in out.placements}) == 3
    out = table.put_start("k2", MiB, 5)
    assert len(out.placements) == 3


def test_put_of_existing_key_deduplicates_and_pending_key_is_busy(table):
    commit(table, "k")
    before = used(table)
    assert table.put_start("k", MiB).already_exists
    assert used(table) == before
    table.put_start("p", MiB)
    with pytest.raises(ObjectBusyError):
        table.put_start("p", MiB)
    with pytest.raises(ObjectBusyError):
        table.remove("p")


def test_revoke_frees_everything(table):
    table.put_start("k", MiB, 2)
    assert used(table) == 2 * MiB
    table.put_revoke("k")
    assert used(table) == 0 and table.get("k") is None
    with pytest.raises(ObjectNotFoundError):
        table.put_revoke("k")
    commit(table, "c")
    with pytest.raises(ObjectBusyError):
        table.put_revoke("c")


def test_put_end_drops_failed_replicas_and_revokes_when_none_left(table):
    out = table.put_start("k", MiB, 2)
    failed = out.placements[0][1].segment_id
    meta = table.put_end("k", 1, [failed])
    assert [r.segment_id for r in meta.replicas] == [out.placements[1][1].segment_id]
    assert used(table) == MiB
    out = table.put_start("gone", MiB, 2)
    with pytest.raises(ReplicaUnavailableError):
        table.put_end("gone", 1, [s.segment_id for s, _ in out.placements])
    assert table.get("gone") is None
    with pytest.raises(ObjectNotFoundError):
        table.put_end("never-started", 1)


def test_zombie_puts_are_reclaimed_after_the_timeout(table, clock):
    table.put_start("z", MiB)
    clock.now += 29
    beat(table)
    assert table.tick().reclaimed_puts == []
    clock.now += 2
    assert table.tick().reclaimed_puts == ["z"]
    assert table.get("z") is None and used(table) == 0
    with pytest.raises(ObjectNotFoundError):
        table.put_end("z", 1)


def test_a_put_end_past_the_timeout_is_refused_before_the_tick_reclaims_it(table, clock):
    """--put-timeout bounds a put: one not ended by then is never committed, even when its
    PutEnd comes before the tick that would reclaim it (a chaos run waits the timeout out
    to know that every put under way during a fault has ended)."""
    table.put_start("late", MiB, 2)
    clock.now += 30
    beat(table)
    with pytest.raises(ObjectNotFoundError, match="outlived"):
        table.put_end("late", 1)
    assert table.get("late") is None and used(table) == 0
    assert table.counters["puts_reclaimed"] == 1 and table.tick().reclaimed_puts == []
    table.put_start("late", MiB, 2)  # the key is free for a new put
    clock.now += 29.9
    table.put_end("late", 1)  # in time
    table.commit_put_end("late")
    assert table.exists("late")


def test_remove_under_a_read_lease_defers_the_free(table, clock):
    commit(table, "k")
    table.get_replicas("k")  # lease until now + 5
    table.remove("k")
    assert not table.exists("k")
    assert used(table) == MiB  # bytes still protected
    clock.now += 4
    table.tick()
    assert used(table) == MiB
    clock.now += 2
    table.tick()
    assert used(table) == 0
    commit(table, "unleased")
    table.remove("unleased")
    assert used(table) == 0
    with pytest.raises(ObjectNotFoundError):
        table.remove("unleased")


def test_exists_does_not_count_as_an_access(table):
    commit(table, "k")
    table.exists("k")
    assert table.get("k").access_count == 0 and table.get("k").lease_until_s == 0
    table.get_replicas("k")
    assert table.get("k").access_count == 1


def test_dead_node_loses_its_replicas(table, clock):
    out = commit(table, "two", replicas=2)
    solo = commit(table, "solo", replicas=1)
    solo_seg = solo.placements[0][1].segment_id
    clock.now += 6
    for s in table.segments():  # every node but the solo one heartbeats
        if s.segment_id != solo_seg:
            assert table.heartbeat(s.node_id, 1)
    clock.now += 6
    result = table.tick()
    assert [i.node_id for i in result.dead_nodes] == [solo.placements[0][0].node_id]
    assert "solo" in result.deleted_keys and table.get("solo") is None
    two_segs = {r.segment_id for _, r in out.placements}
    if solo_seg in two_segs:
        assert len(table.get("two").replicas) == 1
    assert table.exists("two")
    assert not table.heartbeat("node-x", 1)
    assert not table.heartbeat(solo.placements[0][0].node_id, 1)  # dead: must mount again


def test_restarted_node_replaces_its_old_segment(table):
    out = commit(table, "k", replicas=3)
    assert len(out.placements) == 3
    mount(table, "node-0", 999, incarnation=2)  # the node restarted
    assert len(table.get("k").replicas) == 2
    assert 100 not in {s.segment_id for s in table.segments()}
    mount(table, "node-0", 999, incarnation=2)  # idempotent
    assert len(table.segments()) == 3


def test_unmount_returns_deleted_keys(table):
    out = commit(table, "k")
    segment = out.placements[0][0]
    assert table.unmount(segment.node_id, 1) == ["k"]
    assert table.unmount(segment.node_id, 1) == []


def test_restore_waits_for_mount_then_rebuilds_allocator(clock):
    config = TableConfig(restore_grace_s=30)
    t = ObjectTable(config, clock=clock)
    metas = [
        ObjectMeta("a", MiB, ObjectState.COMPLETE, (Replica(100, 0), Replica(101, 0)), checksum=1),
        ObjectMeta("b", 10, ObjectState.COMPLETE, (Replica(100, MiB),), checksum=2),
        ObjectMeta("c", 10, ObjectState.COMPLETE, (Replica(102, 0),), checksum=3),
        ObjectMeta("d", 10, ObjectState.COMPLETE, (Replica(102, 4096),), checksum=4),
    ]
    assert t.restore(metas) == 4
    with pytest.raises(ReplicaUnavailableError):
        t.get_replicas("a")
    assert not t.exists("a")
    mount(t, "node-0", 100)
    t.validate()
    assert t.exists("a") and t.exists("b") and not t.exists("c")
    s100 = t.segment(100)
    assert s100.allocator.used_bytes == MiB + 4096
    off = t.put_start("new", MiB).placements[0][1].offset
    assert off not in (0, MiB)  # restored extents are not handed out again
    out = t.put_start("c", 10)  # restored but unreadable: written again, not deduplicated
    assert not out.already_exists
    t.put_end("c", 3)
    t.commit_put_end("c")
    t.validate()
    clock.now += 31
    beat(t)
    result = t.tick()
    assert result.deleted_keys == ["d"]  # its node never came back within the grace
    assert [r.segment_id for r in t.get("a").replicas] == [100]
    assert t.exists("c") and t.get("c").replicas[0].segment_id == 100
    t.validate()


def test_bad_input(table):
    with pytest.raises(InvalidKeyError):
        table.put_start("", 1)
    with pytest.raises(InvalidKeyError):
        table.put_start("x" * 2000, 1)
    with pytest.raises(InvalidValueError):
        table.put_start("k", 0)
    with pytest.raises(InvalidValueError, match="larger than any node's pool"):
        table.put_start("k", 17 * MiB)
    table.put_start("k", 10)
    with pytest.raises(InvalidValueError, match="64-bit"):
        table.put_end("k", -1)  # refused before anything changes: the put is still pending
    with pytest.raises(InvalidValueError, match="64-bit"):
        table.put_end("k", 1 << 64)
    assert table.put_end("k", 7).checksum == 7 and table.commit_put_end("k") == 1
    with pytest.raises(ValueError, match="segment_id"):
        SegmentInfo(node_info("n"), 0, Tier.DRAM, MiB)  # 0 is "unset" on the wire


def test_full_pool_evicts_and_fails_only_when_nothing_is_evictable(clock):
    t = ObjectTable(TableConfig(), clock=clock)
    with pytest.raises(NoSpaceError, match="no store node is mounted"):
        t.put_start("k", 1)
    mount(t, "n", 1, size=4 * MiB)
    for i in range(4):
        commit(t, f"k{i}")
    commit(t, "k4")  # full: the least recently used block makes room
    assert t.get("k0") is None and t.exists("k4")
    assert t.take_dirty().deletes == ["k0"]
    assert t.counters["evictions"] == 1
    t.get_replicas("k1")  # leased for 5 s
    for key in ("k2", "k3", "k4"):
        assert t.put_start(key, MiB, pin_ttl_s=0).already_exists  # pinned until removed
    with pytest.raises(NoSpaceError, match="nothing can be evicted"):
        t.put_start("k5", MiB)
    clock.now += 6  # the lease ends
    commit(t, "k5")
    assert t.get("k1") is None and all(t.exists(k) for k in ("k2", "k3", "k4", "k5"))
    t.remove("k2")  # a pinned object can still be removed on purpose
    t.validate()


def test_pin_ttl_expires(clock):
    t = ObjectTable(TableConfig(), clock=clock)
    mount(t, "n", 1, size=2 * MiB)
    commit(t, "a")
    t.put_start("a", MiB, pin_ttl_s=10)
    commit(t, "b")
    with pytest.raises(NoSpaceError):
        t.put_start("c", 2 * MiB)  # needs the whole pool, and "a" is pinned for 10 s
    clock.now += 11
    commit(t, "c", size=2 * MiB)
    assert t.get("a") is None and t.get("b") is None and t.exists("c")


def test_identity_metadata_prefix_match(table):
    fa, fb = b"A" * 16, b"B" * 16
    for i, key in enumerate(["p0", "p1", "p2"]):
        table.put_start(key, MiB, fingerprint=fa, parent_key=f"p{i - 1}" if i else "", tag=b"t")
        table.put_end(key, i)
        table.commit_put_end(key)
    assert table.get("p1").parent_key == "p0" and table.get("p1").tag == b"t"
    assert table.prefix_match(["p0", "p1", "p2"], fa) == 3
    assert table.prefix_match(["p0", "p1", "p2"], fb) == 0
    assert table.prefix_match(["p0", "p1", "p2"]) == 3  # no identity presented: keys only
    assert table.get("p0").access_count == 0  # a probe, not a read
    table.remove("p1")
    assert table.prefix_match(["p0", "p1", "p2"], fa) == 1
    with pytest.raises(IdentityMismatchError):
        table.get_replicas("p0", fb)
    with pytest.raises(IdentityMismatchError):
        table.put_start("p0", MiB, fingerprint=fb)  # a dedupe must not hide a wrong identity
    assert table.put_start("p0", MiB, fingerprint=fa).already_exists
    with pytest.raises(InvalidArgumentError, match="tag is 300 bytes"):
        table.put_start("x", 1, tag=b"t" * 300)
    with pytest.raises(InvalidKeyError):
        table.put_start("x", 1, parent_key="k" * 2000)


def test_probes_do_not_keep_a_block_alive(clock):
    t = ObjectTable(TableConfig(), clock=clock)
    mount(t, "n", 1, size=2 * MiB)
    commit(t, "old")
    commit(t, "new")
    for _ in range(10):  # exists / prefix_match are probes, not reads
        assert t.exists("old") and t.prefix_match(["old"]) == 1
    commit(t, "newest")
    assert t.get("old") is None and t.exists("new")
    t.get_replicas("new")  # a read does count
    clock.now += 10  # (after its lease)
    commit(t, "latest")
    assert t.exists("new") and t.get("newest") is None


def test_object_meta_keeps_rare_fields_apart_and_compares_them():
    """Rare fields read their defaults until set; set ones are kept, compared and printed."""
    plain = ObjectMeta("k", 10, ObjectState.COMPLETE, (Replica(1, 0),), checksum=7)
    assert (plain.tag, plain.pin_until_s, plain.moving) == (b"", 0.0, False)
    assert (plain.slow_reads, plain.wanted_replicas, plain.hold_until_s) == (0, 1, 0.0)
    assert plain.protected_until_s == 0.0

    pinned = ObjectMeta("k", 10, ObjectState.COMPLETE, (Replica(1, 0),), checksum=7)
    assert pinned == plain
    pinned.pin_until_s = float("inf")
    pinned.hold_until_s = 5.0
    assert pinned != plain and pinned.pin_until_s == float("inf")
    assert pinned.protected_until_s == 5.0 and pinned.tag == b""
    assert "pin_until_s=inf" in repr(pinned)
    pinned.pin_until_s, pinned.hold_until_s = 0.0, 0.0  # back to the defaults: equal again
    assert pinned == plain

    tagged = ObjectMeta("k", 10, ObjectState.COMPLETE, (), tag=b"t", wanted_replicas=3)
    assert (tagged.tag, tagged.wanted_replicas, tagged.moving) == (b"t", 3, False)


def test_freed_slots_are_reused_without_leftovers(table, clock):
    """A removed object's slot goes to the next new object, which inherits none of its
    fields: not its reads, pin, tag, lease, parent or replicas."""
    table.put_start("old", MiB, 2, tag=b"t", pin_ttl_s=0, parent_key="nobody")
    table.put_end("old", 5)
    table.commit_put_end("old")
    table.get_replicas("old")
    table.remove("old")  # leased: its extents wait, its slot does not
    commit(table, "new", size=4096, checksum=6)
    new = table.get("new")
    assert (new.size_bytes, new.checksum, new.access_count, new.lease_until_s) == (4096, 6, 0, 0.0)
    assert (new.tag, new.pin_until_s, new.parent_key, len(new.replicas)) == (b"", 0.0, "", 1)
    assert table.get("old") is None and not table.exists("old")
    assert table.evictable("new") and not table.evictable("old")
    table.validate()
    clock.now += 6
    beat(table)
    table.tick()  # the old extents come back after the lease
    assert used(table) == 4096
    table.validate()


def test_dead_node_finds_its_objects_among_many(table, clock):
    """Dropping a segment finds its replicas by scanning the segment column (one-replica
    objects) and the multi-replica side table."""
    for i in range(60):
        commit(table, f"one-{i}", size=4096)
    for i in range(5):
        commit(table, f"two-{i}", size=4096, replicas=2)
    lost = {
        k for k in (f"one-{i}" for i in range(60)) if table.get(k).replicas[0].segment_id == 100
    }
    clock.now += 11
    for s in table.segments():
        if s.segment_id != 100:
            table.heartbeat(s.node_id, 1)
    result = table.tick()
    assert [n.node_id for n in result.dead_nodes] == ["node-0"]
    assert set(result.deleted_keys) == lost
    for i in range(5):  # the pairs keep their other replica, and are due for repair
        replicas = table.get(f"two-{i}").replicas
        assert len(replicas) >= 1 and all(r.segment_id != 100 for r in replicas)
    assert {f"two-{i}" for i in range(5) if len(table.get(f"two-{i}").replicas) == 1} <= (
        table.under_replicated
    )
    table.validate()


def test_moved_parent_keeps_its_children_reachable(clock):
    """A block moved to another tier stays the same block to the eviction policy: its
    children are not orphaned and it is not sent through the ghost table."""
    from mooncake_store.master.eviction import WeightedPolicy

    t = ObjectTable(TableConfig(), clock=clock, policy=WeightedPolicy())
    mount(t, "n", 10, more=[(20, Tier.NVME, 16 * MiB, [])])
    dram, nvme = t.segment(10), t.segment(20)
    t.put_start("parent", MiB)
    t.put_end("parent", 1)
    t.commit_put_end("parent")
    t.put_start("child", MiB, parent_key="parent")
    t.put_end("child", 2)
    t.commit_put_end("child")
    source, offset = t.begin_move("parent", dram, nvme)
    assert t.finish_move("parent", source, nvme, offset, True)
    commit(t, "fresh")  # newer, but shallower than the child
    # An orphaned child would be worth nothing and go first; a reachable one is worth more
    # than a fresh root block, so the root goes first.
    assert t.victim(dram) == "fresh"
    assert t.policy.ghost_size() == 0
    t.validate()


def test_restored_replica_the_node_does_not_vouch_for_is_dropped(clock):
    """After a restart, a persistent segment whose inventory shows another block where a
    restored replica should be: the replica goes (its extent was never reserved) and the
    block found there is adopted."""
    from mooncake_store.common.blocks import BlockRecord

    t = ObjectTable(TableConfig(), clock=clock)
    t.restore([ObjectMeta("gone", MiB, ObjectState.COMPLETE, (Replica(30, 0),), checksum=1)])
    mount(t, "n", 10, more=[(30, Tier.NVME, 16 * MiB, [BlockRecord("other", 0, MiB, 9)])])
    assert t.get("gone") is None
    assert t.exists("other") and t.get("other").checksum == 9
    dirty = t.take_dirty()
    assert dirty.deletes == ["gone"] and [m.key for m in dirty.puts] == ["other"]
    assert t.segment(30).allocator.used_bytes == MiB
    t.validate()


@pytest.mark.parametrize(("seed", "policy"), [(s, "weighted") for s in range(6)] + [(0, "lru")])
def test_random_operations_never_serve_wrong_metadata(seed, policy):
    """Random puts (chained, multi-replica, failed, revoked, abandoned), reads, removes, tier
    moves, node deaths and restarts over small pools (so evictions and slot reuse are
    constant): after every step the table's invariants hold, and every readable key carries
    exactly the size and checksum of its last committed put."""
    import random

    from mooncake_store.master.eviction import make_policy

    rng = random.Random(seed)
    clock = Clock()
    t = ObjectTable(
        TableConfig(
            lease_ttl_s=2, put_timeout_s=5, heartbeat_ttl_s=3, restore_grace_s=5, suspect_grace_s=0
        ),
        clock=clock,
        policy=make_policy(policy),
    )
    incarnation = {f"n{i}": 1 for i in range(3)}
    next_segment = iter(range(1000, 100000))

    def mount_node(name: str) -> None:
        mount(t, name, next(next_segment), 128 * 1024, incarnation=incarnation[name],
              more=[(next(next_segment), Tier.NVME, 256 * 1024, [])])  # fmt: skip

    for name in incarnation:
        mount_node(name)
    committed: dict[str, tuple[int, int]] = {}  # key -> (size, checksum) of its last commit
    moves: list[tuple] = []
    alive = set(incarnation)

    def act(op: float, key: str) -> None:
        if op < 0.45:
            size, checksum = rng.choice((1, 4096, 5000, 30_000)), rng.getrandbits(64)
            parent = f"k{rng.randrange(120)}" if rng.random() < 0.5 else ""
            try:
                out = t.put_start(key, size, rng.choice((1, 1, 2)), parent_key=parent)
            except (NoSpaceError, ObjectBusyError):
                return
            if out.already_exists:
                return
            fate = rng.random()
            if fate < 0.1:
                return  # abandoned: reclaimed as a zombie later
            if fate < 0.2:
                t.put_revoke(key)
                committed.pop(key, None)
                return
            failed = [out.placements[0][0].segment_id] if fate < 0.3 else []
            try:
                t.put_end(key, checksum, failed)
            except ReplicaUnavailableError:
                committed.pop(key, None)
                return
            t.commit_put_end(key)
            committed[key] = (size, checksum)
        elif op < 0.65:
            try:
                meta, live = t.get_replicas(key)
            except (ObjectNotFoundError, ReplicaUnavailableError):
                return
            assert (meta.size_bytes, meta.checksum) == committed[key]
            assert live and all(s.segment_id == r.segment_id for s, r in live)
        elif op < 0.72:
            try:
                t.remove(key)
            except (ObjectNotFoundError, ObjectBusyError):
                return
            committed.pop(key, None)
        elif op < 0.82 and alive:
            node = rng.choice(sorted(alive))
            src, dst = t.node_segment(node, Tier.DRAM), t.node_segment(node, Tier.NVME)
            victim = t.victim(src) if src is not None else None
            if victim is not None and dst is not None:
                started = t.begin_move(victim, src, dst)
                if started is not None:
                    moves.append((victim, *started, dst))
        elif op < 0.9 and moves:
            victim, source, offset, dst = moves.pop(rng.randrange(len(moves)))
            t.finish_move(victim, source, dst, offset, rng.random() < 0.8)
        elif op < 0.93 and len(alive) > 1:
            alive.discard(rng.choice(sorted(alive)))  # stops heartbeating: expires
        elif op < 0.96 and len(alive) < 3:
            name = rng.choice(sorted(set(incarnation) - alive))
            incarnation[name] += 1  # restarted: a new DRAM pool
            mount_node(name)
            alive.add(name)

    for _ in range(600):
        act(rng.random(), f"k{rng.randrange(120)}")
        clock.now += rng.choice((0.01, 0.1, 0.5, 1.0))
        for name in alive:
            t.heartbeat(name, incarnation[name])
        result = t.tick()
        for gone in (*result.deleted_keys, *result.reclaimed_puts):
            committed.pop(gone, None)
        t.validate()
        for k in [k for k in committed if t.get(k) is None]:
            del committed[k]  # evicted or lost with a node: gone is fine, wrong is not
        for k, (size, checksum) in committed.items():
            meta = t.get(k)
            assert meta is not None and (meta.size_bytes, meta.checksum) == (size, checksum)
    assert t.counters["evictions"] > 0 and t.counters["puts_committed"] > 50
