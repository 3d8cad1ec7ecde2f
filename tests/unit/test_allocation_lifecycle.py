"""Allocations tied to their segment generation: stale frees and copies are logged no-ops
(issue 11 item 3), with an injected clock and no network."""

import gc
import sys
import threading
import time
import tracemalloc

import pytest

from mooncake_store.common import clock as clock_module
from mooncake_store.common.clock import OffsetLog
from mooncake_store.common.errors import NoSpaceError, ReplicaUnavailableError
from mooncake_store.master.eviction import make_policy
from mooncake_store.master.leases import grant_leases, put_leased
from mooncake_store.master.object_table import FENCE_SLACK_S, ObjectTable, TableConfig
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

MiB = 1 << 20


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def mount(table: ObjectTable, name: str, segment_id: int, incarnation: int = 1) -> None:
    node = NodeInfo(name, incarnation, f"{name}:data", f"shm-{name}", f"{name}:ctl", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, segment_id, Tier.DRAM, 8 * MiB), None)])


def commit(table: ObjectTable, key: str, size: int = MiB, checksum: int = 42) -> int:
    out = table.put_start(key, size, 1)
    table.put_end(key, checksum)
    table.commit_put_end(key)
    return out.placements[0][1].offset


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def table(clock: Clock):
    t = ObjectTable(TableConfig(lease_ttl_s=5, heartbeat_ttl_s=10), clock=clock)
    mount(t, "node-a", 7)
    yield t
    t.validate()


def test_a_deferred_free_does_not_outlive_a_remount(table, clock):
    """Put, read (lease), remove; the node re-mounts with the same segment id; another block
    lands at the same offset; the stale free fires: the new block keeps its extent."""
    first = commit(table, "old")
    table.read("old")  # a read lease: the remove defers the free
    table.remove("old")
    mount(table, "node-a", 7, incarnation=2)  # dropped and back: same segment id, new mount
    new = commit(table, "new", size=2 * MiB)  # a different size: the old free would mismatch
    assert new == first  # same offset, as in the reported failure
    clock.now += 6  # the old lease ends: the deferred free fires
    table.tick()  # must not raise (it aborted the tick with KeyError before)
    table.validate()  # the allocator still holds "new"'s extent
    assert table.counters["stale_frees"] == 1
    later = [commit(table, f"later-{i}") for i in range(3)]
    assert new not in later  # two live objects never share an offset
    assert table.read("new").live[0][1].offset == new


def test_a_deferred_free_of_the_same_mount_still_frees(table, clock):
    commit(table, "k")
    table.read("k")
    table.remove("k")
    used = table.segment(7).allocator.used_bytes
    clock.now += 6
    table.tick()
    assert table.segment(7).allocator.used_bytes == used - MiB
    assert table.counters["stale_frees"] == 0


def test_a_copy_into_a_remounted_segment_is_dropped_without_touching_the_new_mount(table):
    mount(table, "node-b", 8)
    commit(table, "k")
    src = next(s for s in table.segments() if s.objects)
    dst = next(s for s in table.segments() if not s.objects)
    started = table.begin_move("k", src, dst)
    assert started is not None
    source, offset = started
    mount(table, dst.node_id, dst.segment_id, incarnation=2)
    fresh = table.segment(dst.segment_id)
    assert fresh is not dst and fresh.generation > dst.generation
    assert not table.finish_copy("k", source, dst, offset, True)
    assert fresh.allocator.used_bytes == 0  # nothing freed or added in the new mount


def test_a_free_the_allocator_refuses_is_logged_not_raised(table, caplog):
    offset = commit(table, "k")
    seg = table.segment(7)
    table._free_extent(seg, offset + 4 * MiB, MiB)  # free space: a double free
    assert table.counters["stale_frees"] == 1
    assert "stale free" in caplog.text
    assert table.read("k").live[0][1].offset == offset


def test_pending_puts_hold_at_most_their_share_and_evict_only_for_it(clock):
    t = ObjectTable(TableConfig(max_pending_share=0.5), clock=clock)
    mount(t, "node-a", 7)  # 8 MiB
    for i in range(6):
        commit(t, f"committed-{i}")  # 6 MiB committed
    started = 0
    with pytest.raises(NoSpaceError, match="max_pending_share"):
        for i in range(100):
            t.put_start(f"pending-{i}", MiB, 1, owner=9)
            started += 1
    assert started == 4  # 4 MiB: half the pool; 2 MiB of committed blocks made room
    assert t.counters["evictions"] == 2
    assert sum(t.exists(f"committed-{i}") for i in range(6)) == 4
    t.validate()
    assert sorted(t.revoke_owner(9)) == [f"pending-{i}" for i in range(4)]
    assert t.segment(7).pending_bytes == 0
    for i in range(4):
        commit(t, f"after-{i}")  # the space the abandoned puts held is free again
    t.validate()


def test_a_closed_connection_revokes_only_its_own_unsealed_puts(table):
    table.put_start("mine", MiB, 1, owner=1)
    table.put_start("sealed", MiB, 1, owner=1)
    table.put_end("sealed", 5)  # being committed: left to finish
    table.put_start("theirs", MiB, 1, owner=2)
    table.put_start("grpc", MiB, 1)
    assert table.revoke_owner(1) == ["mine"]
    table.commit_put_end("sealed")
    assert table.exists("sealed")
    assert table.revoke_owner(1) == []
    table.put_start("mine", MiB, 1)  # started again without a connection: not revoked later
    assert table.revoke_owner(1) == []
    table.put_revoke("mine")
    table.put_revoke("theirs")
    table.put_revoke("grpc")


@pytest.fixture
def fenced(clock: Clock):
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-a", 7)
    ack_all(t)  # the node took the mount reply
    yield t
    t.validate()


def ack_all(table: ObjectTable) -> list:
    fences = table.take_fences()
    for seg, floor, open_ in fences:
        table.fence_acked(seg, floor, open_)
    return fences


def test_no_put_goes_to_a_segment_before_its_node_took_this_runs_first_fence(clock):
    """Only a node that took this run's mount reply takes its fences (node/control.py): until
    one is acknowledged, a lost reply is possible and no write grant goes there."""
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=clock, fence_writes=True)
    mount(t, "node-a", 7)
    assert t.awaiting_first_fence() and t.awaiting_first_fence(["node-a"])
    assert not t.awaiting_first_fence(["node-z"])
    assert [c.value for _, c, _ in t.node_conditions()] == ["mounting"]  # what ListNodes says
    with pytest.raises(NoSpaceError, match="first write fence"):
        t.put_start("early", MiB, 1)
    [(seg, floor, open_)] = t.take_fences()  # the mount asks for a push
    mount(t, "node-b", 8)  # a second node: one taken fence does not stand for another
    t.fence_acked(seg, floor, open_)
    assert t.awaiting_first_fence()
    assert t.put_start("a", MiB, 1).placements[0][0].segment_id == 7
    t.put_revoke("a")
    [stale] = [f for f in t.take_fences() if f[0].segment_id == 8]
    mount(t, "node-b", 8, incarnation=2)  # mounted again: a push made before does not count
    t.fence_acked(*stale)
    assert t.awaiting_first_fence()
    ack_all(t)
    assert not t.awaiting_first_fence()
    assert [c.value for _, c, _ in t.node_conditions()] == ["valid", "valid"]
    assert t.put_start("b", MiB, 1).placements
    t.validate()


def test_a_revoked_puts_extent_waits_for_its_write_grants_to_be_fenced(fenced):
    first = fenced.put_start("revoked", MiB, 1)
    fenced.put_start("writing", MiB, 1)
    fenced.put_revoke("revoked")
    offset = first.placements[0][1].offset
    again = fenced.put_start("next", MiB, 1)  # the revoked grant may still work: not reused
    assert again.placements[0][1].offset != offset
    fenced.validate()
    [(_, floor, open_)] = ack_all(fenced)
    assert floor == again.generation + 1
    assert first.generation not in open_ and again.generation in open_
    assert fenced.take_fences() == []  # nothing ended since
    reused = fenced.put_start("reuse", MiB, 1)
    assert reused.placements[0][1].offset == offset  # fenced: the extent is free again


def test_a_held_free_happens_once_the_grant_expired_without_a_fence(fenced, clock):
    out = fenced.put_start("k", MiB, 1)
    fenced.put_revoke("k")  # a write of it may still be on its way: the extent is held
    assert fenced.segment(7).allocator.used_bytes == MiB
    clock.now += 30 + 2.5  # the grant's expiry and slack passed: the node refuses it anyway
    assert fenced.heartbeat("node-a", 1)
    fenced.tick()
    assert fenced.segment(7).allocator.used_bytes == 0
    assert out.generation


def test_a_removed_key_leaves_no_memory_behind(clock):
    """Put, read and remove many keys twice over: the second round grows nothing (slots are
    reused, a remove is no eviction for the policy's ghost table, leases end)."""
    t = ObjectTable(TableConfig(), clock=clock, policy=make_policy("weighted"))
    node = NodeInfo("node-a", 1, "a:data", "shm-a", "a:ctl", b"k" * 32)
    t.mount(node, [(SegmentInfo(node, 7, Tier.DRAM, 64 * MiB), None)])

    def cycle(prefix: str, n: int = 2000) -> None:
        keys = [f"{prefix}/{i:06d}/" + "x" * 64 for i in range(n)]
        for k in keys:
            t.put_start(k, 512, 1)
            t.put_end(k, 1)
            t.commit_put_end(k)
            t.read(k)
        for k in keys:
            t.remove(k)
        clock.now += 6  # the read leases end
        assert t.heartbeat("node-a", 1)
        t.tick()
        t.take_dirty()
        t.read_keys.clear()  # what the tiering planner drains every tick
        commit(t, f"{prefix}/one-more", size=512)  # compacts the policy's stale heap entries
        t.remove(f"{prefix}/one-more")

    cycle("warm")
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    cycle("again")
    gc.collect()
    grown = sum(s.size_diff for s in tracemalloc.take_snapshot().compare_to(before, "filename"))
    tracemalloc.stop()
    assert t.policy.ghost_size() == 0  # type: ignore[attr-defined]
    assert grown / 2000 < 64, f"{grown / 2000:.0f} bytes left per removed key"
    t.validate()


class Wall:
    """A wall clock that follows `clock` at `offset` seconds, stepped by the test."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.offset = clock, 1_700_000_000.0

    def __call__(self) -> float:
        return self.clock.now + self.offset


def wall_stepped(clock: Clock, ttl_s: float = 10.0) -> tuple[ObjectTable, Wall, OffsetLog]:
    """A fenced table whose grant expiries are signed by a wall clock the test steps."""
    wall = Wall(clock)
    offsets = OffsetLog(monotonic=clock, wall=wall)
    config = TableConfig(put_timeout_s=30, heartbeat_ttl_s=ttl_s)
    t = ObjectTable(config, clock=clock, fence_writes=True, signed_offsets=offsets)
    mount(t, "node-a", 7)
    ack_all(t)
    return t, wall, offsets


def test_a_step_back_of_the_wall_clock_is_not_followed_so_no_grant_comes_back(clock, caplog):
    """Nodes check a write grant's expiry against their reading of the master's clock.  Were
    that clock to go back 100 s, a grant would work on them 100 s longer, even after the master
    gave its extent to another put; so the master's clock never goes back."""
    t, wall, offsets = wall_stepped(clock)
    out = t.put_start("k", MiB, 1)
    expiry_ms = offsets.expiry_ms(out.deadline_s)  # what the servicer signs into its grant
    t.put_revoke("k")
    clock.now = out.deadline_s + FENCE_SLACK_S + 0.01
    assert t.heartbeat("node-a", 1)
    t.tick()
    assert t.segment(7).allocator.used_bytes == 0  # held free: the grant expired
    reuse = t.put_start("next", MiB, 1)
    assert reuse.placements[0][1].offset == out.placements[0][1].offset
    wall.offset -= 100  # after the release: must not bring the grant back to life
    assert offsets.published_ms() > expiry_ms  # what the node's next reading says
    assert offsets.now_s() * 1000 > expiry_ms  # and a control request's stamp
    assert offsets.ignored_back_s == pytest.approx(100)
    assert "the wall clock went back 100.0 s" in caplog.text
    later = offsets.expiry_ms(clock.now + 30)  # grants go on from the clock before the step
    assert later == int((clock.now + 30 + wall.offset + 100) * 1000)
    wall.offset += 150  # a step forward (past the old clock) is followed
    assert offsets.published_ms() == int((clock.now + wall.offset) * 1000)


def test_a_node_whose_reading_is_from_before_a_step_forward_holds_the_free(clock):
    """A grant signed after a step forward of 100 s expires 100 s later by the node's reading
    from before the step, which a node may hold up to a heartbeat TTL (it refuses writes with
    an older one): its extent is held until no such reading can be left (or the node takes a
    fence).  That matters where the TTL outlasts the put timeout (60 s and 30 s here); with a
    shorter one, any reading a node still writes under is from after the grant was signed."""
    t, wall, offsets = wall_stepped(clock, ttl_s=60)
    clock.now += 5
    offsets.published_ms()  # the node's reading
    wall.offset += 100
    out = t.put_start("k", MiB, 1)
    expiry_ms = offsets.expiry_ms(out.deadline_s)
    t.put_revoke("k")
    clock.now = out.deadline_s + FENCE_SLACK_S + 0.01
    assert t.heartbeat("node-a", 1)  # heard from; its reply, slow or lost, never taken
    t.tick()
    assert t.segment(7).allocator.used_bytes == MiB
    assert (clock.now + wall.offset - 100) * 1000 < expiry_ms  # by the node's old reading
    offsets.published_ms()  # readings go on, from the new clock
    clock.now += 30  # the old reading is past any node's limit (60 s)
    offsets.published_ms()
    assert t.heartbeat("node-a", 1)
    t.tick()
    assert t.segment(7).allocator.used_bytes == 0


@pytest.mark.parametrize("how", ["write failed", "commit failed"])
def test_a_leased_put_counts_from_its_lease_being_minted(clock, how):
    """A lease's grant is signed when it is minted; the put that uses it (and so becomes the
    object, created then) may end without a commit long after (a heartbeat TTL of 60 s: see
    the test above)."""
    t, wall, offsets = wall_stepped(clock, ttl_s=60)
    clock.now += 5
    offsets.published_ms()  # the node's reading, from before the step
    wall.offset += 100
    [(lease, outcome)] = grant_leases(t, MiB, 1, 1, owner=0)
    offsets.expiry_ms(outcome.deadline_s)  # what the servicer signs when minting
    clock.now += 5  # the lease is used 5 s later
    if how == "write failed":  # its write may still be on its way
        with pytest.raises(ReplicaUnavailableError):
            put_leased(t, lease, "k", MiB, 42, failed_segments=(7,))
    else:  # sealed, then its durable write failed: the servicer revokes it
        put_leased(t, lease, "k", MiB, 42)
        t.put_revoke("k")
    clock.now = outcome.deadline_s + FENCE_SLACK_S + 5.01  # past the monotonic hold
    assert t.heartbeat("node-a", 1)
    t.tick()
    assert t.segment(7).allocator.used_bytes == MiB  # the old reading may still be held
    offsets.published_ms()
    clock.now += 30  # the old reading is past any node's limit (60 s)
    assert t.heartbeat("node-a", 1)
    t.tick()
    assert t.segment(7).allocator.used_bytes == 0


def test_the_offset_log_stays_small_and_never_answers_less_than_the_truth(clock):
    wall = Wall(clock)
    offsets = OffsetLog(monotonic=clock, wall=wall, keep_s=60)
    assert offsets.behind(10)(0, clock.now) == 0.0  # nothing signed
    offsets.published_ms()
    offsets.expiry_ms(clock.now + 30)
    wall.offset += 20
    offsets.expiry_ms(clock.now + 30)
    assert offsets.behind(10)(clock.now, clock.now + 30) == pytest.approx(20)
    assert offsets.behind(10)(clock.now + 1, clock.now + 30) == 0.0  # nothing signed then
    for _ in range(300):  # five minutes of grants and readings, one a second
        clock.now += 1
        offsets.expiry_ms(clock.now + 30)
        offsets.published_ms()
    assert len(offsets._signed) <= 2 * 60 + 1 and len(offsets._published) <= 2 * 60 + 1
    # The first seconds are folded into the floors: still answered, never less.
    assert offsets.behind(400)(1000, 1001) == pytest.approx(20)  # its second had both
    assert offsets.behind(400)(clock.now - 10, clock.now) == pytest.approx(20)
    assert offsets.behind(10)(clock.now - 10, clock.now) == 0.0
    fresh = OffsetLog(monotonic=clock, wall=wall)
    fresh.published_ms()
    fresh.expiry_ms(clock.now + 30)
    wall.offset -= 1e-6  # the clocks' jitter is no step: answered without a look at the log
    assert fresh.behind(10) is clock_module._NOT_BEHIND


def test_the_offset_log_is_safe_across_threads():
    """Heartbeat replies note readings on the liveness server's threads while the master's
    tick asks `behind` on its loop."""
    now = [1000.0]
    offsets = OffsetLog(monotonic=lambda: now[0], wall=lambda: now[0] + 5.0)
    stop = threading.Event()
    errors: list[BaseException] = []

    def publish() -> None:
        try:
            while not stop.is_set():
                now[0] += 1.0  # a new second each reading
                offsets.published_ms()
                offsets.expiry_ms(now[0] + 30)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=publish) for _ in range(2)]
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            offsets.behind(1e6)(0, now[0])
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        sys.setswitchinterval(old)
    assert errors == []
