"""KVCache: an engine's view of the store, with hashing, layout and identity applied.

layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="float16",
                  tokens_per_block=16)
kv = KVCache(Client("127.0.0.1:50051"), EngineIdentity("llama-3-8b", layout),
             hasher=VllmHasher(tokens_per_block=16))
keys = kv.block_keys(prompt_token_ids)
hit = kv.get_prefix(keys, into=[layout.empty_block() for _ in keys]).matched
... compute blocks hit..len(keys) ...
kv.put_prefix(keys, blocks)        # writes only the blocks the store lacks
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from mooncake_store.client.sync_client import Client
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.kv.hashing import BlockHasher, Xxh3Hasher
from mooncake_store.kv.identity import EngineIdentity
from mooncake_store.kv.layout import KVBlock

_TAG = struct.Struct("<I")  # valid tokens of the block


@dataclass(frozen=True)
class PrefixHit:
    """What `get_prefix` read: `matched` leading blocks and each one's real token count."""

    matched: int
    valid_tokens: list[int]


class KVCache:
    """Prefix-chained KV blocks of one engine identity in a mooncake-store cluster.

    Args:
        store: a connected Client.
        identity: the engine identity every block is stored and read under.
        hasher: how token ids become keys (default: Xxh3Hasher at the layout's block size).
        replicas: copies per block (None: the master's default).
    """

    def __init__(
        self,
        store: Client,
        identity: EngineIdentity,
        *,
        hasher: BlockHasher | None = None,
        replicas: int | None = None,
    ) -> None:
        layout = identity.layout
        self.store = store
        self.identity = identity
        self.layout = layout
        self.hasher = hasher or Xxh3Hasher(tokens_per_block=layout.tokens_per_block)
        if self.hasher.tokens_per_block != layout.tokens_per_block:
            raise InvalidArgumentError(
                f"the hasher cuts {self.hasher.tokens_per_block}-token blocks but the layout "
                f"holds {layout.tokens_per_block}"
            )
        self.replicas = replicas
        self.fingerprint = identity.fingerprint

    def block_keys(self, tokens: Sequence[int] | np.ndarray, *, extra_keys: Any = None
                   ) -> list[str]:  # fmt: skip
        """Store keys of the full blocks of `tokens` (one per TP rank when tp_size > 1)."""
        keys = self.hasher.block_keys(tokens, extra_keys=extra_keys)
        if self.layout.tp_size > 1:
            suffix = f"@tp{self.layout.tp_rank}of{self.layout.tp_size}"
            keys = [k + suffix for k in keys]
        return keys

    def prefix_match(self, keys: Sequence[str]) -> int:
        """How many leading blocks of `keys` are stored under this identity (one RPC)."""
        return self.store.prefix_match(keys, fingerprint=self.fingerprint)

    def get_prefix(self, keys: Sequence[str], *, into: Sequence[Any]) -> PrefixHit:
        """Read the longest stored prefix of `keys` into the matching block buffers.

        Raises:
            InvalidArgumentError: a buffer is not exactly one block.
        """
        self._check_buffers(into, len(keys))
        read = self.store.get_prefix_into(keys, into, fingerprint=self.fingerprint)
        valid = [_TAG.unpack(t)[0] if len(t) == _TAG.size else self.layout.tokens_per_block
                 for t in read.tags]  # fmt: skip
        return PrefixHit(read.matched, valid)

    def put_prefix(self, keys: Sequence[str], blocks: Sequence[Any]) -> int:
        """Store the blocks of a prefix chain; only the ones the store lacks are written.

        `blocks` are KVBlocks (from `KVLayout.split`) or plain block buffers.  Each block is
        stored with its parent key (the previous block) and its real token count.
        Returns how many blocks were written.
        """
        items = [b if isinstance(b, KVBlock) else KVBlock(b, self.layout.tokens_per_block)
                 for b in blocks]  # fmt: skip
        self._check_buffers([i.data for i in items], len(keys))
        if not keys:
            return 0
        parents = [None, *keys[:-1]]
        results = self.store.put_many(
            list(zip(keys, [i.data for i in items], strict=True)),
            replicas=self.replicas,
            fingerprint=self.fingerprint,
            parents=parents,
            tags=[_TAG.pack(i.valid_tokens) for i in items],
        )
        return sum(1 for r in results if not r.deduplicated)

    def _check_buffers(self, buffers: Sequence[Any], count: int) -> None:
        if len(buffers) != count:
            raise InvalidArgumentError(f"{count} keys but {len(buffers)} block buffers")
        want = self.layout.block_bytes
        for i, buf in enumerate(buffers):
            size = buf.nbytes if hasattr(buf, "nbytes") else memoryview(buf).nbytes
            if size != want:
                raise InvalidArgumentError(
                    f"block buffer {i} holds {size} bytes; this layout's blocks are {want} "
                    "bytes (use KVLayout.empty_block())"
                )
