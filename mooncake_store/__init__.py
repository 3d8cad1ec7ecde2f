"""mooncake-store: a distributed KVCache object store for LLM serving.

from mooncake_store import Client
with Client("127.0.0.1:50051") as store:
    store.put("key", b"bytes")
    assert store.get("key") == b"bytes"

The client classes are imported on first use (PEP 562 `__getattr__`), so the daemons, which
import this package too, do not load the client SDK.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mooncake_store.common.errors import (
    AccessDeniedError,
    BufferTooSmallError,
    ChecksumMismatchError,
    DataPathError,
    GrantExpiredError,
    IdentityConflictError,
    IdentityMismatchError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidValueError,
    MasterTimeoutError,
    MasterUnavailableError,
    MooncakeError,
    NoSpaceError,
    ObjectBusyError,
    ObjectConflictError,
    ObjectHasLeaseError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
    RpcError,
    SegmentNotFoundError,
    TlsError,
)
from mooncake_store.common.tls import TlsConfig
from mooncake_store.common.version import __version__ as __version__

if TYPE_CHECKING:
    from mooncake_store.client.async_client import AsyncClient
    from mooncake_store.client.sync_client import Client
    from mooncake_store.client.types import ClusterStats, NodeStatus, PrefixRead, PutResult, Retry

_LAZY = {
    "AsyncClient": "mooncake_store.client.async_client",
    "Client": "mooncake_store.client.sync_client",
    "ClusterStats": "mooncake_store.client.types",
    "NodeStatus": "mooncake_store.client.types",
    "PrefixRead": "mooncake_store.client.types",
    "PutResult": "mooncake_store.client.types",
    "Retry": "mooncake_store.client.types",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mooncake_store' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "AccessDeniedError",
    "AsyncClient",
    "BufferTooSmallError",
    "ChecksumMismatchError",
    "Client",
    "ClusterStats",
    "DataPathError",
    "GrantExpiredError",
    "IdentityConflictError",
    "IdentityMismatchError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "InvalidValueError",
    "MasterTimeoutError",
    "MasterUnavailableError",
    "MooncakeError",
    "NoSpaceError",
    "NodeStatus",
    "ObjectBusyError",
    "ObjectConflictError",
    "ObjectHasLeaseError",
    "ObjectNotFoundError",
    "PrefixRead",
    "PutResult",
    "ReplicaUnavailableError",
    "Retry",
    "RpcError",
    "SegmentNotFoundError",
    "TlsConfig",
    "TlsError",
]
