"""XXH3-64 (seed 0) of a chunk, computed as the GPU computes it: block sums, then a short scan.

The reference for `client/xxh3_gpu.cu` (docs/CHECKSUM.md, "On the GPU"), in NumPy, exact
against the `xxhash` package for every input longer than 240 bytes.

XXH3's long-input path (more than 240 bytes; the default 192-byte secret) keeps 8 u64
accumulators and reads the input in 64-byte *stripes*, 16 to a 1024-byte *block*.  A stripe
only *adds* to the accumulators: for lane i (its 8 bytes `d_i`, key `k_i` = the secret at
`stripe_in_block * 8 + i * 8`) `acc[i ^ 1] += d_i` and `acc[i] += lo32(d_i ^ k_i) *
hi32(d_i ^ k_i)`; no term depends on the accumulators.  Between blocks a *scramble* runs, lane
by lane: `acc ^= acc >> 47; acc ^= secret_end[i]; acc *= PRIME32_1`.  So the hash of an input
of `L` bytes is:

(a) the *block sums*: for every block slot `b` and lane `j`, the sum over its stripes of the
    terms that reach `acc[j]` (every block and lane independent: this is the parallel,
    memory-bound part).  The stripes that count are the first `(L - 1) // 64`: the
    `(L - 1) // 1024` full blocks and a last partial block of 0..15 stripes;
(b) a scan per lane over the full blocks: `acc = scramble(acc + sum_b)`, then `acc += ` the
    partial block's sum, then the *last stripe* (the input's last 64 bytes, keyed by the secret
    at 121), then the merge of the 8 lanes and the avalanche.

A 1 MiB chunk has 1023 full blocks and a partial one of 15 stripes, so the sums of a chunk fit
in 1024 slots of 8 lanes.  Inputs of up to 240 bytes take XXH3's short paths: the callers hash
them on the CPU (`xxhash`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)  # XXH3's default secret (kSecret), 192 bytes
assert len(SECRET) == 192

MIDSIZE_MAX = 240  # up to here XXH3 takes its short paths (hashed on the CPU)
STRIPE_BYTES = 64
STRIPES_PER_BLOCK = 16  # (192 - 64) / 8
BLOCK_BYTES = STRIPE_BYTES * STRIPES_PER_BLOCK  # 1024
LASTACC_START = 7  # the last stripe's key: secret[192 - 64 - 7 :]
MERGEACCS_START = 11
PRIME32_1 = 0x9E3779B1
PRIME32_2 = 0x85EBCA77
PRIME32_3 = 0xC2B2AE3D
PRIME64_1 = 0x9E3779B185EBCA87
PRIME64_2 = 0xC2B2AE3D27D4EB4F
PRIME64_3 = 0x165667B19E3779F9
PRIME64_4 = 0x85EBCA77C2B2AE63
PRIME64_5 = 0x27D4EB2F165667C5
PRIME_MX1 = 0x165667919E3779F9
INIT_ACC = (PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1)
M64 = (1 << 64) - 1

_LANE_SWAP = np.array([1, 0, 3, 2, 5, 4, 7, 6])


def _le64(data: bytes | np.ndarray, offset: int, count: int) -> np.ndarray:
    return np.frombuffer(bytes(data[offset : offset + 8 * count]), dtype="<u8").astype(np.uint64)


_STRIPE_KEYS = np.stack([_le64(SECRET, s * 8, 8) for s in range(STRIPES_PER_BLOCK)])  # [16, 8]
_SCRAMBLE_KEY = _le64(SECRET, len(SECRET) - STRIPE_BYTES, 8)
_LAST_KEY = _le64(SECRET, len(SECRET) - STRIPE_BYTES - LASTACC_START, 8)


def counted_stripes(length: int) -> int:
    """Stripes of an input of `length` (> 240) bytes that the block sums cover."""
    return (length - 1) // STRIPE_BYTES


def full_blocks(length: int) -> int:
    """Blocks followed by a scramble: every block but the last (partial) one."""
    return (length - 1) // BLOCK_BYTES


def _terms(stripes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per stripe and lane j, what the stripe adds to acc[j] ([n, 8] uint64)."""
    keyed = stripes ^ keys
    products = (keyed & np.uint64(0xFFFFFFFF)) * (keyed >> np.uint64(32))
    return stripes[:, _LANE_SWAP] + products  # type: ignore[no-any-return]


def block_sums(chunk: Any) -> np.ndarray:
    """Phase (a): the per-block, per-lane sums of an input of more than 240 bytes, as a
    [full_blocks + 1, 8] uint64 array (the last row is the partial block, maybe empty)."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    length = len(data)
    if length <= MIDSIZE_MAX:
        raise ValueError(f"block sums are for inputs of more than {MIDSIZE_MAX} bytes")
    stripes = counted_stripes(length)
    slots = full_blocks(length) + 1
    words = np.frombuffer(data[: stripes * STRIPE_BYTES].tobytes(), dtype="<u8")
    words = words.astype(np.uint64).reshape(stripes, 8)
    keys = _STRIPE_KEYS[np.arange(stripes) % STRIPES_PER_BLOCK]
    terms = np.zeros((slots * STRIPES_PER_BLOCK, 8), dtype=np.uint64)
    terms[:stripes] = _terms(words, keys)
    return terms.reshape(slots, STRIPES_PER_BLOCK, 8).sum(axis=1, dtype=np.uint64)  # type: ignore[no-any-return]


def scramble(acc: np.ndarray) -> np.ndarray:
    acc = acc ^ (acc >> np.uint64(47))
    acc = acc ^ _SCRAMBLE_KEY
    return acc * np.uint64(PRIME32_1)  # type: ignore[no-any-return]


def finish(sums: np.ndarray, chunk: Any) -> int:
    """Phase (b): the scan over the block sums, the last stripe, the merge and the avalanche."""
    data = np.frombuffer(chunk, dtype=np.uint8)
    length = len(data)
    acc = np.array(INIT_ACC, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for row in sums[: full_blocks(length)]:
            acc = scramble(acc + row)
        acc = acc + sums[full_blocks(length)]
        last = _le64(data, length - STRIPE_BYTES, 8)
        acc = acc + _terms(last[None, :], _LAST_KEY)[0]
    return merge([int(a) for a in acc], length)


def mul128_fold64(a: int, b: int) -> int:
    product = a * b
    return (product & M64) ^ (product >> 64)


def avalanche(h: int) -> int:
    h ^= h >> 37
    h = (h * PRIME_MX1) & M64
    return h ^ (h >> 32)


def merge(acc: list[int], length: int) -> int:
    """XXH3's mergeAccs with the length-dependent start: the digest from the 8 lanes."""
    secret = np.frombuffer(SECRET[MERGEACCS_START : MERGEACCS_START + 64], dtype="<u8")
    result = (length * PRIME64_1) & M64
    for i in range(4):
        lo = acc[2 * i] ^ int(secret[2 * i])
        hi = acc[2 * i + 1] ^ int(secret[2 * i + 1])
        result = (result + mul128_fold64(lo, hi)) & M64
    return avalanche(result)


def xxh3_64_blocks(chunk: Any) -> int:
    """XXH3-64 (seed 0) of `chunk` (more than 240 bytes) through phases (a) and (b)."""
    return finish(block_sums(chunk), chunk)
