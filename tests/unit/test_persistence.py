"""RocksDB persistence: records survive a reopen; concurrent writes share synced batches."""

import asyncio

import pytest

from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.persistence import MetadataStore, decode_object, encode_object


def meta(key: str, n: int = 2) -> ObjectMeta:
    return ObjectMeta(
        key,
        4096 * n,
        ObjectState.COMPLETE,
        tuple(Replica(0xFFFF_FFFF_FFFF_FFF0 + i, i * 8192) for i in range(n)),
        checksum=2**64 - 1,
        created_s=12.5,
        fingerprint=b"\x01" * 16,
        parent_key=f"parent-of-{key}",
        tag=b"\x00tag",
        pin_until_s=float("inf"),
    )


def test_encode_round_trip():
    m = meta("ключ/🔑")
    back = decode_object(m.key, encode_object(m))
    assert back == m


def test_group_commit_and_reopen(tmp_path):
    async def write_many() -> tuple[int, int]:
        store = MetadataStore(tmp_path / "db")
        store.start()
        await asyncio.gather(*(store.write(puts=[meta(f"k{i}")]) for i in range(500)))
        await store.write(deletes=["k0", "k1", "absent"])
        batches = store.batches_written
        await store.close()
        await store.close()  # idempotent
        return batches, store.mutations_written

    batches, mutations = asyncio.run(write_many())
    assert mutations == 503
    assert batches < 100  # 500 concurrent writers shared a few synced batches

    store = MetadataStore(tmp_path / "db")
    loaded = {m.key: m for m in store.load()}
    assert len(loaded) == 498 and "k0" not in loaded
    assert loaded["k7"] == meta("k7")
    asyncio.run(store.close())


def test_lone_commit_is_written_inline_and_keeps_order(tmp_path):
    """`alone=True` (no other put in flight) writes before write() first yields; with a group
    queued, it waits its turn, so a delete queued before a put of the same key stays before."""

    async def run() -> int:
        store = MetadataStore(tmp_path / "db")
        store.start()
        coro = store.write(puts=[meta("solo")], alone=True)
        with pytest.raises(StopIteration):
            coro.send(None)  # finished without waiting on the writer task
        assert store.batches_written == 1

        delete = asyncio.ensure_future(store.write(deletes=["solo"]))
        await asyncio.sleep(0)  # the delete is queued, the writer not yet run
        assert not delete.done()
        await store.write(puts=[meta("solo", 1)], alone=True)
        assert delete.done()  # the queued group went first
        batches = store.batches_written
        await store.close()
        return batches

    assert asyncio.run(run()) == 2  # the inline write, then the delete and the put together
    store = MetadataStore(tmp_path / "db")
    assert [m.size_bytes for m in store.load()] == [4096]  # the put, after the delete
    asyncio.run(store.close())


def test_window_mode_fsyncs_in_the_background_only_when_something_is_unsynced(tmp_path):
    """The default mode: a commit returns once it is in the WAL, and a background fsync follows
    within the interval; an idle store does not fsync; close() fsyncs what is left."""

    async def run() -> tuple[int, int]:
        store = MetadataStore(tmp_path / "db", sync=False, sync_interval_s=0.01)
        assert store.sync_interval_s == 0.01
        store.start()
        await store.write(puts=[meta("w1")])
        for _ in range(500):  # poll: the syncer runs every 10 ms
            if store.background_syncs:
                break
            await asyncio.sleep(0.01)
        synced = store.background_syncs
        assert synced >= 1 and not store._unsynced
        await asyncio.sleep(0.05)  # five intervals with nothing written
        idle = store.background_syncs
        await store.write(puts=[meta("w2")])
        await store.close()
        return synced, idle

    synced, idle = asyncio.run(run())
    assert idle == synced  # nothing unsynced: no fsync
    store = MetadataStore(tmp_path / "db")
    assert sorted(m.key for m in store.load()) == ["w1", "w2"]
    asyncio.run(store.close())
    per_commit = MetadataStore(tmp_path / "db2", sync=True, sync_interval_s=0.1)
    assert per_commit.sync_interval_s == 0  # every commit is fsync'd: no window to cover
    asyncio.run(per_commit.close())
