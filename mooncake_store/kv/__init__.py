"""The KV-cache layer: block keys compatible with vLLM / SGLang / Dynamo, aligned KV blocks,
engine identities, and prefix operations.

    from mooncake_store import Client
    from mooncake_store.kv import EngineIdentity, KVCache, KVLayout, VllmHasher
"""

from mooncake_store.kv.cache import KVCache, PrefixHit
from mooncake_store.kv.hashing import (
    HASHERS,
    BlockHasher,
    DynamoHasher,
    SglangHasher,
    VllmHasher,
    Xxh3Hasher,
)
from mooncake_store.kv.identity import EngineIdentity
from mooncake_store.kv.layout import KVBlock, KVLayout

__all__ = [
    "HASHERS",
    "BlockHasher",
    "DynamoHasher",
    "EngineIdentity",
    "KVBlock",
    "KVCache",
    "KVLayout",
    "PrefixHit",
    "SglangHasher",
    "VllmHasher",
    "Xxh3Hasher",
]
