"""The KV-cache layer against a real cluster: prefix ops, identity checks, padded blocks."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_store import Client, IdentityMismatchError, InvalidArgumentError
from mooncake_store.kv import DynamoHasher, EngineIdentity, KVCache, KVLayout, VllmHasher

LAYOUT = KVLayout(num_layers=2, num_kv_heads=4, head_dim=16, dtype="float16", tokens_per_block=16)


def kv_for(tokens: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (LAYOUT.num_layers, 2, tokens, LAYOUT.heads_per_rank, LAYOUT.head_dim)
    return rng.standard_normal(shape).astype(np.float16)


@pytest.fixture(scope="module")
def store(cluster):
    with Client(cluster.master_address) as client:
        yield client


def test_prefix_round_trip_writes_only_the_missing_tail(store):
    kv = KVCache(store, EngineIdentity("model-a", LAYOUT), hasher=VllmHasher())
    tokens = list(range(5000, 5000 + 16 * 6 + 5))
    keys = kv.block_keys(tokens)
    assert len(keys) == 6
    tensor = kv_for(len(tokens), seed=1)
    blocks = LAYOUT.split(tensor)
    assert kv.put_prefix(keys[:4], blocks[:4]) == 4
    assert kv.prefix_match(keys) == 4
    assert kv.put_prefix(keys, blocks) == 2  # the first four are already there
    assert kv.put_prefix([], []) == 0 and kv.prefix_match([]) == 0
    buffers = [LAYOUT.empty_block() for _ in keys]
    hit = kv.get_prefix(keys, into=buffers)
    assert hit.matched == 6 and hit.valid_tokens == [16] * 6
    assert LAYOUT.join(buffers).tobytes() == tensor[:, :, : 16 * 6].tobytes()
    meta = store.get_prefix_into(
        keys[:2], [bytearray(LAYOUT.block_bytes)] * 2, fingerprint=kv.fingerprint
    )
    assert meta.matched == 2


def test_prefix_match_stops_where_the_chain_breaks(store):
    kv = KVCache(store, EngineIdentity("model-b", LAYOUT))
    tokens = np.arange(16 * 8) + 77
    keys = kv.block_keys(tokens)
    kv.put_prefix(keys, LAYOUT.split(kv_for(len(tokens), seed=2)))
    assert kv.prefix_match(keys) == 8
    assert store.remove(keys[3])  # a block evicted or removed in the middle
    assert kv.prefix_match(keys) == 3
    buffers = [LAYOUT.empty_block() for _ in keys]
    assert kv.get_prefix(keys, into=buffers).matched == 3
    assert kv.prefix_match(keys[4:]) == 4  # later blocks are still there on their own
    assert kv.prefix_match(["never-stored", *keys]) == 0


def test_a_different_identity_is_refused(store):
    writer = KVCache(store, EngineIdentity("model-c", LAYOUT), hasher=DynamoHasher())
    tokens = list(range(16 * 3))
    keys = writer.block_keys(tokens)
    writer.put_prefix(keys, LAYOUT.split(kv_for(len(tokens), seed=3)))
    for other in (
        EngineIdentity("model-d", LAYOUT),  # another model, same key strings
        EngineIdentity("model-c", KVLayout(**{**LAYOUT.describe(), "dtype": "bfloat16"})),
        EngineIdentity("model-c", LAYOUT, lora="adapter"),
    ):
        reader = KVCache(store, other, hasher=DynamoHasher())
        assert reader.block_keys(tokens) == keys
        assert reader.prefix_match(keys) == 0
        assert reader.get_prefix(keys, into=[LAYOUT.empty_block() for _ in keys]).matched == 0
        with pytest.raises(IdentityMismatchError, match="another identity"):
            store.get(keys[0], fingerprint=other.fingerprint)
        with pytest.raises(IdentityMismatchError):
            reader.put_prefix(keys, LAYOUT.split(kv_for(len(tokens), seed=4)))
    assert writer.prefix_match(keys) == 3


def test_tp_ranks_get_their_own_keys(store):
    ranks = [KVLayout(**{**LAYOUT.describe(), "tp_rank": r, "tp_size": 2}) for r in (0, 1)]
    caches = [KVCache(store, EngineIdentity("model-e", lay)) for lay in ranks]
    tokens = list(range(32))
    keys = [c.block_keys(tokens) for c in caches]
    assert keys[0] != keys[1] and keys[0][0].endswith("@tp0of2")
    for cache, lay, k in zip(caches, ranks, keys, strict=True):
        shape = (lay.num_layers, 2, 32, lay.heads_per_rank, lay.head_dim)
        cache.put_prefix(k, lay.split(np.ones(shape, dtype=np.float16) * lay.tp_rank))
    for cache, lay, k in zip(caches, ranks, keys, strict=True):
        out = [lay.empty_block() for _ in k]
        assert cache.get_prefix(k, into=out).matched == 2
        assert all((b == lay.tp_rank).all() for b in out)


def test_padded_partial_block_keeps_its_true_length(store):
    kv = KVCache(store, EngineIdentity("model-f", LAYOUT))
    tensor = kv_for(16 * 2 + 5, seed=5)
    blocks = LAYOUT.split(tensor, pad_partial=True)
    keys = [*kv.block_keys(np.arange(37)), "model-f/partial-tail"]
    kv.put_prefix(keys, blocks)
    out = [LAYOUT.empty_block() for _ in keys]
    hit = kv.get_prefix(keys, into=out)
    assert hit.valid_tokens == [16, 16, 5]
    from mooncake_store.kv import KVBlock

    joined = LAYOUT.join([KVBlock(b, n) for b, n in zip(out, hit.valid_tokens, strict=True)])
    assert joined.tobytes() == tensor.tobytes()


def test_wrong_buffers_are_refused(store):
    kv = KVCache(store, EngineIdentity("model-g", LAYOUT))
    keys = kv.block_keys(list(range(1000, 1032)))
    with pytest.raises(InvalidArgumentError, match="holds 100 bytes"):
        kv.put_prefix(keys, [np.zeros(100, dtype=np.uint8)] * 2)
    with pytest.raises(InvalidArgumentError, match="2 keys but 1 block buffers"):
        kv.get_prefix(keys, into=[LAYOUT.empty_block()])
    with pytest.raises(InvalidArgumentError, match="cuts 8-token blocks"):
        KVCache(store, EngineIdentity("model-g", LAYOUT), hasher=VllmHasher(tokens_per_block=8))
    other = KVCache(store, EngineIdentity("model-h", LAYOUT))
    other.put_prefix(keys, LAYOUT.split(kv_for(32, seed=6)))
    # Another model stored the same token blocks under the same keys; not for this identity.
    assert store.exists_many(keys) == [True, True]
    assert kv.prefix_match(keys) == 0
