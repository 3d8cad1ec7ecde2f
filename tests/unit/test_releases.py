"""Owed releases (master/releases.py): which release is sent when, and when it ends.

A release that ends too early leaves a removed block in its node's index (it comes back at the
next mount); one that is sent for the wrong block makes a node forget a live one.  These tests
drive the pure core through the orders a slow node and a busy master produce."""

from __future__ import annotations

import asyncio

from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.releases import BlockName, OwedReleases

SEG, OTHER = 7, 8
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
