"""KV layouts: block sizes, split/join round trips (token-major and block-major), padding."""

from __future__ import annotations

import numpy as np
import pytest

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.kv import EngineIdentity, KVBlock, KVLayout

LAYOUTS = [
    KVLayout(num_layers=2, num_kv_heads=4, head_dim=8, dtype="float16", tokens_per_block=16),
    KVLayout(
        num_layers=3,
        num_kv_heads=8,
        head_dim=16,
        dtype="float32",
        tokens_per_block=4,
        tp_rank=1,
        tp_size=4,
    ),
    KVLayout(num_layers=1, num_kv_heads=2, head_dim=64, dtype="bfloat16", tokens_per_block=8),
    KVLayout(
        num_layers=4, num_kv_heads=1, head_dim=32, dtype="int8", tokens_per_block=32, kv_factor=1
    ),
]


def random_tokens_tensor(layout: KVLayout, tokens: int, seed: int = 0) -> np.ndarray:
    shape = (layout.num_layers, layout.kv_factor, tokens, layout.heads_per_rank, layout.head_dim)
    raw = np.random.default_rng(seed).integers(
        0, 255, int(np.prod(shape)) * layout.itemsize, dtype=np.uint8
    )
    return raw.view(layout.numpy_dtype).reshape(shape)


def test_block_bytes():
    layout = KVLayout(
        num_layers=32,
        num_kv_heads=8,
        head_dim=128,
        dtype="float16",
        tokens_per_block=16,
        tp_rank=0,
        tp_size=2,
    )
    assert layout.block_shape == (32, 2, 16, 4, 128)
    assert layout.block_bytes == 32 * 2 * 16 * 4 * 128 * 2


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay.dtype}-tp{lay.tp_size}")
def test_token_major_round_trip(layout):
    tokens = layout.tokens_per_block * 5
    kv = random_tokens_tensor(layout, tokens)
    blocks = layout.split(kv)
    assert len(blocks) == 5
    for b in blocks:
        assert b.data.flags.c_contiguous and b.data.nbytes == layout.block_bytes
        assert b.valid_tokens == layout.tokens_per_block
    joined = layout.join(blocks)
    assert joined.shape == kv.shape and joined.tobytes() == kv.tobytes()
    # Through raw bytes, as a block comes back from the store.
    raw = [KVBlock(np.frombuffer(b.data.tobytes(), dtype=kv.dtype), b.valid_tokens) for b in blocks]
    assert layout.join(raw).tobytes() == kv.tobytes()


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: f"{lay.dtype}-tp{lay.tp_size}")
def test_partial_block_left_out_or_padded(layout):
    tpb = layout.tokens_per_block
    tokens = tpb * 2 + tpb // 2 + 1
    kv = random_tokens_tensor(layout, tokens, seed=1)
    assert len(layout.split(kv)) == 2
    padded = layout.split(kv, pad_partial=True)
    assert len(padded) == 3 and padded[-1].valid_tokens == tpb // 2 + 1
    tail = padded[-1].data
    assert not tail[:, :, tpb // 2 + 1 :].any()  # the padding is zeros
    assert layout.join(padded).tobytes() == kv.tobytes()
    assert layout.join(padded, num_tokens=tpb).tobytes() == kv[:, :, :tpb].tobytes()


def test_block_major_is_split_without_copies():
    layout = LAYOUTS[0]
    pool = np.random.default_rng(2).standard_normal((6, *layout.block_shape)).astype(np.float16)
    blocks = layout.split(pool, num_tokens=5 * layout.tokens_per_block + 3, pad_partial=True)
    assert len(blocks) == 6
    for i, b in enumerate(blocks[:5]):
        assert np.shares_memory(b.data, pool) and b.data.tobytes() == pool[i].tobytes()
    assert not np.shares_memory(blocks[5].data, pool) and blocks[5].valid_tokens == 3


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(num_kv_heads=6, tp_size=4), "not divisible by tp_size"),
        (dict(tp_rank=2, tp_size=2), "not in"),
        (dict(num_layers=0), "num_layers must be >= 1"),
        (dict(dtype="float77"), "unknown dtype"),
        (dict(kv_factor=3), "kv_factor"),
    ],
)
def test_layouts_that_do_not_multiply_out(kwargs, match):
    base = dict(num_layers=2, num_kv_heads=4, head_dim=8, dtype="float16", tokens_per_block=16)
    with pytest.raises(InvalidArgumentError, match=match):
        KVLayout(**{**base, **kwargs})


def test_tensors_that_do_not_fit_the_layout():
    layout = LAYOUTS[0]
    with pytest.raises(InvalidArgumentError, match="token-major tensor must be"):
        layout.split(np.zeros((2, 2, 32, 3, 8), dtype=np.float16))
    with pytest.raises(InvalidArgumentError, match="1-byte items"):
        layout.split(np.zeros((2, 2, 32, 4, 8), dtype=np.int8))
    with pytest.raises(InvalidArgumentError, match="blocks of shape"):
        layout.split(np.zeros((3, 2, 2, 8, 4, 8), dtype=np.float16))
    with pytest.raises(InvalidArgumentError, match="holds 10 bytes"):
        layout.join([np.zeros(10, dtype=np.uint8)])
    with pytest.raises(InvalidArgumentError, match="no blocks"):
        layout.join([])


def test_identity_fingerprint_covers_every_field():
    layout = LAYOUTS[0]
    base = EngineIdentity("llama-3-8b", layout)
    variants = [
        EngineIdentity("llama-3-70b", layout),
        EngineIdentity("llama-3-8b", layout, revision="v2"),
        EngineIdentity("llama-3-8b", layout, lora="adapter-1"),
        EngineIdentity("llama-3-8b", layout, cache_salt="tenant-a"),
        EngineIdentity("llama-3-8b", KVLayout(**{**layout.describe(), "dtype": "bfloat16"})),
        EngineIdentity("llama-3-8b", KVLayout(**{**layout.describe(), "tp_size": 2})),
        EngineIdentity("llama-3-8b", KVLayout(**{**layout.describe(), "tokens_per_block": 32})),
    ]
    prints = {v.fingerprint for v in variants}
    assert len(prints) == len(variants) and base.fingerprint not in prints
    assert EngineIdentity("llama-3-8b", layout).fingerprint == base.fingerprint
    assert len(base.fingerprint) == 16
    with pytest.raises(InvalidArgumentError):
        EngineIdentity("", layout)
