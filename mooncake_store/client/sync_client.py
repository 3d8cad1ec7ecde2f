"""Client: the synchronous facade over AsyncClient.

It runs one private event loop on a daemon thread and submits each call to it, so the logic
exists once (in AsyncClient) and blocking callers, threads included, share one channel and one
set of node connections.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from mooncake_store.client.async_client import DEFAULT_MASTER, AsyncClient
from mooncake_store.client.types import ClusterStats, NodeStatus, PrefixRead, PutResult

T = TypeVar("T")


class Client:
    """Synchronous client; takes the same arguments as AsyncClient.

    Example:
        with Client("127.0.0.1:50051") as store:
            store.put("key", b"bytes")
            assert store.get("key") == b"bytes"
    """

    def __init__(self, master: str = DEFAULT_MASTER, **options: Any) -> None:
        self._async = AsyncClient(master, **options)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mooncake-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def master(self) -> str:
        return self._async.master

    @property
    def counters(self) -> dict[str, int]:
        """Transfers by data path and checksum failures (see AsyncClient.counters)."""
        return dict(self._async.counters)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def connect(self) -> Client:
        self._run(self._async.connect())
        return self

    def close(self) -> None:
        """Close connections and stop the client's thread (idempotent)."""
        if self._closed:
            return
        self._run(self._async.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> Client:
        try:
            return self.connect()
        except BaseException:
            self.close()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def put(self, key: str, value: object, **options: Any) -> PutResult:
        return self._run(self._async.put(key, value, **options))

    def put_from(self, key: str, buffer: object, **options: Any) -> PutResult:
        return self._run(self._async.put_from(key, buffer, **options))

    def put_many(
        self, items: Mapping[str, object] | Iterable[tuple[str, object]], **options: Any
    ) -> list[PutResult]:
        return self._run(self._async.put_many(items, **options))

    def get(self, key: str, *, fingerprint: bytes = b"") -> bytes:
        return self._run(self._async.get(key, fingerprint=fingerprint))

    def get_many(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> list[bytes]:
        return self._run(self._async.get_many(keys, fingerprint=fingerprint))

    def get_into(self, key: str, buffer: object, *, fingerprint: bytes = b"") -> int:
        return self._run(self._async.get_into(key, buffer, fingerprint=fingerprint))

    def get_many_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> list[int]:
        return self._run(self._async.get_many_into(keys, buffers, fingerprint=fingerprint))

    def prefix_match(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> int:
        return self._run(self._async.prefix_match(keys, fingerprint=fingerprint))

    def get_prefix_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> PrefixRead:
        return self._run(self._async.get_prefix_into(keys, buffers, fingerprint=fingerprint))

    def exists(self, key: str) -> bool:
        return self._run(self._async.exists(key))

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        return self._run(self._async.exists_many(keys))

    def remove(self, key: str) -> bool:
        return self._run(self._async.remove(key))

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        return self._run(self._async.remove_many(keys))

    def stats(self) -> ClusterStats:
        return self._run(self._async.stats())

    def list_nodes(self) -> list[NodeStatus]:
        return self._run(self._async.list_nodes())

    # Copy the method docs from the async client: one source of truth.
    for _name in (
        "put",
        "put_from",
        "put_many",
        "get",
        "get_many",
        "get_into",
        "get_many_into",
        "exists",
        "exists_many",
        "remove",
        "remove_many",
        "stats",
        "list_nodes",
    ):
        locals()[_name].__doc__ = getattr(AsyncClient, _name).__doc__
    del _name
