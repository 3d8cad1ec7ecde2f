"""Mooncake Store's Python API (`mooncake.store`) over this store, for unchanged engines.

vLLM's, SGLang's and LMCache's Mooncake connectors import
`from mooncake.store import MooncakeDistributedStore, ReplicateConfig`.  These are the same
names; the repository's `compat/` directory holds a `mooncake` alias package that re-exports
them, used only when it is put on the path on purpose (`PYTHONPATH=compat`, docs/ENGINES.md).

    from mooncake_store.compat import MooncakeDistributedStore, ReplicateConfig
    store = MooncakeDistributedStore()
    store.setup("127.0.0.1", "", 0, 0, "tcp", "", "127.0.0.1:50051")
    store.put("key", b"bytes")          # 0
    store.get("key")                    # b"bytes" (b"" when missing)
"""

from mooncake_store.compat.buffers import DeviceBuffer
from mooncake_store.compat.codes import MOONCAKE_CODES
from mooncake_store.compat.store import MooncakeDistributedStore
from mooncake_store.compat.types import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    MooncakeHostMemAllocator,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
)

__all__ = [
    "MOONCAKE_CODES",
    "BufferHandle",
    "Descriptor",
    "DeviceBuffer",
    "DiskDescriptor",
    "MemoryDescriptor",
    "MooncakeDistributedStore",
    "MooncakeHostMemAllocator",
    "ReplicaDescriptor",
    "ReplicaStatus",
    "ReplicateConfig",
]
