"""Aligned KV blocks: the byte layout of one block, and splitting/reassembling KV tensors.

A block holds the keys and values of `tokens_per_block` tokens for every layer, for the KV
heads of one tensor-parallel rank, as one C-contiguous array of shape

    (num_layers, kv_factor, tokens_per_block, heads_per_rank, head_dim)

(`kv_factor` is 2 for K and V, 1 for a latent cache such as MLA).  Two tensor shapes are
accepted: *token-major* `(num_layers, kv_factor, num_tokens, heads_per_rank, head_dim)`, whose
blocks are copied out (a token slice of it is not contiguous), and *block-major*
`(num_blocks, num_layers, kv_factor, tokens_per_block, heads_per_rank, head_dim)`, whose blocks
are returned as views without a copy.  Works with numpy arrays, and with cupy arrays where cupy
is installed (the array module is taken from the tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mooncake_store.common.errors import InvalidArgumentError

# dtypes numpy lacks are stored as same-width unsigned ints (the bytes are what matter).
_DTYPE_BYTES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


def dtype_itemsize(dtype: str) -> int:
    if dtype in _DTYPE_BYTES:
        return _DTYPE_BYTES[dtype]
    try:
        return np.dtype(dtype).itemsize
    except TypeError as exc:
        raise InvalidArgumentError(f"unknown dtype {dtype!r}: use a numpy dtype name") from exc


def _xp(array: Any) -> Any:
    """numpy or cupy, whichever `array` belongs to."""
    module = type(array).__module__
    if module.startswith("cupy"):
        import cupy  # lazy: only when the caller already uses cupy

        return cupy
    return np


@dataclass(frozen=True)
class KVBlock:
    """One block's bytes (C-contiguous) and how many of its tokens are real (not padding)."""

    data: Any
    valid_tokens: int


@dataclass(frozen=True)
class KVLayout:
    """What one KV block holds and how big it is.

    Example:
        >>> layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="float16",
        ...                   tokens_per_block=16, tp_rank=0, tp_size=2)
        >>> layout.block_bytes  # 32 layers x K,V x 16 tokens x 4 heads x 128 x 2 bytes
        2097152
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    tokens_per_block: int
    tp_rank: int = 0
    tp_size: int = 1
    kv_factor: int = 2

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "tokens_per_block", "tp_size"):
            if getattr(self, name) < 1:
                raise InvalidArgumentError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_factor not in (1, 2):
            raise InvalidArgumentError(f"kv_factor must be 2 (K and V) or 1 (latent), got "
                                       f"{self.kv_factor}")  # fmt: skip
        if not 0 <= self.tp_rank < self.tp_size:
            raise InvalidArgumentError(f"tp_rank {self.tp_rank} is not in [0, {self.tp_size})")
        if self.num_kv_heads % self.tp_size:
            raise InvalidArgumentError(
                f"num_kv_heads ({self.num_kv_heads}) is not divisible by tp_size "
                f"({self.tp_size}): each rank must hold whole heads"
            )
        dtype_itemsize(self.dtype)

    @property
    def heads_per_rank(self) -> int:
        return self.num_kv_heads // self.tp_size

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, self.kv_factor, self.tokens_per_block, self.heads_per_rank,
                self.head_dim)  # fmt: skip

    @property
    def itemsize(self) -> int:
        return dtype_itemsize(self.dtype)

    @property
    def block_bytes(self) -> int:
        return int(np.prod(self.block_shape)) * self.itemsize

    def _check_tensor(self, kv: Any) -> None:
        itemsize = kv.dtype.itemsize
        if itemsize != self.itemsize:
            raise InvalidArgumentError(
                f"tensor dtype {kv.dtype} has {itemsize}-byte items; the layout says "
                f"{self.dtype} ({self.itemsize} bytes)"
            )

    def split(self, kv: Any, *, num_tokens: int | None = None,
              pad_partial: bool = False) -> list[KVBlock]:  # fmt: skip
        """Cut a KV tensor into aligned blocks.

        Args:
            kv: token-major or block-major tensor (see the module docstring).
            num_tokens: real tokens in `kv` (default: all of it).
            pad_partial: also return the trailing partial block, zero-padded, with its true
                length in `valid_tokens` (by default it is left out, as engines do).

        Raises:
            InvalidArgumentError: the tensor's shape or dtype does not match the layout.
        """
        xp = _xp(kv)
        self._check_tensor(kv)
        tpb = self.tokens_per_block
        inner = (self.heads_per_rank, self.head_dim)
        if kv.ndim == 6:
            if tuple(kv.shape[1:]) != self.block_shape:
                raise InvalidArgumentError(
                    f"block-major tensor has blocks of shape {tuple(kv.shape[1:])}; the layout "
                    f"says {self.block_shape}"
                )
            total = num_tokens if num_tokens is not None else kv.shape[0] * tpb
            if not 0 <= total <= kv.shape[0] * tpb:
                raise InvalidArgumentError(f"num_tokens {total} exceeds the tensor's blocks")
            full, rest = divmod(total, tpb)
            blocks = [KVBlock(xp.ascontiguousarray(kv[i]), tpb) for i in range(full)]
            if rest and pad_partial:
                block = xp.ascontiguousarray(kv[full]).copy()
                block[:, :, rest:] = 0
                blocks.append(KVBlock(block, rest))
            return blocks
        if kv.ndim != 5 or tuple(kv.shape[:2]) != self.block_shape[:2] or \
                tuple(kv.shape[3:]) != inner:  # fmt: skip
            raise InvalidArgumentError(
                f"token-major tensor must be (num_layers={self.num_layers}, "
                f"kv_factor={self.kv_factor}, tokens, heads_per_rank={self.heads_per_rank}, "
                f"head_dim={self.head_dim}); got {tuple(kv.shape)}"
            )
        total = kv.shape[2] if num_tokens is None else num_tokens
        if not 0 <= total <= kv.shape[2]:
            raise InvalidArgumentError(f"num_tokens {total} exceeds the tensor's {kv.shape[2]}")
        full, rest = divmod(total, tpb)
        blocks = [
            KVBlock(xp.ascontiguousarray(kv[:, :, i * tpb : (i + 1) * tpb]), tpb)
            for i in range(full)
        ]
        if rest and pad_partial:
            block = xp.zeros(self.block_shape, dtype=kv.dtype)
            block[:, :, :rest] = kv[:, :, full * tpb : full * tpb + rest]
            blocks.append(KVBlock(block, rest))
        return blocks

    def join(self, blocks: list[KVBlock] | list[Any], *, num_tokens: int | None = None) -> Any:
        """Reassemble blocks into a token-major tensor of `num_tokens` (default: all valid).

        Raises:
            InvalidArgumentError: a block of the wrong size, or no blocks.
        """
        if not blocks:
            raise InvalidArgumentError("no blocks to join")
        items = [b if isinstance(b, KVBlock) else KVBlock(b, self.tokens_per_block)
                 for b in blocks]  # fmt: skip
        first = items[0].data
        xp = _xp(first)
        arrays = []
        for i, item in enumerate(items):
            data = item.data
            if data.nbytes != self.block_bytes:
                raise InvalidArgumentError(
                    f"block {i} holds {data.nbytes} bytes; the layout's blocks are "
                    f"{self.block_bytes}"
                )
            arrays.append(data.reshape(self.block_shape)[:, :, : item.valid_tokens])
        joined = xp.concatenate(arrays, axis=2)
        if num_tokens is not None:
            if num_tokens > joined.shape[2]:
                raise InvalidArgumentError(f"num_tokens {num_tokens} exceeds the blocks' tokens")
            joined = joined[:, :, :num_tokens]
        return joined

    def empty_block(self, *, like: Any = None) -> Any:
        """A new (uninitialised) block buffer, numpy unless `like` is a cupy array."""
        xp = _xp(like) if like is not None else np
        dtype = like.dtype if like is not None else self.numpy_dtype
        return xp.empty(self.block_shape, dtype=dtype)

    @property
    def numpy_dtype(self) -> np.dtype:
        if self.dtype in _DTYPE_BYTES:
            return np.dtype(f"u{self.itemsize}")
        return np.dtype(self.dtype)

    def describe(self) -> dict[str, Any]:
        return {
            "num_layers": self.num_layers, "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim, "dtype": self.dtype,
            "tokens_per_block": self.tokens_per_block, "tp_rank": self.tp_rank,
            "tp_size": self.tp_size, "kv_factor": self.kv_factor,
        }  # fmt: skip
