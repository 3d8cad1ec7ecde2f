"""mooncake-store: a distributed KVCache object store for LLM serving.

from mooncake_store import Client
with Client("127.0.0.1:50051") as store:
    store.put("key", b"bytes")
    assert store.get("key") == b"bytes"
"""

from mooncake_store.client.async_client import AsyncClient
from mooncake_store.client.sync_client import Client
from mooncake_store.client.types import ClusterStats, NodeStatus, PrefixRead, PutResult, Retry
from mooncake_store.common.errors import (
    AccessDeniedError,
    BufferTooSmallError,
    ChecksumMismatchError,
    DataPathError,
    GrantExpiredError,
    IdentityMismatchError,
    InvalidArgumentError,
    InvalidKeyError,
    InvalidValueError,
    MasterTimeoutError,
    MasterUnavailableError,
    MooncakeError,
    NoSpaceError,
    ObjectBusyError,
    ObjectHasLeaseError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
    RpcError,
    SegmentNotFoundError,
    TlsError,
)
from mooncake_store.common.tls import TlsConfig

__version__ = "0.1.0"

__all__ = [
    "AccessDeniedError",
    "AsyncClient",
    "BufferTooSmallError",
    "ChecksumMismatchError",
    "Client",
    "ClusterStats",
    "DataPathError",
    "GrantExpiredError",
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
