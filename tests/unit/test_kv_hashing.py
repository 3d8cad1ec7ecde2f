"""Block hashers: published and derived vectors, reference implementations, determinism."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys

import cbor2
import numpy as np
import pytest

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.kv import cbor
from mooncake_store.kv.hashing import DynamoHasher, SglangHasher, VllmHasher, Xxh3Hasher


def test_dynamo_published_vectors():
    # From Dynamo's lib/llm/src/tokens.rs tests (seed 1337, block size 4).
    hasher = DynamoHasher(tokens_per_block=4, seed=1337)
    tokens = list(range(1, 13))
    assert hasher.local_hashes(tokens) == [
        14643705804678351452,
        16777012769546811212,
        483935686894639516,
    ]
    assert hasher.digests(tokens) == [
        14643705804678351452,
        4945711292740353085,
        12583592247330656132,
    ]
    assert hasher.block_keys(tokens[:10]) == ["14643705804678351452", "4945711292740353085"]


def _vllm_reference(tokens, block_size, seed, extra_keys=None):
    """vLLM v1: NONE_HASH = sha256_cbor(PYTHONHASHSEED); hash_block_tokens chains blocks."""

    def sha256_cbor(obj):
        return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()

    parent, out = sha256_cbor(seed), []
    for i in range(len(tokens) // block_size):
        block = tuple(tokens[i * block_size : (i + 1) * block_size])
        parent = sha256_cbor((parent, block, extra_keys))
        out.append(parent.hex())
    return out


def test_vllm_sha256_cbor_vectors():
    # Derived with the algorithm of vllm/v1/core/kv_cache_utils.py (hash_block_tokens,
    # init_none_hash) and vllm/utils/hashing.py (sha256_cbor), pinned here.
    assert VllmHasher().block_keys(list(range(32))) == [
        "d830de3d42c00f25a2949b5d12d98642664a44872c1614c5b0147556276afc9c",
        "fedd9e4abebebbe6f6cf96b682f08d316063fe2f22a5c552192dd62904fcccac",
    ]
    four = VllmHasher(tokens_per_block=4, hash_seed="0")
    assert four.none_hash.hex() == (
        "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e"
    )
    assert four.block_keys(list(range(1, 10))) == [
        "c9d58ba695280d69b243e1e0df813136ca9196b286fb1a021e0b2e028ef071cb",
        "24125b23e68883b5c2141db2959d48433fe6bde2f26bd914efad121d154ab2d6",
    ]
    salted = VllmHasher(tokens_per_block=4, hash_seed="42")
    assert salted.block_keys([1, 2, 3, 4], extra_keys=("lora-a",)) == [
        "6509d69e455322d0c1aaedd501c46776c71efc49bf81b4d2bfcfa9f9a37df207"
    ]


@pytest.mark.parametrize("seed", range(5))
def test_vllm_matches_a_cbor2_reference(seed):
    rng = random.Random(seed)
    tokens = [rng.randrange(0, 150_000) for _ in range(rng.randrange(0, 200))]
    extra = rng.choice([None, ("salt",), (("mm-hash", 3),), ("lora", 7)])
    hasher = VllmHasher(tokens_per_block=16, hash_seed=str(seed))
    assert hasher.block_keys(tokens, extra_keys=extra) == _vllm_reference(
        tokens, 16, str(seed), extra
    )


def _sglang_reference(tokens, page_size):
    """sglang/srt/mem_cache: get_hash_str chained over pages."""
    out, prior = [], None
    for i in range(len(tokens) // page_size):
        hasher = hashlib.sha256()
        if prior:
            hasher.update(bytes.fromhex(prior))
        for t in tokens[i * page_size : (i + 1) * page_size]:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
        prior = hasher.hexdigest()
        out.append(prior)
    return out


def test_sglang_vectors_and_reference():
    assert SglangHasher(tokens_per_block=4).block_keys([1, 2, 3, 4, 5, 6, 7, 8]) == [
        "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72",
        "4ebfa8a1f3c341517621838c6e1b9aa350307e3f00b3cbd1a07ef740f54396d6",
    ]
    rng = random.Random(3)
    tokens = [rng.randrange(0, 2**32) for _ in range(300)]
    assert SglangHasher(tokens_per_block=64).block_keys(tokens) == _sglang_reference(tokens, 64)


def test_default_xxh3_vectors_and_namespace():
    hasher = Xxh3Hasher(tokens_per_block=4)
    assert hasher.block_keys([1, 2, 3, 4, 5, 6, 7, 8]) == [
        "6c6ad0d62252f9140cf8c31f163be9b8",
        "1d5a416f35b418fbaec3b472192e6cfd",
    ]
    assert Xxh3Hasher(tokens_per_block=4, namespace="x").block_keys([1, 2, 3, 4]) == [
        "7e1f1ed054fdbdf83a32b64c91ccc326"
    ]
    assert hasher.block_keys([1, 2, 3, 4], extra_keys=("salt",)) != hasher.block_keys([1, 2, 3, 4])


@pytest.mark.parametrize(
    "hasher",
    [
        Xxh3Hasher(tokens_per_block=8),
        VllmHasher(tokens_per_block=8),
        SglangHasher(tokens_per_block=8),
        DynamoHasher(tokens_per_block=8),
    ],
)
def test_chain_properties(hasher):
    a = list(range(100, 132))
    b = a[:16] + [7] * 16
    ka, kb = hasher.block_keys(a), hasher.block_keys(b)
    assert len(ka) == 4 and ka[:2] == kb[:2] and ka[2] != kb[2] and ka[3] != kb[3]
    assert hasher.block_keys(a[:31]) == ka[:3]  # the partial trailing block has no key
    assert hasher.block_keys(np.array(a, dtype=np.int64)) == ka
    assert hasher.block_keys(np.array(a, dtype=np.uint32)) == ka
    moved = a[8:16] + a[:8] + a[16:]  # same tokens, other order: other prefix
    assert hasher.block_keys(moved)[0] != ka[0]


@pytest.mark.parametrize(
    "bad,match",
    [
        ([1, 2.0, 3], "item 1 is float"),
        (["1", "2"], "item 0 is str"),
        ([1, True], "item 1 is bool"),
        ([1, -1], "outside"),
        ([2**32], "outside"),
        (np.array([1.5, 2.5]), "dtype float64"),
        (np.zeros((2, 2), dtype=np.int32), "1-D"),
        ("1234", "not a string"),
    ],
)
def test_bad_token_ids(bad, match):
    with pytest.raises(InvalidArgumentError, match=match):
        Xxh3Hasher(tokens_per_block=2).block_keys(bad)


def test_bad_hasher_settings():
    with pytest.raises(InvalidArgumentError):
        Xxh3Hasher(tokens_per_block=0)
    with pytest.raises(InvalidArgumentError):
        DynamoHasher(seed=-1)
    with pytest.raises(InvalidArgumentError):
        SglangHasher().block_keys([1] * 64, extra_keys=("x",))


SCRIPT = """
import json
from mooncake_store.kv.hashing import DynamoHasher, SglangHasher, VllmHasher, Xxh3Hasher
tokens = list(range(1000, 1300))
print(json.dumps({h.name: h.block_keys(tokens, extra_keys=x) for h, x in [
    (Xxh3Hasher(tokens_per_block=16), ("salt", 1)), (VllmHasher(), ("lora",)),
    (SglangHasher(tokens_per_block=16), None), (DynamoHasher(), None)]}))
"""


def test_hashes_are_identical_across_interpreters_and_hash_seeds():
    outputs = []
    for seed in ("1", "2", "random"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True
        ).stdout
        outputs.append(json.loads(out))
    assert outputs[0] == outputs[1] == outputs[2]
    assert all(len(keys) == 18 for keys in outputs[0].values())


def test_cbor_matches_cbor2_on_random_values():
    rng = random.Random(0)

    def value(depth=0):
        kind = rng.randrange(8 if depth < 3 else 5)
        if kind == 0:
            return rng.choice(
                [
                    0,
                    23,
                    24,
                    255,
                    256,
                    65535,
                    65536,
                    2**32,
                    2**64 - 1,
                    -1,
                    -25,
                    -(2**64),
                    rng.randrange(-(2**40), 2**40),
                ]
            )
        if kind == 1:
            return rng.randbytes(rng.choice([0, 23, 24, 300]))
        if kind == 2:
            return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(30)))
        if kind == 3:
            return rng.choice([None, True, False])
        if kind == 4:
            return rng.choice([0.0, 1.5, -2.0, 1e300, 65504.0, 1e-7, float("inf"), float("nan")])
        if kind == 5:
            return tuple(value(depth + 1) for _ in range(rng.randrange(5)))
        if kind == 6:
            return [value(depth + 1) for _ in range(rng.randrange(30))]
        return {value(4): value(depth + 1) for _ in range(rng.randrange(5))}

    for _ in range(5000):
        v = value()
        assert cbor.dumps(v) == cbor2.dumps(v, canonical=True), v
    with pytest.raises(InvalidArgumentError):
        cbor.dumps(2**64)
    with pytest.raises(InvalidArgumentError):
        cbor.dumps(object())
