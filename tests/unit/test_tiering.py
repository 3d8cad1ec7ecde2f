"""Tier movement planning on the object table: demotion, promotion, drops, reconciliation."""

from __future__ import annotations

import pytest

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.master.eviction import LruPolicy
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.releases import BlockName
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from mooncake_store.master.tiering import TierConfig, Tiering

MiB = 1 << 20
DRAM, NVME = 10, 20


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(dram=4 * MiB, nvme=8 * MiB, inventory=None, incarnation=1, table=None, clock=None):
    clock = clock or Clock()
    table = table or ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    node = NodeInfo("n", incarnation, "n:data", "shm", "n:control", b"k" * 32)
    table.mount(
        node,
        [
            (SegmentInfo(node, DRAM, Tier.DRAM, dram), None),
            (SegmentInfo(node, NVME, Tier.NVME, nvme), inventory or []),
        ],
    )
    return table, tiering_of(table), clock


def tiering_of(table):
    return Tiering(
        table,
        TierConfig(
            dram_high_watermark=0.9,
            dram_low_watermark=0.75,
            nvme_high_watermark=0.9,
            nvme_low_watermark=0.5,
            promote_after_reads=2,
        ),
    )


def commit(table, key, size=MiB, checksum=7):
    table.put_start(key, size)
    table.put_end(key, checksum)
    table.commit_put_end(key)


class NodeIndex:
    """A node's NVMe index as node/nvme.py `release` treats it: a release forgets the entry at
    its offset only while it names that block; every release sent is answered OK."""

    def __init__(self, blocks=()):
        self.blocks = {b.offset: b for b in blocks}

    def deliver(self, table):
        for segment_id, blocks in table.take_released().items():
            for offset, name in blocks:
                held = self.blocks.get(offset)
                if held is not None and (held.key, held.checksum) == tuple(name):
                    del self.blocks[offset]
            table.release_done(segment_id, [offset for offset, _ in blocks])

    def inventory(self):
        return list(self.blocks.values())


def released(table):
    """The offsets of the releases `take_released` sends now, per segment."""
    return {sid: [offset for offset, _ in blocks] for sid, blocks in table.take_released().items()}


def tiers(table, key):
    return sorted(table.segment(r.segment_id).tier.value for r in table.get(key).replicas)


def test_dram_above_high_watermark_demotes_lowest_value_blocks():
    table, tiering, _ = make()
    for i in range(4):
        commit(table, f"k{i}")  # 100% full
    tasks = tiering.plan()
    assert [t.key for t in tasks] == ["k0"]  # 4 MiB -> 3 MiB = the low watermark
    assert table.get("k0").moving and not table.evictable("k0")
    assert table.get("k0").replicas  # still readable from DRAM meanwhile
    # The server gives a node with moves in flight no new batch; planned anyway, k0 (moving)
    # is not planned a second time.
    assert tiering.plan(busy={"n"}) == []
    again = tiering.plan()
    assert again and "k0" not in [t.key for t in again]
    assert tiering.complete(tasks[0], ok=True)
    assert tiers(table, "k0") == ["NVME"]
    assert table.segment(DRAM).allocator.used_bytes == 3 * MiB
    assert [m.key for m in table.take_dirty().puts] == ["k0"]
    table.validate()


def test_failed_or_stale_moves_give_the_destination_back():
    """Once the node took the release of the copy (it may have indexed it): a persistent
    extent is given back only then."""
    table, tiering, _ = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    assert not tiering.complete(task, ok=False)
    assert tiers(table, "k0") == ["DRAM"] and table.segment(NVME).allocator.used_bytes == MiB
    table.validate()
    NodeIndex().deliver(table)
    assert table.segment(NVME).allocator.used_bytes == 0
    (task,) = tiering.plan()
    table.remove(task.key)  # removed while being copied
    assert not tiering.complete(task, ok=True)
    assert released(table) == {NVME: [0]}  # the node forgets the copy
    table.release_done(NVME, [0])
    assert table.segment(NVME).allocator.used_bytes == 0
    table.validate()


def test_no_block_goes_to_an_offset_whose_release_is_unanswered():
    """A release that reaches the node late must never meet a newer block at its offset: the
    extent stays allocated until the node answered (found by review of 23631a0: a Move into
    the offset that failed left the removed block indexed, and it came back)."""
    table, tiering, _ = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    assert tiering.complete(task, ok=True) and tiers(table, "k0") == ["NVME"]
    table.remove("k0")  # its NVMe extent at 0: released, not yet answered
    commit(table, "k4")  # DRAM above the high watermark again
    (again,) = tiering.plan()
    assert again.dst_offset == MiB  # not 0
    table.release_again(NVME, [])  # nothing sent yet: nothing changes
    assert released(table) == {NVME: [0]}
    table.release_again(NVME, [0])  # refused: still held, sent again
    assert released(table) == {NVME: [0]}
    table.release_done(NVME, [0])
    assert tiering.complete(again, ok=True)
    commit(table, "k5")
    (third,) = tiering.plan()
    assert third.dst_offset == 0  # answered: free again
    table.validate()


def test_a_failed_move_into_a_released_offset_leaves_nothing_indexed():
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, tiering, clock = make(inventory=held)
    node = NodeIndex(held)
    table.remove("x0")
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    assert task.dst_offset != 0
    assert not tiering.complete(task, ok=False)  # node error or timeout before indexing
    node.deliver(table)
    assert 0 not in node.blocks
    make(inventory=node.inventory(), incarnation=2, table=table, clock=clock)
    assert not table.exists("x0")
    table.validate()


def test_a_node_mounted_again_before_its_release_went_does_not_bring_the_key_back():
    """Removed, and its node restarts before the Release reached it: the inventory still
    lists the block, and the master releases it again instead of adopting it."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, _ = make(inventory=held)
    table.remove("x1")
    assert released(table) == {NVME: [MiB]}  # sent; the node goes away before it lands
    make(inventory=held, incarnation=2, table=table)  # its index: x0, x1, x2
    assert table.exists("x0") and table.exists("x2") and not table.exists("x1")
    assert released(table) == {NVME: [MiB]}  # told again
    table.validate()


def test_a_release_queued_while_its_node_is_away_waits_for_its_next_mount():
    """Removed while its node is gone (unmounted, or dropped as silent) before the tick sent
    the Release: the tick keeps it, and the next mount releases it rather than adopting the
    block its inventory still lists (found by review of 2b75a68)."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, _ = make(inventory=held)
    table.remove("x1")
    table.unmount("n", 1)
    assert released(table) == {}  # nothing to send it to
    make(inventory=held, incarnation=2, table=table)
    assert not table.exists("x1") and table.exists("x0") and table.exists("x2")
    assert released(table) == {NVME: [MiB]}
    table.validate()


def test_a_release_that_failed_as_its_node_went_away_waits_for_its_next_mount():
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, _ = make(inventory=held)
    table.remove("x1")
    sent = released(table)
    assert sent == {NVME: [MiB]}
    table.unmount("n", 1)  # gone while the Release was in flight
    table.release_again(NVME, sent[NVME])  # ... which failed
    assert released(table) == {}
    make(inventory=held, incarnation=1, table=table)  # the same process mounts again
    assert not table.exists("x1")
    assert released(table) == {NVME: [MiB]}
    table.validate()


def test_a_block_removed_under_a_read_lease_is_released_when_its_node_restarts():
    """Its free waits for the lease (`_deferred`); the node restarts meanwhile: the new mount
    releases it rather than adopting it (the deferred free is the old mount's, skipped)."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, clock = make(inventory=held)
    table.read("x1")  # a reader holds a lease on it
    table.remove("x1")
    assert released(table) == {}  # not freed yet
    make(inventory=held, incarnation=2, table=table)
    assert not table.exists("x1")
    assert released(table) == {NVME: [MiB]}
    clock.now += 6  # past the read lease
    table.heartbeat("n", 2)
    table.tick()
    assert not table.exists("x1") and released(table) == {}
    table.validate()


def test_a_release_names_the_block_it_removes():
    """The node forgets an index entry only while it still holds that block there (node/nvme.py
    `release`), so a late release cannot take a newer block at the same offset."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, _ = make(inventory=held)
    table.remove("x1")
    assert table.take_released() == {NVME: [(MiB, BlockName("x1", 101))]}


def restarted(table, clock):
    """A new master on `table`'s persisted state: its committed objects and owed releases."""
    dirty = table.take_dirty()
    again = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    again.restore(table.get(key) for key in list(table._slot))
    again.releases.restore((s, o, name) for s, o, name in dirty.releases if name is not None)
    again.detached.restore((s, o, name) for s, o, name in dirty.detached if name is not None)
    again.persistent_ids = set(table.persistent_ids)
    return again


def test_a_master_restarted_before_its_release_landed_does_not_bring_the_key_back():
    """The release is owed in RocksDB with the delete: the new master releases the block its
    node still lists instead of adopting it (it did, while the queue lived in memory only)."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, clock = make(inventory=held)
    table.remove("x1")
    assert released(table) == {NVME: [MiB]}  # sent; the master stops before the reply
    again = restarted(table, clock)
    make(inventory=held, incarnation=2, table=again, clock=clock)
    assert again.exists("x0") and again.exists("x2") and not again.exists("x1")
    assert again.take_released() == {NVME: [(MiB, BlockName("x1", 101))]}
    again.validate()


def test_a_block_removed_while_its_segment_is_not_back_is_released_at_its_mount():
    """After a restart, an object whose NVMe segment has not mounted yet is removed: the mount
    that follows releases the block rather than adopting it."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, clock = make(inventory=held)
    again = restarted(table, clock)
    again.remove("x1")  # its only replica lies in a segment not mounted here yet
    assert [r[:2] for r in again.take_dirty().releases] == [(NVME, MiB)]
    make(inventory=held, incarnation=2, table=again, clock=clock)
    assert again.exists("x0") and not again.exists("x1")
    assert released(again) == {NVME: [MiB]}
    again.validate()


def test_an_owed_release_that_the_inventory_or_a_record_contradicts_ends():
    """At a mount, an owed release whose block the node no longer lists there ends, and so does
    one whose block a restored object's record names (that record is the newer word)."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, _, clock = make(inventory=held)
    again = restarted(table, clock)
    again.releases.restore([(NVME, 0, BlockName("x0", 100)), (NVME, 2 * MiB, BlockName("x2", 9))])
    make(inventory=held, incarnation=2, table=again, clock=clock)
    assert again.exists("x0") and tiers(again, "x0") == ["NVME"] and again.exists("x2")
    assert released(again) == {} and len(again.releases) == 0
    assert sorted(r[:2] for r in again.take_dirty().releases) == [(NVME, 0), (NVME, 2 * MiB)]
    again.validate()


def test_a_key_removed_under_a_read_lease_after_a_release_in_flight_stays_removed():
    """x0's release is in flight when k0 goes down to NVMe and is removed under a read lease:
    the late answer to x0's release must not end k0's (review of 23631a0)."""
    held = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(3)]
    table, tiering, clock = make(inventory=held)
    node = NodeIndex(held)
    table.remove("x0")
    in_flight = table.take_released()
    assert in_flight == {NVME: [(0, BlockName("x0", 100))]}
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    assert tiering.complete(task, ok=True)
    node.blocks[task.dst_offset] = BlockRecord("k0", task.dst_offset, MiB, 7)  # the Move
    table.read("k0")
    table.remove("k0")
    del node.blocks[0]
    table.release_done(NVME, [0])  # x0's late answer
    clock.now += 10
    table.heartbeat("n", 1)
    table.tick()  # the read lease ended
    node.deliver(table)
    make(inventory=node.inventory(), incarnation=2, table=table, clock=clock)
    assert not table.exists("k0") and not table.exists("x0")
    table.validate()


def test_a_key_removed_while_its_move_down_is_in_flight_stays_removed_after_a_restart():
    """The remove's records name the copy on its way into NVMe (review of 23631a0: the node
    finished the Move, the master restarted before the copy's release was recorded, and the
    next run adopted the removed key)."""
    table, tiering, clock = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()  # k0: DRAM -> NVMe, in flight
    durable = table.releases_of(table.check_removable("k0"))  # written with the delete
    table.remove("k0")
    again = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    again.restore(table.get(k) for k in ("k1", "k2", "k3"))
    again.releases.restore(r for r in durable if r[2] is not None)
    make(inventory=[BlockRecord("k0", task.dst_offset, MiB, 7)], incarnation=2, table=again,
         clock=clock)  # fmt: skip
    assert not again.exists("k0")
    assert released(again) == {NVME: [task.dst_offset]}
    assert not tiering.complete(task, ok=True)  # the first run's copy ends: released too
    assert table.releases.owed(NVME, task.dst_offset) == BlockName("k0", 7)


def two_nodes(clock):
    """K on n's NVMe (adopted from its inventory) and copied to m's DRAM."""
    table = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
    block = BlockRecord("K", 0, MiB, 5)
    table.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [block])])
    m = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
    table.mount(m, [(SegmentInfo(m, 30, Tier.DRAM, 8 * MiB), None)])
    source, offset = table.begin_move("K", table.segment(NVME), table.segment(30))
    assert table.finish_copy("K", source, table.segment(30), offset, ok=True)
    return table, block


def back(table, block, incarnation=2):
    n = NodeInfo("n", incarnation, "n:data", "shm", "n:control", b"k" * 32)
    table.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [block])])


def test_a_key_removed_while_its_nvme_node_was_dropped_does_not_come_back():
    """The node is dropped (unmounted; a silent node's expiry is the same path) while K lives
    on in DRAM; K is removed; the node mounts again with K still indexed: released, not
    adopted (review of 23631a0).  Not removed, K takes its NVMe copy back as a replica."""
    clock = Clock()
    table, block = two_nodes(clock)
    table.unmount("n", 1)
    assert table.detached.of_key("K") == [(NVME, 0, BlockName("K", 5))]
    table.remove("K")
    back(table, block)
    assert not table.exists("K")
    assert released(table) == {NVME: [0]}
    table.validate()

    table, block = two_nodes(clock)
    table.unmount("n", 1)
    back(table, block)
    assert tiers(table, "K") == ["DRAM", "NVME"] and len(table.detached) == 0
    table.validate()


def test_a_key_removed_while_its_nvme_node_was_dropped_stays_removed_across_a_restart():
    clock = Clock()
    table, block = two_nodes(clock)
    table.unmount("n", 1)
    again = restarted(table, clock)
    again.remove("K")
    back(again, block)
    assert not again.exists("K") and released(again) == {NVME: [0]}


def test_releases_owed_to_a_dram_segment_that_never_comes_back_end_with_the_restore_grace():
    """After a restart a key whose replica lies in a DRAM segment not mounted yet is removed:
    a release is owed, as the segment's tier is not known.  A restarted node's DRAM segment
    never mounts again (its id is new): the record ends when the restore grace does (review
    of 23631a0).  One owed to a known NVMe segment waits for it."""
    table, _, clock = make()
    commit(table, "k")
    held = [BlockRecord("x", 0, MiB, 9)]
    node = NodeInfo("p", 1, "p:data", "shm", "p:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, 40, Tier.NVME, 8 * MiB), held)])
    again = restarted(table, clock)
    again.persistent_ids = {NVME, 40}  # as persisted (persistence.py `s/` records)
    again.remove("k")
    again.remove("x")
    assert sorted(r[:2] for r in again.take_dirty().releases) == [(10, 0), (40, 0)]
    n = NodeInfo("n", 2, "n:data", "shm", "n:control", b"k" * 32)
    again.mount(n, [(SegmentInfo(n, 11, Tier.DRAM, 4 * MiB), None),
                    (SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [])])  # fmt: skip
    clock.now += TableConfig().restore_grace_s + 1
    again.heartbeat("n", 2)
    again.tick()
    assert again.releases.segments() == [40]
    again.mount(node, [(SegmentInfo(node, 40, Tier.NVME, 8 * MiB), held)])
    assert not again.exists("x") and released(again) == {40: [0]}


def test_a_demotion_to_a_tier_mounted_a_moment_ago_waits_instead_of_evicting():
    """A node mounted again holds its room back for a moment (membership.py REMOUNT_HOLD_S).
    A demotion planned meanwhile evicted its DRAM source instead (begin_move refused the
    held NVMe tier): with two replicas, every block demoted there silently lost one, and the
    chaos harness (--nvme) then lost 67 acknowledged blocks when a node died.  It waits now."""
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    node = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
    segments = [(SegmentInfo(node, DRAM, Tier.DRAM, 4 * MiB), None),
                (SegmentInfo(node, NVME, Tier.NVME, 8 * MiB), [])]  # fmt: skip
    table.mount(node, segments, remount=True)
    table.fence_acked(table.segment(DRAM), 0, frozenset())  # its first write fence is in
    clock.now += 1  # the DRAM hold is over ...
    for i in range(4):
        commit(table, f"k{i}")
    table.segment(NVME).writable_after = clock.now + 0.3  # ... the NVMe tier's not yet
    tiering = tiering_of(table)
    assert tiering.plan() == [] and table.counters["evictions"] == 0
    assert all(table.exists(f"k{i}") for i in range(4))
    clock.now += 0.5
    (task,) = tiering.plan()
    assert task.dst.segment_id == NVME and table.counters["evictions"] == 0
    table.validate()


def test_a_demotion_to_a_held_nvme_tier_evicts_nothing_there_either():
    """A held NVMe tier without room: making room there for a demotion that cannot start this
    tick dropped its blocks for nothing (found by review of b4cb341)."""
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    node = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
    inventory = [BlockRecord(f"nv{i}", i * MiB, MiB, 5) for i in range(7)]  # 7/8: below 0.9
    segments = [(SegmentInfo(node, DRAM, Tier.DRAM, 4 * MiB), None),
                (SegmentInfo(node, NVME, Tier.NVME, 8 * MiB), inventory)]  # fmt: skip
    table.mount(node, segments, remount=True)
    table.fence_acked(table.segment(DRAM), 0, frozenset())
    clock.now += 1
    for i in range(2):
        commit(table, f"k{i}", size=2 * MiB)
    table.segment(NVME).writable_after = clock.now + 0.3
    assert tiering_of(table).plan() == [] and table.counters["evictions"] == 0
    table.validate()


def test_corrupt_source_is_dropped():
    table, tiering, _ = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    tiering.complete(task, ok=False, corrupt=True)
    assert table.get(task.key) is None
    table.validate()


def test_blocks_read_from_nvme_are_promoted():
    table, tiering, clock = make(dram=8 * MiB)
    for i in range(8):
        commit(table, f"k{i}")
    for task in tiering.plan():
        tiering.complete(task, ok=True)
    demoted = [f"k{i}" for i in range(8) if tiers(table, f"k{i}") == ["NVME"]]
    assert demoted and table.segment(DRAM).fill <= 0.75
    key = demoted[0]
    table.get_replicas(key)
    assert all(t.key != key for t in tiering.plan())  # one read is not enough
    clock.now += 10
    table.get_replicas(key)
    clock.now += 10
    promotions = [t for t in tiering.plan() if t.key == key]
    assert promotions and promotions[0].promotion
    tiering.complete(promotions[0], ok=True)
    assert tiers(table, key) == ["DRAM"] and tiering.counters["promotions"] == 1
    table.validate()


def test_full_nvme_drops_its_lowest_value_blocks():
    table, tiering, _ = make(dram=4 * MiB, nvme=4 * MiB)
    for i in range(4):
        commit(table, f"k{i}")
        for task in tiering.plan():
            tiering.complete(task, ok=True)
    for i in range(4, 10):
        commit(table, f"k{i}")
        for task in tiering.plan():
            tiering.complete(task, ok=True)
        NodeIndex().deliver(table)  # the tick's releases, answered
    assert tiering.plan() == []  # a tick with no demotion drops NVMe below its watermark
    NodeIndex().deliver(table)
    nvme = table.segment(NVME)
    assert nvme.fill <= 0.9
    assert tiering.counters["nvme_drops"] + table.counters["evictions"] > 0
    assert table.object_count() < 10
    table.validate()


def test_node_without_nvme_never_demotes():
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock)
    node = NodeInfo("d", 1, "d:data", "shm", "d:control", b"k" * 32)
    table.mount(node, [(SegmentInfo(node, 1, Tier.DRAM, 2 * MiB), None)])
    tiering = Tiering(table, TierConfig())
    commit(table, "a")
    commit(table, "b")
    assert tiering.plan() == [] and table.object_count() == 2


def test_inventory_is_adopted_and_reconciled():
    inventory = [
        BlockRecord("survivor", 0, 5000, 11, b"fp", "parent", b"tag"),
        BlockRecord("other", 8192, 100, 12),
    ]
    table, _, _ = make(inventory=inventory)
    meta = table.get("survivor")
    assert meta.checksum == 11 and meta.fingerprint == b"fp" and meta.tag == b"tag"
    assert tiers(table, "survivor") == ["NVME"] and table.exists("other")
    assert {m.key for m in table.take_dirty().puts} == {"survivor", "other"}
    assert table.counters["objects_adopted"] == 2
    # The node restarts: a new incarnation; "other" no longer passes its checksum on disk.
    make(inventory=[inventory[0]], incarnation=2, table=table)
    assert table.exists("survivor") and not table.exists("other")
    assert table.take_dirty().deletes == ["other"]
    table.validate()


def test_inventory_conflicting_with_a_known_object_is_released():
    table, _, _ = make()
    commit(table, "k", checksum=1)
    node = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
    table.mount(
        node, [(SegmentInfo(node, 30, Tier.NVME, 4 * MiB), [BlockRecord("k", 0, MiB, 999)])]
    )
    assert tiers(table, "k") == ["DRAM"]  # the stale copy on "m" is not trusted
    assert released(table) == {30: [0]}


def test_watermark_config_is_validated():
    from mooncake_store.common.errors import InvalidArgumentError
    from mooncake_store.master.config import MasterConfig

    with pytest.raises(InvalidArgumentError, match="watermark"):
        MasterConfig(dram_low_watermark=0.95, dram_high_watermark=0.9)
    with pytest.raises(InvalidArgumentError, match="--eviction-policy"):
        MasterConfig(eviction_policy="fifo")


def test_hot_blocks_move_up_to_the_gpu_tier_and_back_down():
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    node = NodeInfo("g", 1, "g:data", "shm", "g:control", b"k" * 32)
    table.mount(
        node,
        [
            (SegmentInfo(node, 1, Tier.DRAM, 8 * MiB), None),
            (SegmentInfo(node, 2, Tier.GPU, 2 * MiB), None),
        ],
    )
    tiering = Tiering(
        table, TierConfig(gpu_promote_after_reads=3, gpu_high_watermark=0.9, gpu_low_watermark=0.5)
    )
    for key in ("hot", "warm", "cold", "hotter"):
        commit(table, key)
    for _ in range(3):
        table.get_replicas("hot")
        table.get_replicas("hotter")
    table.get_replicas("warm")
    tasks = tiering.plan()
    assert sorted(t.key for t in tasks) == ["hot", "hotter"] and all(t.promotion for t in tasks)
    for task in tasks:
        tiering.complete(task, ok=True)
    assert tiers(table, "hot") == ["GPU"] and tiers(table, "warm") == ["DRAM"]
    clock.now += 10  # leases over: the full GPU tier (2 of 2 MiB) demotes down to 50%
    (down,) = tiering.plan()
    assert down.dst.tier is Tier.DRAM and not down.promotion
    tiering.complete(down, ok=True)
    assert sorted(tiers(table, k)[0] for k in ("hot", "hotter")) == ["DRAM", "GPU"]
    table.validate()
