"""More orders that broke the releases of persistent blocks, as of cff3275 (found by a third
adversarial review; each test failed then): a demotion evicted instead of waiting for room
that comes back with a Release, a Move planned for a mount gone during the tick's write, an
answer taken for the wrong mount, removes acknowledged while their key was lost, adopted back
or put again, a tick failing before its write, a failed Move of a key put again since, and a
data directory from before persistent segments were recorded, restarted twice."""

from __future__ import annotations

import asyncio
import dataclasses

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.blocks import BlockRecord
from mooncake_store.master.eviction import LruPolicy
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.releases import BlockName
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from tests.unit.test_release_orderings import hold_after_delete, master_on
from tests.unit.test_tiering import DRAM, NVME, Clock, MiB, commit, make, released


def test_a_demotion_whose_nvme_room_comes_back_with_a_release_is_not_evicted_instead():
    """NVMe full, nothing held: `_demote` asks make_room, which evicts one NVMe block (now held
    for its Release) and then returns False (victims.py: releasing_bytes >= extent).  `_demote`
    ignores that and evicts the DRAM block it meant to demote: both blocks are gone although the
    room comes back at the next tick (the commit meant such a demotion to wait a tick)."""
    blocks = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(8)]
    table, tiering, _ = make(nvme=8 * MiB, inventory=blocks)
    table.tick()
    for i in range(4):
        commit(table, f"k{i}")  # DRAM 100%: k0 is to go down, NVMe has no room
    tiering.config = dataclasses.replace(tiering.config, nvme_high_watermark=1.0)  # no _drop_to
    tasks = tiering.plan()
    assert tasks or table.exists("k0"), "k0 was evicted from DRAM instead of demoted"


class FakeNode:
    """A node's control service as far as Move and Release go: a Move into NVMe indexes the
    block at its offset (node/control.py `_move_all`), a Release forgets a block only while
    its offset holds that block (node/nvme.py `release`)."""

    def __init__(self, nvme_segment: int) -> None:
        self.nvme_segment = nvme_segment
        self.index: dict[int, BlockRecord] = {}
        self.moves: list[tuple[int, int, str]] = []

    async def Move(self, request, timeout=None, metadata=None):
        for t in request.tasks:
            self.moves.append((t.dst_segment, t.dst_offset, t.key))
            if t.dst_segment == self.nvme_segment:
                self.index[t.dst_offset] = BlockRecord(
                    t.key, t.dst_offset, t.size_bytes, t.checksum
                )
        return pb.MoveResponse(statuses=[pb.Status(code=0)] * len(request.tasks))

    async def Release(self, request, timeout=None, metadata=None):
        if request.segment_id == self.nvme_segment:
            for b in request.blocks:
                held = self.index.get(b.offset)
                if held is not None and (held.key, held.checksum) == (b.key, b.checksum):
                    del self.index[b.offset]
        return pb.Status(code=0)

    async def FenceWrites(self, request, timeout=None, metadata=None):
        return pb.Status(code=0)


def _put(table, key, replicas=1, nodes=("n",), checksum=7):
    table.put_start(key, MiB, replicas, preferred_nodes=list(nodes))
    table.put_end(key, checksum)
    table.commit_put_end(key)


def test_a_move_planned_for_a_mount_that_went_during_the_ticks_write_is_not_sent(tmp_path):
    """The tick now plans its moves, then waits for the metadata writes (persist_dirty,
    persisted) and only then starts them.  A node that mounts again meanwhile (it restarted:
    MountSegment drops the old mount's moves and forgets its detached entries) is still sent
    the old mount's Move: it writes k0 into its NVMe at an offset the new mount never
    allocated, and indexes it.  No record names that block (the detached entry ended with the
    mount), so a remove of k0 owes nothing there, and the node's next mount adopts the removed
    key from its inventory."""

    async def run():
        async with master_on(tmp_path, tick_interval_s=3600.0) as server:
            table, store, servicer = server.table, server._store, server._servicer
            server.replication.plan = lambda busy=(): []
            server.drains.plan = lambda busy=(), budget=32: []
            server._first_fences = lambda *a, **k: []
            table.take_fences = lambda: []
            fake = FakeNode(NVME)
            server.mover._stub = lambda node_id: fake
            m = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
            table.mount(m, [(SegmentInfo(m, 30, Tier.DRAM, 8 * MiB), None)])
            n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            table.mount(
                n,
                [
                    (SegmentInfo(n, DRAM, Tier.DRAM, 4 * MiB), None),
                    (SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), []),
                ],
            )
            table._awaiting.clear()  # as if both took their first fence
            _put(table, "k0", replicas=2, nodes=("n", "m"))  # on n's DRAM and m's
            for i in range(1, 4):
                _put(table, f"k{i}")  # n's DRAM 100%: k0 (LRU) is to go down to n's NVMe
            await servicer.persist_dirty()

            gate = asyncio.Event()
            write = store.write

            async def slow(*args, **kwargs):
                await gate.wait()  # the tick's write: an fsync under load
                await write(*args, **kwargs)

            store.write = slow
            tick = asyncio.create_task(server._tick())
            await asyncio.sleep(0.02)
            assert any(t[0] == NVME for t in table._moves), "no move planned into NVMe"
            # n restarts and mounts again (MountSegment) while the tick waits for its write.
            n2 = dataclasses.replace(n, incarnation=2)
            table.mount(
                n2,
                [
                    (SegmentInfo(n2, 11, Tier.DRAM, 4 * MiB), None),
                    (SegmentInfo(n2, NVME, Tier.NVME, 8 * MiB), list(fake.index.values())),
                ],
            )
            gate.set()
            await tick
            await asyncio.sleep(0.05)  # the movers run
            store.write = write
            await servicer.persist_dirty()
            sent = list(fake.moves)
            (status,) = await servicer._remove(["k0"])
            assert status.code == 0 and not table.exists("k0")
            for _ in range(3):  # releases go out, answers come back
                await server._tick()
                await asyncio.sleep(0.02)
            n3 = dataclasses.replace(n, incarnation=3)  # n restarts again
            table.mount(
                n3,
                [
                    (SegmentInfo(n3, 12, Tier.DRAM, 4 * MiB), None),
                    (SegmentInfo(n3, NVME, Tier.NVME, 8 * MiB), list(fake.index.values())),
                ],
            )
            return sent, table.exists("k0")

    sent, back = asyncio.run(run())
    assert not back, f"the removed key came back (moves sent to the new mount: {sent})"


def test_an_answer_is_tied_to_the_mount_its_release_was_taken_for_not_sent_to():
    """mover.release reads a segment's generation when it gets to that segment, not when the
    tick took its releases: a release taken for mount 1 but sent (behind a slow node) after the
    segment mounted again is answered as mount 2's, and ends the release mount 2 has in flight
    at that offset (another block) though the node never got that one.  When that one then
    fails, nothing sends it again: the removed key comes back at the next mount."""
    from mooncake_store.master.mover import NodeMover

    async def run():
        held = [BlockRecord("x", 0, MiB, 100)]
        table, tiering, clock = make(inventory=held)
        m = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
        table.mount(m, [(SegmentInfo(m, 40, Tier.NVME, 8 * MiB), [BlockRecord("q", 0, MiB, 9)])])
        mover = NodeMover(table, tiering)
        gate = asyncio.Event()
        node_n = FakeNode(NVME)
        node_n.index = {0: held[0]}

        class SlowNode(FakeNode):
            async def Release(self, request, timeout=None, metadata=None):
                await gate.wait()
                return pb.Status(code=0)

        stubs = {"n": node_n, "m": SlowNode(40)}
        mover._stub = lambda node_id: stubs[node_id]
        table.remove("q")
        table.remove("x")
        first = table.take_released()
        assert list(first) == [40, NVME]  # m's first: n's waits behind it
        generations = {s: table.mounted_segment(s).generation for s in first}  # as the tick
        sending = asyncio.create_task(mover.release(first, generations))
        await asyncio.sleep(0.01)
        # n restarts; x failed its checksum at load, its node dropped it: not in the inventory.
        node_n.index = {}
        make(inventory=[], incarnation=2, table=table, clock=clock)
        clock.now += 1
        for i in range(4):
            commit(table, f"k{i}")
        (task,) = tiering.plan()
        assert task.dst_offset == 0
        await node_n.Move(
            pb.MoveRequest(
                tasks=[
                    pb.MoveTask(
                        key="k0", dst_segment=NVME, dst_offset=0, size_bytes=MiB, checksum=7
                    )
                ]
            )
        )
        assert tiering.complete(task, ok=True)
        table.remove("k0")
        assert released(table) == {NVME: [0]}  # k0's release, in flight to mount 2
        gate.set()
        await sending  # x's release reaches mount 2: the node keeps k0 and answers OK
        table.release_again(NVME, [0], table.segment(NVME).generation)  # k0's release failed
        assert released(table) == {NVME: [0]}, "k0's release is never sent again"

    asyncio.run(run())


def test_a_remove_acknowledged_while_its_key_was_lost_and_put_again_stays_removed(tmp_path):
    """As test_release_orderings' remove-while-lost test, but a put of the same key started
    while the remove's write was on its way: `removed_meanwhile` leaves the key be ("a key
    stored again"), so the removed block stays detached (its r/ record, written with the
    delete, is in RocksDB only).  The new object is lost with its own node later; n's next mount
    adopts the removed block: the acknowledged remove is undone (old bytes under the key)."""

    async def run():
        async with master_on(tmp_path, tick_interval_s=3600.0) as server:
            table, store, servicer = server.table, server._store, server._servicer
            n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            nvme = [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [BlockRecord("k", 0, MiB, 7)])]
            table.mount(n, nvme)
            m = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
            table.mount(m, [(SegmentInfo(m, 30, Tier.DRAM, 8 * MiB), None)])
            table._awaiting.clear()
            await servicer.persist_dirty()

            gate = hold_after_delete(store, "k")
            removing = asyncio.create_task(servicer._remove(["k"]))
            await asyncio.sleep(0.01)
            table.unmount("n", 1)  # k lost with n
            table.put_start("k", MiB)  # another client puts k again (on m)
            gate.set()
            (status,) = await removing
            assert status.code == 0  # the remove of k (checksum 7) is acknowledged
            table.put_end("k", 8)
            table.commit_put_end("k")
            table.unmount("m", 1)  # the new k is lost with m
            table.mount(n, nvme)  # n comes back, the removed block still indexed there
            meta = table.get("k") if table.exists("k") else None
            return None if meta is None else meta.checksum

    back = asyncio.run(run())
    assert back is None, f"the removed block (checksum {back}) came back under k"


def test_moves_planned_by_a_tick_that_fails_before_its_write_are_called_off(tmp_path):
    """The tick plans its moves, then its copies, then takes the releases, and only then enters
    the try whose finally starts or calls off the moves.  Anything raising in between (a
    planner's bug; the tick loop logs it and goes on) leaves the planned moves neither started
    nor called off: k0 stays `moving` for good (never evicted, moved or repaired again), its
    NVMe extent reserved and its detached record kept."""

    async def run():
        async with master_on(tmp_path, tick_interval_s=3600.0) as server:
            table, servicer = server.table, server._servicer
            server._first_fences = lambda *a, **k: []
            table.take_fences = lambda: []
            server.mover._stub = lambda node_id: FakeNode(NVME)
            n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            table.mount(
                n,
                [
                    (SegmentInfo(n, DRAM, Tier.DRAM, 4 * MiB), None),
                    (SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), []),
                ],
            )
            table._awaiting.clear()
            for i in range(4):
                _put(table, f"k{i}")
            await servicer.persist_dirty()

            def broken(busy=()):
                raise RuntimeError("a planner's bug")

            planned = server.replication.plan
            server.replication.plan = broken
            try:
                await server._tick()
            except RuntimeError:
                pass  # _tick_loop logs "master tick failed" and goes on
            server.replication.plan = planned
            for _ in range(3):
                await server._tick()
                await asyncio.sleep(0.02)
            return table.get("k0").moving, len(table._moves), len(table.detached)

    moving, moves, detached = asyncio.run(run())
    assert not moving and not moves and not detached, (
        f"k0 moving={moving}, {moves} moves and {detached} detached records left behind"
    )


def test_a_failed_move_of_a_removed_key_does_not_evict_the_key_put_again():
    """(Older than cff3275, but its window is now the tick's write plus the Move.)  k0's Move
    down is planned; k0 is removed (its DRAM extent freed at once: `moving` holds nothing) and
    put again, first fit giving it the same DRAM offset.  The node reads the new bytes against
    the old checksum and reports a mismatch: Tiering.complete(corrupt=True) evicts `task.source`
    from whatever object now has that key and replica, the new, acknowledged put."""
    table, tiering, _ = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    table.remove("k0")
    commit(table, "k0", checksum=8)
    assert task.source in table.get("k0").replicas  # the same DRAM extent
    tiering.complete(task, ok=False, corrupt=True)
    assert table.exists("k0"), "the new k0 was dropped as corrupt for the old one's Move"


def test_releases_recorded_before_s_records_survive_a_second_restart():
    """restore_persistent falls back to the segments owed releases only while *no* s/ record
    exists, and only in memory.  The first run on a 23631a0 data directory mounts another NVMe
    node (its s/ record is written); node n, owed a release, stays away.  The second run finds
    s/ records, takes n's segment for a DRAM one, ends its releases with the restore grace, and
    adopts the removed block when n comes back."""
    records = [(NVME, 0, BlockName("x", 100))]  # r/ records of 23631a0
    first = ObjectTable(TableConfig(), clock=Clock(), policy=LruPolicy())
    first.releases.restore(records)
    first.restore_persistent(set())  # no s/ records yet: NVME stands in
    a = NodeInfo("a", 1, "a:data", "shm", "a:control", b"k" * 32)
    first.mount(a, [(SegmentInfo(a, 99, Tier.NVME, 8 * MiB), [])])
    stored = set(first.take_dirty().segments)  # s/ records the first run wrote
    clock = Clock()
    again = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    again.releases.restore(records)
    again.restore_persistent(stored)
    clock.now += TableConfig().restore_grace_s + 1
    again.tick()
    n = NodeInfo("n", 2, "n:data", "shm", "n:control", b"k" * 32)
    again.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [BlockRecord("x", 0, MiB, 100)])])
    assert not again.exists("x"), "the removed key came back"


def test_a_remove_acknowledged_while_its_node_restarted_stays_removed(tmp_path):
    """k lives only on n's NVMe.  Remove(k) writes its delete (and the release of k's block);
    meanwhile n restarts: its mount drops the old mount (k lost) and adopts k again from the
    inventory, a new object (another created_s).  `_remove` finds same_object False and calls
    removed_meanwhile, which leaves a stored key be: the client is told k is removed, yet k is
    readable, and its adoption's record goes to RocksDB after the delete."""

    async def run():
        async with master_on(tmp_path, tick_interval_s=3600.0) as server:
            table, store, servicer = server.table, server._store, server._servicer
            n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            inventory = [BlockRecord("k", 0, MiB, 7)]
            table.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), inventory)])
            await servicer.persist_dirty()
            gate = hold_after_delete(store, "k")
            removing = asyncio.create_task(servicer._remove(["k"]))
            await asyncio.sleep(0.01)
            n2 = dataclasses.replace(n, incarnation=2)  # n restarted (MountSegment)
            table.mount(n2, [(SegmentInfo(n2, NVME, Tier.NVME, 8 * MiB), inventory)])
            gate.set()
            (status,) = await removing
            await servicer.persist_dirty()
            return status.code, table.exists("k"), [m.key for m in store.load()]

    code, exists, stored = asyncio.run(run())
    assert code == 0
    assert not exists and "k" not in stored, "an acknowledged remove: k is still there"
