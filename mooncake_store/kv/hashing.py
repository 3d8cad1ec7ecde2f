"""Prefix-chained block hashing of token ids, with hashers compatible with the big engines.

A block's hash covers its parent's hash and its own tokens, so equal hashes mean equal
prefixes.  Every hasher here is deterministic across processes, machines and Python versions
(nothing depends on `hash()` or PYTHONHASHSEED), and hashes full blocks only: the trailing
partial block of a sequence has no key.

- `Xxh3Hasher` (ours, the default): xxh3_128(parent ‖ u32le tokens ‖ cbor(extra keys)).
- `VllmHasher` (vLLM v1 prefix caching with sha256_cbor): sha256 of the canonical CBOR of
  (parent, tuple(tokens), extra keys); the first parent is sha256_cbor(PYTHONHASHSEED).
- `SglangHasher` (SGLang HiCache storage keys): sha256(parent ‖ u32le tokens), hex.
- `DynamoHasher` (NVIDIA Dynamo, Mooncake Conductor): local = xxh3_64(u32le tokens, seed);
  sequence = xxh3_64(u64le parent sequence ‖ u64le local, seed).

Each hasher's `block_keys(tokens)` returns the store keys of the full blocks (the engine's own
rendering of the hash: hex for digests, decimal for Dynamo's u64), and `digests(tokens)` the
raw values.

Example:
    >>> DynamoHasher(tokens_per_block=4).digests([1, 2, 3, 4, 5, 6, 7, 8])
    [14643705804678351452, 4945711292740353085]
"""

from __future__ import annotations

import hashlib
import struct
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.kv import cbor

_U32_LIMIT = 1 << 32


def token_array(tokens: Sequence[int] | np.ndarray) -> np.ndarray:
    """Token ids as a little-endian uint32 array, or InvalidArgumentError naming the problem."""
    if isinstance(tokens, np.ndarray):
        if tokens.ndim != 1:
            raise InvalidArgumentError(f"token ids must be 1-D, got shape {tokens.shape}")
        if tokens.size and tokens.dtype.kind not in "iu":
            raise InvalidArgumentError(f"token ids must be integers, got dtype {tokens.dtype}")
        values = tokens
    else:
        if isinstance(tokens, (str, bytes)):
            raise InvalidArgumentError("token ids must be a sequence of ints, not a string")
        for i, t in enumerate(tokens):
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise InvalidArgumentError(
                    f"token ids must be integers; item {i} is {type(t).__name__} {t!r}"
                )
        values = np.asarray(tokens, dtype=object if len(tokens) else np.int64)
    if values.size:
        low, high = int(values.min()), int(values.max())
        if low < 0 or high >= _U32_LIMIT:
            bad = low if low < 0 else high
            raise InvalidArgumentError(f"token id {bad} is outside [0, 2**32)")
    return np.asarray(values, dtype="<u4")


class BlockHasher(ABC):
    """One way of turning token ids into prefix-chained block keys."""

    name: str

    def __init__(self, *, tokens_per_block: int) -> None:
        if tokens_per_block < 1:
            raise InvalidArgumentError(f"tokens_per_block must be >= 1, got {tokens_per_block}")
        self.tokens_per_block = tokens_per_block

    def blocks(self, tokens: Sequence[int] | np.ndarray) -> list[np.ndarray]:
        """The full blocks of `tokens` (a trailing partial block is left out)."""
        arr = token_array(tokens)
        n = len(arr) // self.tokens_per_block
        return [arr[i * self.tokens_per_block : (i + 1) * self.tokens_per_block] for i in range(n)]

    @abstractmethod
    def digests(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None) -> list[Any]:
        """The raw chained hash of every full block."""

    def block_keys(
        self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None
    ) -> list[str]:
        """The store key of every full block."""
        return [self.render(d) for d in self.digests(tokens, extra_keys=extra_keys)]

    def render(self, digest: Any) -> str:
        return digest.hex() if isinstance(digest, bytes) else str(digest)


class Xxh3Hasher(BlockHasher):
    """The default: xxh3_128 over parent digest, u32le tokens and canonical CBOR extra keys.

    `namespace` seeds the chain, so two deployments that must never share blocks can pick
    different namespaces.
    """

    name = "xxh3"

    def __init__(self, *, tokens_per_block: int = 256, namespace: str = "") -> None:
        super().__init__(tokens_per_block=tokens_per_block)
        self.namespace = namespace
        self.root = xxhash.xxh3_128_digest(b"mooncake-store/kv/v1\0" + namespace.encode())

    def digests(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None) -> list[Any]:
        extra = b"" if extra_keys is None else cbor.dumps(extra_keys)
        parent, out = self.root, []
        for block in self.blocks(tokens):
            parent = xxhash.xxh3_128_digest(parent + block.tobytes() + extra)
            out.append(parent)
        return out


class VllmHasher(BlockHasher):
    """vLLM v1's prefix-cache block hash with `--prefix-caching-hash-algo sha256_cbor`.

    Block i hashes `(parent, tuple(tokens), extra_keys)` as canonical CBOR with SHA-256; the
    first block's parent is vLLM's NONE_HASH, `sha256_cbor(PYTHONHASHSEED)`: pass the
    engine's PYTHONHASHSEED as `hash_seed` (vLLM itself is only reproducible when it is set).
    """

    name = "vllm-sha256-cbor"

    def __init__(self, *, tokens_per_block: int = 16, hash_seed: str = "0") -> None:
        super().__init__(tokens_per_block=tokens_per_block)
        self.hash_seed = hash_seed
        self.none_hash = hashlib.sha256(cbor.dumps(hash_seed)).digest()

    def digests(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None) -> list[Any]:
        parent, out = self.none_hash, []
        for block in self.blocks(tokens):
            item = (parent, tuple(int(t) for t in block), extra_keys)
            parent = hashlib.sha256(cbor.dumps(item)).digest()
            out.append(parent)
        return out


class SglangHasher(BlockHasher):
    """SGLang HiCache's page hash (`get_hash_str`): sha256(prior digest ‖ u32le tokens), hex."""

    name = "sglang-sha256"

    def __init__(self, *, tokens_per_block: int = 64) -> None:
        super().__init__(tokens_per_block=tokens_per_block)

    def digests(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None) -> list[Any]:
        if extra_keys is not None:
            raise InvalidArgumentError("SGLang's page hash has no extra keys")
        parent, out = b"", []
        for block in self.blocks(tokens):
            parent = hashlib.sha256(parent + block.tobytes()).digest()
            out.append(parent)
        return out


class DynamoHasher(BlockHasher):
    """NVIDIA Dynamo's token-block hashes (also Mooncake Conductor's KV-aware routing).

    Local block hash: XXH3-64 of the u32le tokens with `seed`; sequence hash: the first
    block's local hash, then XXH3-64 of (parent sequence hash, local hash) as two u64le.
    `digests` returns sequence hashes (what identifies a prefix); `local_hashes` the others.
    """

    name = "dynamo-xxh3"

    def __init__(self, *, tokens_per_block: int = 16, seed: int = 1337) -> None:
        super().__init__(tokens_per_block=tokens_per_block)
        if not 0 <= seed < 1 << 64:
            raise InvalidArgumentError(f"seed must be a u64, got {seed}")
        self.seed = seed

    def local_hashes(self, tokens: Sequence[int] | np.ndarray) -> list[int]:
        return [xxhash.xxh3_64_intdigest(b.tobytes(), self.seed) for b in self.blocks(tokens)]

    def digests(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None) -> list[Any]:
        if extra_keys is not None:
            raise InvalidArgumentError("Dynamo's block hash takes a salt (seed), not extra keys")
        out: list[Any] = []
        for local in self.local_hashes(tokens):
            if not out:
                out.append(local)
            else:
                pair = struct.pack("<QQ", out[-1], local)
                out.append(xxhash.xxh3_64_intdigest(pair, self.seed))
        return out


HASHERS: dict[str, type[BlockHasher]] = {
    cls.name: cls for cls in (Xxh3Hasher, VllmHasher, SglangHasher, DynamoHasher)
}
