"""The identity a KV block is stored under, and its fingerprint.

Two engines can produce the same key string for different tensors: the same tokens under
another model, dtype, layout, TP rank, LoRA adapter or cache salt.  Every block is stored with
the fingerprint of its writer's identity, and the master refuses a read that presents another
one, so a wrong-model or wrong-dtype hit cannot happen even when keys collide.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import xxhash

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.kv import cbor
from mooncake_store.kv.layout import KVLayout


@dataclass(frozen=True)
class EngineIdentity:
    """Everything that makes two engines' KV bytes for the same tokens differ."""

    model: str
    layout: KVLayout
    revision: str = ""
    lora: str = ""
    cache_salt: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.model:
            raise InvalidArgumentError("model must name the model, e.g. 'meta-llama/Llama-3-8B'")

    def describe(self) -> dict[str, object]:
        return {
            "model": self.model, "revision": self.revision, "lora": self.lora,
            "cache_salt": self.cache_salt, "layout": self.layout.describe(),
            "extra": dict(self.extra),
        }  # fmt: skip

    @property
    def fingerprint(self) -> bytes:
        """16 bytes: xxh3_128 of the canonical CBOR of `describe()`."""
        return xxhash.xxh3_128_digest(b"mooncake-store/identity/v1\0" + cbor.dumps(self.describe()))
