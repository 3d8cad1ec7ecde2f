"""Owed releases (master/releases.py): which release is sent when, and when it ends.

A release that ends too early leaves a removed block in its node's index (it comes back at the
next mount); one that is sent for the wrong block makes a node forget a live one.  These tests
drive the pure core through the orders a slow node and a busy master produce."""

from __future__ import annotations

import asyncio

from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.releases import BlockName, OwedReleases
from tests.unit.test_release_orderings import master_on

SEG, OTHER = 7, 8
MiB = 1 << 20
A, B = BlockName("a", 1), BlockName("b", 2)


def mounted(segment_id: int) -> bool:
    return segment_id in (SEG, OTHER)


def test_an_owed_release_is_sent_once_its_extent_is_free_and_ends_with_the_reply():
    owed = OwedReleases()
    owed.owe(SEG, 0, A)  # a read lease still holds the extent
    assert owed.take(mounted) == {}
    assert owed.take_dirty() == [(SEG, 0, A)]  # durable before anything is sent
    owed.queue(SEG, 0)
    assert owed.take(mounted) == {SEG: [(0, A)]}
    assert owed.take(mounted) == {}  # in flight: not sent twice
    owed.done(SEG, [0])
    assert len(owed) == 0 and owed.take_dirty() == [(SEG, 0, None)]


def test_a_refused_release_is_sent_again_and_one_for_an_unmounted_segment_waits():
    owed = OwedReleases()
    owed.queue(SEG, 0, A)
    owed.queue(99, 0, B)  # its segment is not mounted
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.again(SEG, [0])
    assert owed.take(mounted) == {SEG: [(0, A)]}
    assert owed.take(lambda s: True) == {99: [(0, B)]}


def test_an_extent_allocated_again_ends_what_was_owed_there_even_in_flight():
    """A Move down takes the offset while the release of the old block is in flight and then
    fails or is refused: nothing is sent again for the old block."""
    owed = OwedReleases()
    owed.queue(SEG, 0, A)
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.claim(SEG, 0)
    owed.again(SEG, [0])
    assert owed.take(mounted) == {} and len(owed) == 0


def test_a_release_owed_again_at_an_offset_in_flight_waits_for_the_first_reply():
    """Block A's release is in flight; B goes to the same offset and is released too.  B's
    release must not go out beside A's (one reply would end both), and A's reply must not end
    B's."""
    owed = OwedReleases()
    owed.queue(SEG, 0, A)
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.claim(SEG, 0)  # B is moved to offset 0 ...
    owed.queue(SEG, 0, B)  # ... and released in turn
    assert owed.take(mounted) == {}  # waits for A's reply
    owed.done(SEG, [0])  # A's reply
    assert owed.owed(SEG, 0) == B
    assert owed.take(mounted) == {SEG: [(0, B)]}
    owed.done(SEG, [0])
    assert len(owed) == 0


def test_replies_to_releases_sent_to_an_earlier_mount_are_ignored():
    owed = OwedReleases()
    owed.queue(SEG, 0, A)
    owed.queue(SEG, 4096, B)
    assert owed.take(mounted) == {SEG: [(0, A), (4096, B)]}
    assert owed.at_mount(SEG) == {0: A, 4096: B}  # the node restarted meanwhile
    owed.done(SEG, [0, 4096])  # the old process answered before it went
    assert owed.owed(SEG, 0) == A  # still owed: the mount decides (membership.py)
    owed.queue(SEG, 0)  # its inventory still lists A
    owed.drop(SEG, 4096)  # ... but not B
    assert owed.take(mounted) == {SEG: [(0, A)]}
    assert owed.owed(SEG, 4096) is None


def test_owed_releases_survive_a_restart_of_the_master(tmp_path):
    """Recorded in RocksDB in the batch that takes the block out of the master's records, and
    deleted once ended; a failed write is rewritten as the state is now."""

    async def run() -> list[tuple[int, int, BlockName]]:
        store = MetadataStore(tmp_path / "db")
        store.start()
        owed = OwedReleases()
        owed.owe(SEG, 0, A)
        owed.queue(SEG, 1 << 40, BlockName("ключ/🔑", 2**64 - 1))
        owed.queue(OTHER, 8192, B)
        await store.write(deletes=["a"], releases=owed.take_dirty())
        assert owed.take(mounted) == {SEG: [(1 << 40, BlockName("ключ/🔑", 2**64 - 1))],
                                      OTHER: [(8192, B)]}  # fmt: skip
        owed.done(OTHER, [8192])
        ended = owed.take_dirty()
        assert ended == [(OTHER, 8192, None)]
        owed.mark_dirty(ended)  # as if its write failed: written again
        await store.write(releases=owed.take_dirty())
        await store.close()
        return MetadataStore(tmp_path / "db").load_releases()

    loaded = asyncio.run(run())
    assert sorted(loaded) == [(SEG, 0, A), (SEG, 1 << 40, BlockName("ключ/🔑", 2**64 - 1))]
    again = OwedReleases()
    assert again.restore(loaded) == 2
    assert again.at_mount(SEG) == {0: A, 1 << 40: BlockName("ключ/🔑", 2**64 - 1)}


def test_a_node_forgets_only_the_block_a_release_names(tmp_path):
    """A release that reaches a stalled node after a later Move put another block at the same
    offset (both past the master's call timeout) leaves that block indexed: forgetting it lost
    the block at the node's next restart.  A release for a block gone already is a no-op."""
    from mooncake_store.common.blocks import BlockRecord
    from mooncake_store.node.nvme import NvmeTier

    tier = NvmeTier(tmp_path, 1 << 20)
    tier.index([BlockRecord("new", 0, 4096, 5), BlockRecord("old", 8192, 4096, 6)])
    # "old" was at 0 before "new" (same key, other bytes: "new" checksum 5 vs 4).
    assert tier.release([(0, "new", 4), (0, "old", 5), (8192, "old", 6), (4096, "x", 1)]) == 1
    assert [(b.key, b.offset) for b in tier.load_index()] == [("new", 0)]
    tier.close()


def test_a_reply_after_the_offset_was_claimed_ends_nothing():
    """A's release is in flight; the offset is claimed (a release owed from before the mount
    held no extent) and B owed there: A's reply neither fails nor ends B's release (found by
    review of 23631a0: a KeyError, or the removed B came back)."""
    owed = OwedReleases()
    owed.queue(SEG, 0, A)
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.claim(SEG, 0)
    owed.done(SEG, [0])  # A's reply: nothing owed there any more
    owed.queue(SEG, 0, A)
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.claim(SEG, 0)
    owed.owe(SEG, 0, B)  # a block moved there, removed under a read lease
    assert owed.done(SEG, [0]) == [] and owed.owed(SEG, 0) == B
    owed.queue(SEG, 0, held_bytes=4096)  # the lease ended
    assert owed.take(mounted) == {SEG: [(0, B)]}
    assert owed.done(SEG, [0]) == [(0, 4096)] and len(owed) == 0


def test_an_extent_is_held_until_its_release_is_answered():
    owed = OwedReleases()
    owed.queue(SEG, 0, A, held_bytes=8192)
    assert owed.held(SEG) == [(0, 8192)]
    assert owed.take(mounted) == {SEG: [(0, A)]}
    owed.again(SEG, [0])  # refused: still held
    assert owed.held(SEG) == [(0, 8192)]
    owed.take(mounted)
    assert owed.done(SEG, [0]) == [(0, 8192)] and owed.held(SEG) == []


def test_releases_owed_to_a_segment_that_is_not_persistent_can_be_ended_at_once():
    owed = OwedReleases()
    owed.owe(SEG, 0, A)
    owed.owe(SEG, 4096, B)
    owed.take_dirty()
    owed.forget_segment(SEG)
    assert len(owed) == 0 and owed.segments() == []
    assert sorted(owed.take_dirty()) == [(SEG, 0, None), (SEG, 4096, None)]


def test_detached_blocks_become_owed_releases_only_when_their_key_goes(tmp_path):
    from mooncake_store.master.detached import DetachedBlocks

    detached = DetachedBlocks()
    detached.detach(SEG, 0, A)
    detached.detach(OTHER, 0, A)
    detached.detach(SEG, 4096, B)
    assert detached.of_key("a") == [(SEG, 0, A), (OTHER, 0, A)]
    detached.forget_segment(OTHER)  # mounted again: its inventory speaks for it
    assert detached.take("a") == [(SEG, 0, A)] and detached.of_key("a") == []
    assert len(detached) == 1
    records = detached.take_dirty()
    assert sorted(records) == [(SEG, 0, None), (SEG, 4096, B), (OTHER, 0, None)]

    async def run() -> list[tuple[int, int, BlockName]]:
        store = MetadataStore(tmp_path / "db")
        store.start()
        await store.write(detached=records, releases=[(SEG, 0, A)])
        await store.close()
        return MetadataStore(tmp_path / "db").load_detached()

    again = DetachedBlocks()
    assert again.restore(asyncio.run(run())) == 1 and again.of_key("b") == [(SEG, 4096, B)]


def test_a_node_release_racing_a_move_to_the_same_offset_keeps_the_new_block(tmp_path):
    """Release and Move run on the node's I/O threads: a Move that indexes a new block at the
    offset between the release's check and its delete must keep it (found by review of
    23631a0).  The check is slowed on purpose; the Move runs in another thread meanwhile."""
    import threading
    import time

    from mooncake_store.common.blocks import BlockRecord
    from mooncake_store.node.nvme import NvmeTier

    tier = NvmeTier(tmp_path, 1 << 20)
    tier.index([BlockRecord("old", 0, 4096, 6)])
    real = tier._index
    checked = threading.Event()

    class SlowIndex:  # the RocksDB handle, its reads slowed
        def get(self, raw):  # type: ignore[no-untyped-def]
            out = real.get(raw)
            checked.set()
            time.sleep(0.3)
            return out

        def write(self, batch, options):  # type: ignore[no-untyped-def]
            return real.write(batch, options)

    tier._index = SlowIndex()
    mover = threading.Thread(
        target=lambda: (checked.wait(5), tier.index([BlockRecord("new", 0, 4096, 9)]))
    )
    mover.start()
    tier.release([(0, "old", 6)])
    mover.join(10)
    tier._index = real
    assert [(b.key, b.offset) for b in tier.load_index()] == [("new", 0)]
    tier.close()


def test_the_tick_sends_no_release_before_what_let_its_block_go_is_durable(tmp_path):
    """A promotion ended: its NVMe source is released and the object's record (now naming the
    DRAM copy) is dirty.  Another task's metadata write took that record and is still on its
    way to the disk (slowed here) when the tick runs: the tick must not send the release yet,
    or a master stopped before the write lands restores the object at an NVMe offset its node
    has forgotten (review of 23631a0).  Once the write is in, the next tick sends it."""
    from mooncake_store.common.blocks import BlockRecord
    from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier

    async def run() -> tuple[list[int], list[int], int]:
        async with master_on(tmp_path) as server:
            table, store = server.table, server._store
            # The node is mounted straight on the table: the planners, fences and Release
            # calls that would reach it are left out (only the tick's order is under test).
            server.tiering.plan = lambda busy=(): []  # type: ignore[method-assign]
            server.replication.plan = lambda busy=(): []  # type: ignore[method-assign]
            server.drains.plan = lambda busy=(), budget=32: []  # type: ignore[method-assign]
            server._first_fences = lambda *a, **k: []  # type: ignore[method-assign]
            table.take_fences = lambda: []  # type: ignore[method-assign]
            node = NodeInfo("n", 1, "n:data", "shm", "n:control", b"k" * 32)
            table.mount(node, [(SegmentInfo(node, 10, Tier.DRAM, 8 * MiB), None),
                               (SegmentInfo(node, SEG, Tier.NVME, 8 * MiB),
                                [BlockRecord("k", 0, MiB, 5)])])  # fmt: skip
            await server._servicer.persist_dirty()
            nvme, dram = table.mounted_segment(SEG), table.mounted_segment(10)
            source, offset = table.begin_move("k", nvme, dram)
            assert table.finish_move("k", source, dram, offset, ok=True)

            gate = asyncio.Event()
            landed: list[int] = []
            write = store.write

            async def slow_write(*args, **kwargs):  # type: ignore[no-untyped-def]
                await gate.wait()  # a slow disk
                await write(*args, **kwargs)
                landed.append(1)

            store.write = slow_write  # type: ignore[method-assign]
            sent: list[int] = []

            async def spy(released, generations):  # type: ignore[no-untyped-def]
                sent.append(len(landed))
                for segment_id, blocks in released.items():
                    table.release_done(segment_id, [o for o, _ in blocks])

            server.mover.release = spy  # type: ignore[method-assign]
            moved = asyncio.create_task(server._servicer.persist_dirty())  # the move's task
            await asyncio.sleep(0)
            tick = asyncio.create_task(server._tick())
            await asyncio.sleep(0.2)
            before = list(sent)
            gate.set()
            await moved
            await tick
            await server._tick()
            await asyncio.sleep(0.05)
            return before, sent, len(landed)

    before, sent, landed = asyncio.run(run())
    assert before == []  # nothing went out while the record was on its way
    assert sent and all(written >= 1 for written in sent) and landed >= 1
