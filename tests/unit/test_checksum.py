"""The chunked object checksum (docs/CHECKSUM.md): vectors, and every way of computing it agrees;
stored blocks of the old whole-object format are migrated (NVMe) or dropped (master records)."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np
import pytest
import xxhash

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.checksum import (
    CHUNK_BYTES,
    ChunkedHasher,
    checksum,
    checksum_parallel,
    chunk_digests,
    combine,
    legacy_checksum,
)

MiB = 1 << 20

# Byte i is i mod 251 (docs/CHECKSUM.md).
VECTORS = {
    0: 0x2D06800538D394C2,
    1: 0xC44BDFF4074EECDB,
    4096: 0x7135FFA504F1BC71,
    MiB: 0x6E0D7AC36B8C10FF,
    MiB + 1: 0xC3E2BDCEC4A6F9AC,
    3 * MiB + 5: 0x826EA599AACF9F6B,
}
CHUNKS_3M5 = [0x6E0D7AC36B8C10FF, 0x389C602A75E16490, 0xC7B6493D49B2776F, 0xD6DE5452722F76FE]


def pattern(n: int) -> bytes:
    return (np.arange(n, dtype=np.uint64) % 251).astype(np.uint8).tobytes()


def test_vectors_and_definition():
    for n, want in VECTORS.items():
        assert checksum(pattern(n)) == want, n
    data = pattern(3 * MiB + 5)
    assert chunk_digests(data) == CHUNKS_3M5
    packed = b"".join(d.to_bytes(8, "little") for d in CHUNKS_3M5)
    assert xxhash.xxh3_64_intdigest(packed, seed=0) == VECTORS[3 * MiB + 5]
    # One chunk: the old whole-object hash, so small blocks need no migration.
    assert all(checksum(pattern(n)) == legacy_checksum(pattern(n)) for n in (0, 1, MiB))
    assert checksum(data) != legacy_checksum(data)


def test_streamed_parallel_and_fused_copies_agree():
    from mooncake_store.client.steps import copy_checksum

    rng = np.random.default_rng(3)
    with ThreadPoolExecutor(3) as pool:
        for n in (0, 5, MiB - 1, MiB, MiB + 1, 8 * MiB, 9 * MiB + 4097):
            data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            want = checksum(data)
            for piece in (1000, 65536, MiB, 3 * MiB + 7):
                hasher = ChunkedHasher()
                for i in range(0, n, piece):
                    hasher.update(data[i : i + piece])
                assert hasher.intdigest() == want, (n, piece)
                assert hasher.size_bytes == n
            assert checksum_parallel(data, pool, 3) == want
            dest = bytearray(n)
            assert copy_checksum(memoryview(dest), memoryview(data)) == want
            assert dest == data
    hasher = ChunkedHasher()
    hasher.update(b"x" * (2 * MiB))
    hasher.reset()
    hasher.update(b"abc")
    assert hasher.intdigest() == checksum(b"abc")


def test_any_changed_byte_or_swapped_chunks_change_it():
    data = bytearray(pattern(3 * MiB))
    want = checksum(data)
    for pos in (0, MiB - 1, MiB, 3 * MiB - 1):
        data[pos] ^= 1
        assert checksum(data) != want
        data[pos] ^= 1
    swapped = data[MiB : 2 * MiB] + data[:MiB] + data[2 * MiB :]
    assert checksum(swapped) != want


def test_combine_refuses_wrong_chunk_counts():
    with pytest.raises(ValueError, match="one chunk"):
        combine([1, 2], MiB)
    with pytest.raises(ValueError, match="has 2 chunks"):
        combine([1], MiB + 1)
    with pytest.raises(ValueError, match="chunk boundary"):
        chunk_digests(b"x" * 10, start=3)
    assert CHUNK_BYTES == MiB


def test_master_drops_old_format_records_over_one_chunk(tmp_path):
    from mooncake_store.master import persistence
    from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica

    def old(key: str, size: int) -> ObjectMeta:
        return ObjectMeta(key, size, ObjectState.COMPLETE, (Replica(7, 0),), checksum=5)

    store = persistence.MetadataStore(tmp_path / "db")
    for meta in (old("small", MiB), old("big", MiB + 1)):
        blob = bytearray(persistence.encode_object(meta))
        blob[0] = 4  # written before the chunked checksum
        store._db[b"o/" + meta.key.encode()] = bytes(blob)
    store._db[b"o/new"] = persistence.encode_object(old("new", 5 * MiB))
    assert sorted(m.key for m in store.load()) == ["new", "small"]
    assert store.legacy_dropped == 1
    asyncio.run(store.close())
    store = persistence.MetadataStore(tmp_path / "db")
    assert sorted(m.key for m in store.load()) == ["new", "small"]  # deleted, not re-logged
    assert store.legacy_dropped == 0
    asyncio.run(store.close())


def test_nvme_tier_migrates_old_format_index(tmp_path):
    from mooncake_store.node.nvme import NvmeTier, aligned

    rng = np.random.default_rng(5)
    blocks = {"a": 3 * MiB + 5, "b": 4096, "c": 2 * MiB, "d": MiB + 1}
    tier = NvmeTier(tmp_path, 64 * MiB)
    records, offset, values = [], 0, {}
    for key, size in blocks.items():
        value = rng.integers(0, 256, size, dtype=np.uint8).tobytes()
        values[key] = value
        buf = tier.staging.take(size)
        buf[:size] = value
        tier.write(memoryview(buf), offset)
        tier.staging.give(buf)
        records.append(BlockRecord(key, offset, size, legacy_checksum(value)))
        offset += aligned(size)
    records[2] = replace(records[2], checksum=records[2].checksum ^ 1)  # "c" is corrupt
    tier.sync()
    tier.index(records)
    tier.close()
    meta_path = tmp_path / "segment.json"
    meta = json.loads(meta_path.read_text())
    del meta["checksum_format"]  # a tier written before the chunked checksum
    meta_path.write_text(json.dumps(meta))

    tier = NvmeTier(tmp_path, 64 * MiB)
    assert tier.checksum_format == 1
    good = {b.key: b for b in tier.load()}
    assert sorted(good) == ["a", "b", "d"]  # "c" matched neither format
    assert all(good[k].checksum == checksum(values[k]) for k in good)
    assert json.loads(meta_path.read_text())["checksum_format"] == 2
    tier.close()
    tier = NvmeTier(tmp_path, 64 * MiB)  # migrated once: the index now holds format 2
    assert tier.checksum_format == 2
    assert {b.key: b.checksum for b in tier.load()} == {k: b.checksum for k, b in good.items()}
    tier.close()
