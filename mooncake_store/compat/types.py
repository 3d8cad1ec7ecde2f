"""The module-level names engines import from `mooncake.store`, besides the store itself.

`ReplicateConfig` carries Mooncake's fields with Mooncake's defaults; `options_of` turns one
into this SDK's put options.  The descriptors are what `get_replica_desc` returns: they report
where the master placed each replica (DRAM and GPU tiers are memory replicas, NVMe is disk).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np

#: Mooncake's default soft-pin TTL (DEFAULT_KV_SOFT_PIN_TTL_MS: 30 minutes).
SOFT_PIN_TTL_S = 30 * 60.0


class ReplicateConfig:
    """How a put places its object (Mooncake's fields and defaults).

    - `replica_num`: copies on distinct nodes (best effort when fewer nodes have room).
    - `with_hard_pin`: never evicted until removed.
    - `with_soft_pin`: kept for `soft_pin_ttl_s` (Mooncake's 30 minutes) unless nothing else
      can be evicted.
    - `preferred_segment` / `preferred_segments`: node ids or data endpoints (what
      `get_hostname()` returns) that receive the replicas when they have room.
    - `prefer_alloc_in_same_node`: prefer the node this client contributed (setup with
      global_segment_size > 0).
    - `group_ids`: one label per key of a batch put (the components of one engine page share
      one).  Here objects are placed, evicted and removed one by one, so a group is written in
      the same batch and nothing more: an engine that needs a whole page checks every
      component with batch_is_exist, as SGLang's and vLLM's connectors do.
    """

    def __init__(self) -> None:
        self.replica_num: int = 1
        self.with_soft_pin: bool = False
        self.with_hard_pin: bool = False
        self.soft_pin_ttl_s: float = SOFT_PIN_TTL_S
        self.preferred_segment: str = ""
        self.preferred_segments: list[str] = []
        self.prefer_alloc_in_same_node: bool = False
        self.group_ids: list[str] = []

    def __str__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"ReplicateConfig({fields})"

    __repr__ = __str__


def options_of(config: ReplicateConfig | None, local_nodes: list[str]) -> dict[str, Any]:
    """The SDK put options that carry out `config` (None: Mooncake's defaults)."""
    config = config or ReplicateConfig()
    preferred = [s for s in [config.preferred_segment, *config.preferred_segments] if s]
    if config.prefer_alloc_in_same_node:
        preferred += local_nodes
    return {
        "replicas": max(1, int(config.replica_num)),
        "pin": bool(config.with_hard_pin),
        "soft_pin_ttl_s": float(config.soft_pin_ttl_s) if config.with_soft_pin else 0.0,
        "preferred_nodes": preferred,
    }


class ReplicaStatus(IntEnum):
    UNDEFINED = 0
    INITIALIZED = 1
    PROCESSING = 2
    COMPLETE = 3
    REMOVED = 4
    FAILED = 5


@dataclass
class Descriptor:
    """A memory replica's buffer: its size, its offset in the node's pool, the node's data
    endpoint (this store hands out offsets in a pool, not raw addresses)."""

    size: int = 0
    buffer_address: int = 0
    transport_endpoint: str = ""


@dataclass
class MemoryDescriptor:
    buffer_descriptor: Descriptor = field(default_factory=Descriptor)


@dataclass
class DiskDescriptor:
    file_path: str = ""
    object_size: int = 0


@dataclass
class ReplicaDescriptor:
    """One replica of an object, from the master's placement."""

    status: ReplicaStatus
    tier: str
    node_id: str
    memory: MemoryDescriptor | None = None
    disk: DiskDescriptor | None = None

    def is_memory_replica(self) -> bool:
        return self.memory is not None

    def is_disk_replica(self) -> bool:
        return self.disk is not None

    def get_memory_descriptor(self) -> MemoryDescriptor:
        if self.memory is None:
            raise RuntimeError("not a memory replica")
        return self.memory

    def get_disk_descriptor(self) -> DiskDescriptor:
        if self.disk is None:
            raise RuntimeError("not a disk replica")
        return self.disk


class BufferHandle:
    """The bytes of one object read by `get_buffer` (buffer protocol, `ptr()`, `size()`)."""

    def __init__(self, data: bytearray) -> None:
        self._data = data
        self._ptr = ctypes.addressof(ctypes.c_char.from_buffer(data)) if len(data) else 0

    def ptr(self) -> int:
        return self._ptr

    def size(self) -> int:
        return len(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __buffer__(self, flags: int) -> memoryview:  # Python 3.12+; bytes() uses tobytes
        return memoryview(self._data)

    def tobytes(self) -> bytes:
        return bytes(self._data)


class MooncakeHostMemAllocator:
    """Host memory handed out by address (SGLang's standalone host pool): `alloc(size)` returns
    the address of a new zero-initialised buffer, `free(address)` releases it."""

    def __init__(self) -> None:
        self._buffers: dict[int, np.ndarray] = {}

    def alloc(self, size: int) -> int:
        buffer = np.zeros(max(1, size), dtype=np.uint8)
        address = int(buffer.ctypes.data)
        self._buffers[address] = buffer
        return address

    def free(self, ptr: int) -> int:
        return 0 if self._buffers.pop(ptr, None) is not None else -600
