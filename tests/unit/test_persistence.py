"""RocksDB persistence: records survive a reopen; concurrent writes share synced batches."""

import asyncio

from mooncake_store.master.object_table import ObjectMeta, ObjectState, Replica
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
