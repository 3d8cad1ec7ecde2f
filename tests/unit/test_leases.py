"""Allocation leases on the master's table (master/leases.py), with an injected clock: a lease is
an invisible pending put; a leased put is invisible until committed; leases end with their
owner, their timeout or a release, and never hold more than their share of a pool."""

import pytest

from mooncake_store.common.errors import (
    IdentityMismatchError,
    InvalidValueError,
    NoSpaceError,
    ObjectBusyError,
    ObjectNotFoundError,
)
from mooncake_store.master.leases import (
    LEASE_SHARE,
    REFUSED_AFTER_RELEASE_S,
    grant_leases,
    lease_usage,
    put_leased,
    release_all,
    release_lease,
    short_now,
)
from mooncake_store.master.membership import REMOUNT_HOLD_S
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.segments import SegmentInfo, Tier
from tests.unit.test_object_table import Clock, MiB, commit, mount, node_info, used


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def table(clock):
    t = ObjectTable(
        TableConfig(lease_ttl_s=5, put_timeout_s=30, heartbeat_ttl_s=10, restore_grace_s=60),
        clock=clock,
    )
    mount(t, "node-0", 100, 64 * MiB)
    yield t
    t.validate()


def test_a_lease_is_invisible_space_and_a_leased_put_commits_like_put_end(table):
    [(lease, outcome)] = grant_leases(table, MiB, 1, 1, owner=7)
    assert used(table) == MiB and len(outcome.placements) == 1
    assert table.puts_in_flight() == 0  # an unused lease is not a put in flight
    assert not table.exists(lease) and table.prefix_match([lease]) == 0
    with pytest.raises(ObjectNotFoundError):
        table.read(lease)

    meta = put_leased(table, lease, "k", MiB, 0xABC, fingerprint=b"f" * 16, parent_key="p",
                      tag=b"t", pin_ttl_s=0)  # fmt: skip
    assert meta is not None and meta.key == "k" and meta.checksum == 0xABC
    assert not table.exists("k")  # sealed, not yet durable: still invisible
    assert table.get(lease) is None
    table.commit_put_end("k")
    assert table.exists("k")
    found = table.get("k")
    assert found is not None and found.replicas == meta.replicas
    assert found.fingerprint == b"f" * 16 and found.parent_key == "p" and found.tag == b"t"
    assert used(table) == MiB  # the lease's extent, now the object's
    with pytest.raises(ObjectNotFoundError):  # a lease is used once
        put_leased(table, lease, "k2", MiB, 1)


def test_a_stored_key_is_deduplicated_and_the_written_lease_given_back(table):
    commit(table, "k", size=MiB, checksum=5)
    [(lease, _)] = grant_leases(table, MiB, 1, 1, owner=0)
    assert put_leased(table, lease, "k", MiB, 5) is None
    assert table.counters["puts_deduplicated"] == 1
    # The client wrote the value into the lease before committing, and a write grant writes
    # its bytes once (node/write_gate.py): the lease is spent, its space freed.
    assert used(table) == MiB and not table._lease_keys
    with pytest.raises(ObjectNotFoundError):
        put_leased(table, lease, "other", MiB, 6)


def test_refused_commits_leave_the_lease_and_nothing_visible(table):
    commit(table, "stored")
    table.put_start("busy", MiB, 1)
    [(lease, _)] = grant_leases(table, 2 * MiB, 1, 1, owner=0)
    with pytest.raises(ObjectBusyError):
        put_leased(table, lease, "busy", 2 * MiB, 1)
    with pytest.raises(InvalidValueError, match="holds 2097152 bytes"):
        put_leased(table, lease, "x", MiB, 1)
    with pytest.raises(IdentityMismatchError):
        put_leased(table, lease, "stored", 2 * MiB, 42, fingerprint=b"g" * 16)
    with pytest.raises(InvalidValueError, match="reserved"):
        put_leased(table, lease, lease, 2 * MiB, 1)
    with pytest.raises(ObjectNotFoundError):
        put_leased(table, "\x00lease\x000\x00guessed", "y", 2 * MiB, 1)
    assert not table.exists("x") and not table.exists("y")
    before = used(table)
    assert release_lease(table, lease) and used(table) == before - 2 * MiB
    assert not release_lease(table, lease)  # already gone: a no-op


def test_unused_leases_end_with_their_owner_or_their_timeout(table, clock):
    mine = grant_leases(table, MiB, 1, 3, owner=9)
    other = grant_leases(table, MiB, 1, 1, owner=0)
    assert len(mine) == 3 and used(table) == 4 * MiB
    assert sorted(table.revoke_owner(9)) == sorted(key for key, _ in mine)  # connection closed
    assert used(table) == MiB
    clock.now += 31  # past put_timeout_s: reclaimed like any put that never ended
    table.tick()
    assert used(table) == 0
    with pytest.raises(ObjectNotFoundError):
        put_leased(table, other[0][0], "late", MiB, 1)


def test_leases_hold_at_most_their_share_of_a_pool_and_give_way_to_puts(table):
    leases = grant_leases(table, MiB, 1, 64, owner=0)
    assert len(leases) == int(64 * LEASE_SHARE)  # 8 of the 64 MiB pool
    assert release_all(table) == len(leases) and used(table) == 0
    assert grant_leases(table, 128 * MiB, 1, 1, owner=0) == []  # no room: no lease, no error


def test_leases_take_free_room_only_and_never_evict(table):
    for i in range(62):  # 62 of the 64 MiB committed: 2 MiB free
        commit(table, f"c/{i}")
    evictions = table.counters["evictions"]
    table.take_dirty()
    assert len(grant_leases(table, MiB, 1, 8, owner=0)) == 2  # the free room, no more
    assert grant_leases(table, MiB, 1, 1, owner=0) == []  # full: no lease, no eviction
    assert table.counters["evictions"] == evictions and table.object_count() == 62
    dirty = table.take_dirty()  # nor anything to write: the master stocks minted leases at
    assert dirty.puts == [] and dirty.deletes == []  # once (service_leases.py `_refill`)


def test_leases_are_counted_apart_from_objects_and_puts_in_flight(table):
    [seg] = table.segments()
    commit(table, "stored")
    table.put_start("writing", MiB, 1)
    leases = grant_leases(table, 2 * MiB, 1, 2, owner=3)
    assert (seg.leases, seg.leased_bytes) == (2, 4 * MiB)
    assert seg.objects - seg.leases == 2  # "stored" and "writing"
    assert table.object_count() == 1 and table.puts_in_flight() == 1
    assert lease_usage(table.segments()) == (2, 4 * MiB)
    meta = put_leased(table, leases[0][0], "leased", 2 * MiB, 9)  # a lease used: a put
    assert meta is not None and (seg.leases, seg.leased_bytes) == (1, 2 * MiB)
    assert table.puts_in_flight() == 1  # sealed ("writing" is still in flight)
    table.commit_put_end("leased")
    table.revoke_owner(3)
    assert (seg.leases, seg.leased_bytes) == (0, 0) and table.object_count() == 2


def test_a_lease_gets_every_replica_a_put_would_or_none(clock):
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock)
    mount(t, "a", 1, 8 * MiB)
    mount(t, "b", 2, 64 * MiB)
    assert len(grant_leases(t, MiB, 2, 1, owner=0)[0][1].placements) == 2  # 1 of 8 MiB on "a"
    # "a" holds its share of leases now (1/8): a lease on "b" alone would be a one-replica
    # put where a plain put gets two; no lease then.
    assert grant_leases(t, MiB, 2, 1, owner=0) == []
    assert len(t.put_start("plain", MiB, 2).placements) == 2
    t.validate()


def test_a_put_without_free_room_can_refuse_to_evict_while_leases_hold_room(table, clock):
    for i in range(56):
        commit(table, f"c/{i}")
    assert len(grant_leases(table, MiB, 1, 8, owner=0)) == 8  # the last 8 MiB, as leases
    with pytest.raises(NoSpaceError):  # the service gives the leases back, then retries
        table.put_start("p", MiB, 1, evict=False)
    assert release_all(table) == 8 and table.counters["evictions"] == 0
    assert grant_leases(table, MiB, 1, 1, owner=0) == []  # the room freed is the put's
    table.put_start("p", MiB, 1, evict=False)  # their room (no write fences in this table)
    assert table.counters["evictions"] == 0
    clock.now += REFUSED_AFTER_RELEASE_S
    assert len(grant_leases(table, MiB, 1, 1, owner=0)) == 1  # free room again: leases again


def test_the_room_of_released_leases_comes_with_the_next_write_fence(clock):
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-0", 100, 64 * MiB)
    [(seg, floor, open_)] = t.take_fences()
    t.fence_acked(seg, floor, open_)  # the node took the mount reply
    granted = grant_leases(t, MiB, 1, 2, owner=4)
    assert len(granted) == 2 and t.room_after_fence() == 0
    t.revoke_owner(4)  # their client closed: a write may still be on its way to the node
    assert t.room_after_fence() == 2 * MiB and used(t) == 2 * MiB  # held, not reused yet
    [(seg, floor, open_)] = t.take_fences()
    t.fence_acked(seg, floor, open_)  # the node refuses their grants now
    assert t.room_after_fence() == 0 and used(t) == 0
    t.validate()


def test_a_node_mounted_again_gets_no_put_for_a_moment_where_the_mount_is_new(clock):
    """A node mounting again on a master to which the mount is new (the master restarted, or
    dropped it) may have same-host clients still copying under the earlier mount's grants:
    none of its room is handed out for REMOUNT_HOLD_S; a repeated mount changes nothing."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock)
    node = node_info("node-0")
    t.mount(node, [(SegmentInfo(node, 100, Tier.DRAM, 16 * MiB), None)], remount=True)
    with pytest.raises(NoSpaceError, match="mounted again"):
        t.put_start("k", MiB, 1)
    assert grant_leases(t, MiB, 1, 1, owner=1) == []
    t.mount(node, [(SegmentInfo(node, 100, Tier.DRAM, 16 * MiB), None)], remount=True)
    clock.now += REMOUNT_HOLD_S - 0.01  # the repeat did not extend the hold
    with pytest.raises(NoSpaceError):
        t.put_start("k", MiB, 1)
    clock.now += 0.02
    assert len(t.put_start("k", MiB, 1).placements) == 1
    other = node_info("node-1")
    t.mount(other, [(SegmentInfo(other, 200, Tier.DRAM, 16 * MiB), None)])  # a first mount
    assert len(t.put_start("k2", MiB, 2).placements) == 2  # no hold
    t.validate()


def test_no_lease_short_of_replicas_while_a_node_is_mounting(clock):
    """A node mounted a moment ago takes no put until its first write fence is in: a plain put
    goes on the nodes writable now (best effort), but a lease, which outlives that moment, is
    not granted on fewer nodes than asked (each put into it would be acknowledged short, found
    by the chaos harness: a block's one replica was on the node stopped next). Once the node
    took its fence, the lease has every replica; with no node mounting, a cluster too small
    for the count still gets leases on what it has."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-0", 100, 64 * MiB)
    for seg, floor, open_ in t.take_fences():
        t.fence_acked(seg, floor, open_)
    assert len(grant_leases(t, MiB, 2, 1, owner=1)[0][1].placements) == 1  # one node in all
    mount(t, "node-1", 200, 64 * MiB)  # its first fence not taken yet
    assert grant_leases(t, MiB, 2, 1, owner=1) == []
    assert len(t.put_start("plain", MiB, 2).placements) == 1  # best effort, as before
    for seg, floor, open_ in t.first_fences(["node-1"]):
        t.fence_acked(seg, floor, open_)
    assert not t.awaiting_first_fence()
    [(_, outcome)] = grant_leases(t, MiB, 2, 1, owner=1)
    assert {seg.node_id for seg, _ in outcome.placements} == {"node-0", "node-1"}
    t.validate()


def test_no_lease_short_of_replicas_while_a_node_holds_its_room_after_a_remount(clock):
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock)
    mount(t, "node-0", 100, 64 * MiB)
    other = node_info("node-1")
    t.mount(other, [(SegmentInfo(other, 200, Tier.DRAM, 64 * MiB), None)], remount=True)
    assert grant_leases(t, MiB, 2, 1, owner=1) == []  # node-1 is writable in a moment
    assert len(grant_leases(t, MiB, 1, 1, owner=1)) == 1  # one replica asked: node-0 has it
    clock.now += REMOUNT_HOLD_S + 0.01
    assert len(grant_leases(t, MiB, 2, 1, owner=1)[0][1].placements) == 2
    assert t.counters["leases_refused_mounting"] == 1
    t.validate()


def test_a_mounting_node_without_room_for_the_lease_does_not_hold_leases_back(clock):
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock)
    mount(t, "node-0", 100, 64 * MiB)
    small = node_info("node-1")
    t.mount(small, [(SegmentInfo(small, 200, Tier.DRAM, 256 * 1024), None)], remount=True)
    assert len(grant_leases(t, MiB, 2, 1, owner=1)[0][1].placements) == 1  # as after the hold
    assert t.counters["leases_refused_mounting"] == 0
    t.validate()


def test_a_put_would_be_short_while_a_node_that_gives_it_a_replica_awaits_its_first_fence(clock):
    """The rule behind a plain put's wait for a mounting node (service_puts.py `_put_starts`):
    only while a node that has not taken its first fence, and has room for the value, would
    give the put a replica that the nodes ready now cannot."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    assert not t.short_while_mounting(2, MiB)  # nobody mounting
    mount(t, "node-0", 100, 64 * MiB)
    assert t.short_while_mounting(1, MiB)  # the only node is not ready yet
    for seg, floor, open_ in t.take_fences():
        t.fence_acked(seg, floor, open_)
    assert not t.short_while_mounting(2, MiB)  # one node in all: nothing to wait for
    mount(t, "node-1", 200, 64 * MiB)
    mount(t, "node-2", 300, 64 * MiB)
    assert t.short_while_mounting(2, MiB) and t.short_while_mounting(3, MiB)
    assert not t.short_while_mounting(1, MiB)  # node-0 gives it all it wants
    assert not t.short_while_mounting(2, 128 * MiB)  # no mounting node could hold it
    for seg, floor, open_ in t.first_fences(["node-1"]):
        t.fence_acked(seg, floor, open_)
    assert not t.short_while_mounting(2, MiB) and t.short_while_mounting(3, MiB)
    t.draining = {"node-2"}  # a node that drains gives no replica
    assert not t.short_while_mounting(3, MiB)


def test_a_lease_granted_short_is_refused_once_more_nodes_take_puts(clock):
    """A lease minted while the cluster had one node ready has one replica; once a second node
    takes puts, or will in a moment, a put into it would be acknowledged short for good, so its
    commit is refused (the client puts the value the two-phase way, and gets both) and it is
    not handed out."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-0", 100, 64 * MiB)
    for seg, floor, open_ in t.take_fences():
        t.fence_acked(seg, floor, open_)
    (early, _), (kept, _) = grant_leases(t, MiB, 2, 2, owner=1)
    assert put_leased(t, early, "while-alone", MiB, 7, replicas=2) is not None  # all there is
    mount(t, "node-1", 200, 64 * MiB)  # its first fence not taken yet: a put waits for it
    assert short_now(t, kept, 2) and not short_now(t, kept, 1)
    for seg, floor, open_ in t.first_fences(["node-1"]):
        t.fence_acked(seg, floor, open_)
    assert short_now(t, kept, 2) and not short_now(t, kept, 1)
    with pytest.raises(ObjectNotFoundError, match="1 of the 2 replicas"):
        put_leased(t, kept, "after", MiB, 7, replicas=2)
    assert "after" not in t._slot and t.counters["leased_puts_short_refused"] == 1
    assert put_leased(t, kept, "one-wanted", MiB, 7, replicas=1) is not None  # one is enough
    [(both, _)] = grant_leases(t, MiB, 2, 1, owner=1)
    assert not short_now(t, both, 2)
    t.validate()


@pytest.mark.parametrize("case", ["segment too small", "node full"])
def test_a_lease_short_only_of_nodes_without_room_is_committed(clock, case):
    """Found by review: a node that cannot take the value (its segment too small, its pool
    full) gives a two-phase put no replica either, so a lease without it is not short: refusing
    it would turn every leased put into a wasted write and a two-phase put, for good."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-0", 100, 256 * MiB)
    mount(t, "node-1", 200, 2 * MiB if case == "segment too small" else 16 * MiB)
    for seg, floor, open_ in t.take_fences():
        t.fence_acked(seg, floor, open_)
    if case == "node full":
        for i in range(4):  # node-1 full of committed blocks
            commit(t, f"fill{i}", 4 * MiB, 2)
    [(lease, outcome)] = grant_leases(t, 4 * MiB, 2, 1, owner=1)
    assert len(outcome.placements) == 1 and not short_now(t, lease, 2)
    assert put_leased(t, lease, "k", 4 * MiB, 7, replicas=2) is not None
    assert t.counters.get("leased_puts_short_refused", 0) == 0
    t.validate()
