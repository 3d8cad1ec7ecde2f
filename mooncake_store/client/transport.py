"""The client's transport interface: how a flow's data moves to and from store nodes.

A transfer is one node access (`Op.WRITE` of a buffer, or `Op.READ` of a replica into one),
optionally feeding a `Hasher` with the bytes as they move, so the checksum costs no second pass
over memory.  A buffer is one memoryview or a list of them (a scatter-gather object: its parts
move one after the other as one payload), so an object made of several caller buffers moves
with no staging copy.  The implementations, one module each:

- `client/shm.py`: `ShmMapper`, the same-host path: a node's pool mapped once (its memfd
  received over the node's abstract unix socket); a put or get is then a single copy.
- `client/tcp_async.py`: `TcpPool`, the async client's TCP path (`AsyncNodeTransport`).
- `client/tcp_blocking.py`: `BlockingNodeConnections`, the sync client's TCP path, one set per
  thread (`NodeTransport`).
- `client/tcp_wire.py`: what both TCP paths share: request planning (a node's DRAM reads of a
  batch as READV requests), hashed sends and receives, connection errors.
- `client/cuda.py`: device buffers, DMA with the registered pool, the GPU tier over CUDA IPC.

TCP connections speak TLS when the client has TLS settings (common/tls.py).  Failures are
DataPathError (AccessDeniedError, GrantExpiredError when the node refused the grant).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.checksum import ChunkedHasher
from mooncake_store.common.errors import MooncakeError
from mooncake_store.common.wire import Op

if TYPE_CHECKING:  # the old names, for type checkers (at run time: __getattr__ below)
    from mooncake_store.client.shm import ShmMapper as ShmMapper
    from mooncake_store.client.tcp_async import TcpPool as TcpPool
    from mooncake_store.client.tcp_blocking import (
        BlockingNodeConnections as BlockingNodeConnections,
    )
    from mooncake_store.client.tcp_wire import _READV_BYTES as _READV_BYTES
    from mooncake_store.client.tcp_wire import plan_node_requests as plan_node_requests
    from mooncake_store.client.tcp_wire import write_hashed as write_hashed

Hasher = ChunkedHasher  # the object checksum (common/checksum.py), fed piece by piece

Buffer = memoryview | list[memoryview]  # one buffer, or the parts of one object in order

Transfer = tuple[ReplicaLocation, Op, Buffer]


def nbytes(buffer: Buffer) -> int:
    """Bytes of a transfer's buffer (the sum of its parts)."""
    return len(buffer) if isinstance(buffer, memoryview) else sum(len(p) for p in buffer)


def flatten(
    buffers: Sequence[Buffer], hashers: Sequence[Hasher | None]
) -> tuple[list[memoryview], list[Hasher | None]]:
    """The destinations of several reads in reply order, each with its read's hasher (a
    scatter-gather read feeds one hasher from each of its parts in turn)."""
    views: list[memoryview] = []
    fed: list[Hasher | None] = []
    for buffer, hasher in zip(buffers, hashers, strict=True):
        parts = [buffer] if isinstance(buffer, memoryview) else buffer
        views += parts
        fed += [hasher] * len(parts)
    return views, fed


class NodeTransport(Protocol):
    """A blocking data path to store nodes (the sync client's, per thread)."""

    def exchange(
        self, loc: ReplicaLocation, op: Op, buffer: Buffer, *, hasher: Hasher | None = None
    ) -> None:
        """WRITE `buffer` to the replica, or READ the replica into it, feeding `hasher`."""

    def exchange_many(
        self, transfers: list[Transfer], hashers: Sequence[Hasher | None] | None = None
    ) -> list[MooncakeError | None]:
        """Every transfer (pipelined per node): one error or None each."""

    def close(self) -> None: ...


class AsyncNodeTransport(Protocol):
    """The same data path for an event loop (the async client's)."""

    async def exchange(
        self, loc: ReplicaLocation, op: Op, buffer: Buffer, *, hasher: Hasher | None = None
    ) -> None: ...

    async def exchange_many(
        self, transfers: list[Transfer], hashers: Sequence[Hasher | None] | None = None
    ) -> list[MooncakeError | None]: ...

    def close(self) -> None: ...


_MOVED = {
    "ShmMapper": "mooncake_store.client.shm",
    "TcpPool": "mooncake_store.client.tcp_async",
    "BlockingNodeConnections": "mooncake_store.client.tcp_blocking",
    "plan_node_requests": "mooncake_store.client.tcp_wire",
    "write_hashed": "mooncake_store.client.tcp_wire",
    "_READV_BYTES": "mooncake_store.client.tcp_wire",
}


def __getattr__(name: str) -> Any:
    """The implementations, under the names this module had before they moved out."""
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
