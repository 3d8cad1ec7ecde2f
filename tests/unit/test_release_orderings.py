"""Orders that broke the releases of persistent blocks as of 583162a (found by an adversarial
review): evictions that did not count the room coming back with answered Releases, a tick that
sent a release while a failed write left its records undurable, a remove whose record a racing
write brought back, copies into NVMe that no record named (a dropped node, a master restart),
a late answer from an earlier mount, a remove acknowledged while its key was lost with its
node, and a data directory from before persistent segments were recorded.  Each test failed
then."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.master.eviction import LruPolicy
from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.releases import BlockName
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from tests.unit.test_tiering import DRAM, NVME, Clock, MiB, commit, make, released


@contextlib.asynccontextmanager
async def master_on(tmp_path, **config):  # type: ignore[no-untyped-def]
    """A master on `tmp_path` (auth off, `config` on top), started and then stopped."""
    from mooncake_store.master.config import MasterConfig
    from mooncake_store.master.server import MasterServer

    server = MasterServer(MasterConfig(data_dir=str(tmp_path), port=0, auth="off", **config))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


def hold_after_delete(store, key: str) -> asyncio.Event:  # type: ignore[no-untyped-def]
    """Make the metadata write that deletes `key` land, then hold its caller until the event
    returned is set (a slow fsync): what happens meanwhile races the remove."""
    gate = asyncio.Event()
    write = store.write

    async def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        await write(*args, **kwargs)
        if kwargs.get("deletes") == [key]:
            await gate.wait()

    store.write = slow
    return gate


def test_nvme_drop_to_low_watermark_evicts_only_what_it_needs():
    """NVMe above its high watermark (0.9) drops down to its low watermark (0.5): about 4 of
    8 blocks.  A dropped block's extent stays held until the node answers its Release, so
    used_bytes does not fall and `_drop_to` goes on until nothing is evictable."""
    blocks = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(8)]  # 8 of 8 MiB
    table, tiering, _ = make(inventory=blocks)
    tiering.plan()
    left = [b.key for b in blocks if table.exists(b.key)]
    assert len(left) >= 3, f"one plan evicted {8 - len(left)} of 8 NVMe blocks: {left}"


def test_make_room_on_nvme_for_one_demotion_evicts_only_one_block():
    """DRAM is full and NVMe has no room for one 1 MiB demotion: making room evicts one NVMe
    block, not all of them (soft-pinned ones included)."""
    blocks = [BlockRecord(f"x{i}", i * MiB, MiB, 100 + i) for i in range(8)]
    table, tiering, _ = make(nvme=8 * MiB, inventory=blocks)
    table.tick()
    for i in range(4):
        commit(table, f"k{i}")  # DRAM 100%: k0 goes down, NVMe has no room
    tiering.config = dataclasses.replace(tiering.config, nvme_high_watermark=1.0)  # no _drop_to
    tasks = tiering.plan()
    left = [b.key for b in blocks if table.exists(b.key)]
    assert len(left) == 7, f"one demotion evicted {8 - len(left)} NVMe blocks; tasks {tasks}"


def test_the_tick_sends_no_release_when_another_write_failed_during_its_own(tmp_path):
    """As test_releases' durable-before-sent test, but the other task's write (holding the
    promotion's records: the object now in DRAM, the NVMe release owed) *fails* while the
    tick's own write is on its way.  The failed write leaves `_persisting` before the tick
    asks `persisted()`, which then sees nothing in flight and answers True: the release goes
    out though the records that let the block go are not durable."""
    import asyncio

    SEG = 7

    async def run():
        async with master_on(tmp_path) as server:
            table, store = server.table, server._store
            server.tiering.plan = lambda busy=(): []
            server.replication.plan = lambda busy=(): []
            server.drains.plan = lambda busy=(), budget=32: []
            server._first_fences = lambda *a, **k: []
            table.take_fences = lambda: []
            node = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            table.mount(
                node,
                [
                    (SegmentInfo(node, 10, Tier.DRAM, 8 * MiB), None),
                    (
                        SegmentInfo(node, SEG, Tier.NVME, 8 * MiB),
                        [BlockRecord("k", 0, MiB, 5), BlockRecord("j", MiB, MiB, 6)],
                    ),
                ],
            )
            await server._servicer.persist_dirty()
            nvme, dram = table.mounted_segment(SEG), table.mounted_segment(10)
            source, offset = table.begin_move("k", nvme, dram)
            assert table.finish_move("k", source, dram, offset, ok=True)

            gates = [asyncio.Event(), asyncio.Event()]
            calls: list[int] = []
            durable: list[tuple] = []
            write = store.write

            async def gated_write(*args, **kwargs):
                i = len(calls)
                calls.append(i)
                await gates[min(i, 1)].wait()
                if i == 0:
                    raise OSError("disk full")  # the move task's write fails
                await write(*args, **kwargs)
                durable.extend(kwargs.get("releases", ()))

            store.write = gated_write
            sent: list[list] = []

            async def spy(released, generations):
                sent.append([r for r in durable])
                for segment_id, blocks in released.items():
                    table.release_done(segment_id, [o for o, _ in blocks])

            server.mover.release = spy
            moved = asyncio.create_task(server._servicer.persist_dirty())  # the move's task
            await asyncio.sleep(0)
            table.mark_dirty(["j"])  # something else for the tick to write
            tick = asyncio.create_task(server._tick())
            await asyncio.sleep(0.05)
            gates[0].set()  # the move's write fails ...
            try:
                await moved
            except OSError:
                pass
            gates[1].set()  # ... while the tick's own write lands
            await tick
            await asyncio.sleep(0.05)
            return sent

    sent = asyncio.run(run())
    for durable_then in sent:
        assert (SEG, 0, BlockName("k", 5)) in durable_then, (
            "the release of (SEG, 0) went out before its record was durable"
        )


def test_a_remove_racing_a_move_and_the_ticks_write_leaves_no_record_behind(tmp_path):
    """Remove(k) writes k's delete, then removes k from the table.  While that write is on
    its way, a Move down of k ends (k dirty: its record now names the NVMe copy) and the
    tick's persist_dirty writes k's record, after the delete.  table.remove then drops k's
    dirty flag (frees.py `_delete`: `self._dirty.pop(key)`): RocksDB keeps o/k, and the next
    master run restores the removed key."""
    import asyncio

    async def run():
        async with master_on(tmp_path) as server:
            table, store, servicer = server.table, server._store, server._servicer
            node = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            table.mount(
                node,
                [
                    (SegmentInfo(node, 10, Tier.DRAM, 8 * MiB), None),
                    (SegmentInfo(node, 20, Tier.NVME, 8 * MiB), []),
                ],
            )
            table._awaiting.clear()  # as if the node took its first fence
            commit(table, "k")
            table.mark_dirty(["k"])
            await servicer.persist_dirty()
            dram, nvme = table.mounted_segment(10), table.mounted_segment(20)
            source, offset = table.begin_move("k", dram, nvme)  # a Move down in flight

            gate = hold_after_delete(store, "k")
            removing = asyncio.create_task(servicer._remove(["k"]))
            await asyncio.sleep(0.01)
            assert table.finish_move("k", source, nvme, offset, ok=True)  # the mover's task
            persisting = asyncio.create_task(servicer.persist_dirty())  # ... then persists
            await asyncio.sleep(0.01)
            gate.set()
            statuses = await removing
            await persisting
            await servicer.persist_dirty()  # the next tick's
            assert statuses[0].code == 0 and not table.exists("k")
            return [m.key for m in store.load()]

    stored = asyncio.run(run())
    assert "k" not in stored, "the removed key's record is still in RocksDB"


def test_a_key_removed_while_its_nvme_node_was_dropped_mid_copy_does_not_come_back():
    """A copy of k (on m's DRAM) into n's NVMe is in flight (a repair, or a Move down: the
    same `_moves` entry) when n is dropped (silent past its grace; unmount is the same path).
    The node finished the copy: k is indexed there.  `_drop_segment` forgets the copy
    (`del self._moves[...]`) without detaching it, so removing k (alive on m) owes nothing at
    n, and n's next mount adopts the removed key from its inventory."""
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    m = NodeInfo("m", 1, "m:data", "shm", "m:control", b"k" * 32)
    table.mount(m, [(SegmentInfo(m, DRAM, Tier.DRAM, 8 * MiB), None)])
    n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
    table.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [])])
    commit(table, "k")
    dst = table.segment(NVME)
    source, offset = table.begin_move("k", table.segment(DRAM), dst)
    table.unmount("n", 1)  # n's heartbeats stopped (expiry drops the same way)
    assert not table.finish_copy("k", source, dst, offset, ok=True)  # its mount is gone
    table.remove("k")  # k lived on, on m; now removed
    table.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [BlockRecord("k", offset, MiB, 7)])])
    assert not table.exists("k"), "the removed key came back from n's inventory"


def test_a_key_removed_after_a_restart_that_cut_its_move_down_short_does_not_come_back():
    """The master restarts while k0's Move down into NVMe is in flight; the node finished it
    (k0 indexed at the copy's offset).  Nothing the new run loads names that block (moves
    live in memory only), so a remove of k0 before the node mounts again owes nothing there
    and the mount adopts the removed key."""
    from tests.unit.test_tiering import restarted

    table, tiering, clock = make()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()  # k0: DRAM -> NVMe, in flight
    again = restarted(table, clock)
    again.remove("k0")  # before the node mounted again
    make(
        inventory=[BlockRecord("k0", task.dst_offset, MiB, 7)],
        incarnation=1,
        table=again,
        clock=clock,
    )
    assert not again.exists("k0"), "the removed key came back from the NVMe inventory"


def test_a_late_answer_from_an_earlier_mount_does_not_end_a_release_of_the_new_one():
    """release_done/release_again name no mount: at_mount forgets what was in flight, but
    once the new mount sent a release at the same offset, an answer to the old mount's
    release is taken for the new one (frees its extent and ends it, though the node may
    not have taken it; if that one then fails, nothing sends it again)."""
    held = [BlockRecord("x", 0, MiB, 100)]
    table, tiering, clock = make(inventory=held)
    table.remove("x")
    assert released(table) == {NVME: [0]}  # R1, to the first mount: in flight
    first = table.segment(NVME).generation
    table.unmount("n", 1)  # dropped (silent past its grace) ...
    make(inventory=[], incarnation=1, table=table, clock=clock)  # ... back; R1 was carried out
    table.tick()
    for i in range(4):
        commit(table, f"k{i}")
    (task,) = tiering.plan()
    assert task.dst_offset == 0 and tiering.complete(task, ok=True)  # the node indexes k0 at 0
    table.remove("k0")
    assert released(table) == {NVME: [0]}  # R2, of k0
    table.release_done(NVME, [0], first)  # R1's answer, late
    table.release_again(NVME, [0], table.segment(NVME).generation)  # R2 failed
    assert released(table) == {NVME: [0]}, "k0's release is never sent again"


def test_a_remove_whose_key_was_lost_with_its_nvme_node_meanwhile_stays_removed(tmp_path):
    """Remove(k) is acknowledged, but k's last replica (NVMe, node n) went with n, dropped
    while the remove's write was on its way: `_remove` then skips table.remove (same_object
    is False), so k's detached block is never taken; n's next mount adopts the removed key."""
    import asyncio

    async def run():
        async with master_on(tmp_path) as server:
            table, store, servicer = server.table, server._store, server._servicer
            n = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            nvme = [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [BlockRecord("k", 0, MiB, 7)])]
            table.mount(n, nvme)
            await servicer.persist_dirty()
            assert table.exists("k")

            gate = hold_after_delete(store, "k")
            removing = asyncio.create_task(servicer._remove(["k"]))
            await asyncio.sleep(0.01)
            table.unmount("n", 1)  # n dropped (expiry is the same path): k is lost with it
            gate.set()
            (status,) = await removing
            assert status.code == 0  # the client is told k is removed
            table.mount(n, nvme)  # n comes back, k still indexed there
            return table.exists("k")

    assert not asyncio.run(run()), "an acknowledged remove came back with the node"


def test_releases_recorded_before_s_records_existed_survive_the_restore_grace():
    """A data directory of 23631a0 holds r/ records but no s/ records (new in 583162a): the
    first run on it takes its NVMe segments for DRAM ones at the end of the restore grace and
    forgets their owed releases; the removed block is adopted when the node comes back."""
    clock = Clock()
    again = ObjectTable(TableConfig(), clock=clock, policy=LruPolicy())
    again.releases.restore([(NVME, 0, BlockName("x", 100))])  # load_releases()
    again.restore_persistent(set())  # load_segments(): none recorded by 23631a0
    clock.now += TableConfig().restore_grace_s + 1
    again.tick()
    n = NodeInfo("n", 2, "n:data", "shm", "n:control", b"k" * 32)
    again.mount(n, [(SegmentInfo(n, NVME, Tier.NVME, 8 * MiB), [BlockRecord("x", 0, MiB, 100)])])
    assert not again.exists("x"), "the removed key came back"
