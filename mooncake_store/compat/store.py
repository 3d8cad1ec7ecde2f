"""`MooncakeDistributedStore`: Mooncake Store's Python API over this store's SDK.

Engines (vLLM's, SGLang's and LMCache's Mooncake connectors) call it unchanged.  The
conventions are Mooncake's, not the SDK's: writes and removes return 0 or a negative Mooncake
error code (`codes.py`), zero-copy reads return the bytes read or a negative code, batch forms
return lists of those, `get` returns b"" on any failure, `get_buffer` None, and every call
before `setup()` returns -600 (INVALID_PARAMS) in its form.  Buffers are integer addresses
(`buffers.py`); multi-buffer forms store a key's buffers as one object (their concatenation,
with no staging copy) and scatter it back; ranged reads and get sessions live in `ranges.py`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from mooncake_store.client.sync_client import DEFAULT_BUSY_POLL_US, Client
from mooncake_store.client.types import ObjectInfo
from mooncake_store.common.errors import InvalidArgumentError, MooncakeError
from mooncake_store.common.units import parse_size
from mooncake_store.compat import codes
from mooncake_store.compat.buffers import Buffers, DeviceBuffer
from mooncake_store.compat.calls import (
    fail_code,
    fail_codes,
    fail_empty,
    fail_none,
    mooncake_call,
    outcome,
    same_length,
)
from mooncake_store.compat.ranges import RangeMethods, Sessions
from mooncake_store.compat.segment import ContributedSegment
from mooncake_store.compat.types import (
    BufferHandle,
    Descriptor,
    DiskDescriptor,
    MemoryDescriptor,
    ReplicaDescriptor,
    ReplicaStatus,
    ReplicateConfig,
    options_of,
)

log = logging.getLogger("mooncake.compat")

DEFAULT_SEGMENT_BYTES = 16 << 20  # Mooncake's setup() defaults
DEFAULT_LOCAL_BUFFER_BYTES = 16 << 20
DEFAULT_MASTER = "127.0.0.1:50051"
REMOVE_BATCH = 1000
_IGNORED_SETUP_OPTIONS = (
    "enable_client_http_server", "client_http_port", "enable_ssd_offload", "ssd_offload_path",
    "tenant_id", "ipc_socket_path",
)  # fmt: skip


class MooncakeDistributedStore(RangeMethods):
    """Mooncake Store's client API (see the module docstring and docs/ENGINES.md)."""

    def __init__(self) -> None:
        self._client: Client | None = None
        self._segment: ContributedSegment | None = None
        self._buffers = Buffers()
        self._sessions: Sessions | None = None
        self._hostname = ""
        self._lock = threading.Lock()

    # ---- lifecycle --------------------------------------------------------------------------

    def setup(
        self,
        local_hostname: str | dict[str, Any] = "",
        metadata_server: str = "",
        global_segment_size: int | str = DEFAULT_SEGMENT_BYTES,
        local_buffer_size: int | str = DEFAULT_LOCAL_BUFFER_BYTES,
        protocol: str = "tcp",
        rdma_devices: str = "",
        master_server_addr: str = DEFAULT_MASTER,
        engine: object = None,
        *,
        leases: bool = True,
        busy_poll_us: int = DEFAULT_BUSY_POLL_US,
        **options: Any,
    ) -> int:
        """Connect to the master at `master_server_addr`; with `global_segment_size` > 0,
        start a store node of that size owned by this client (stopped at close()).  Also
        `setup(config_dict)` with Mooncake's config keys.  `leases` (config key "leases"):
        the client holds allocation leases, so a steady put is one master round trip
        (`Client(leases=...)`).  `busy_poll_us` (config key "busy_poll_us"): how long a
        thread waits for a reply by polling before it sleeps (`Client(busy_poll_us=...)`; 0
        turns it off).  Returns 0 or a negative code."""
        if isinstance(local_hostname, dict):
            config = local_hostname
            return self.setup(
                str(config.get("local_hostname", "")),
                str(config.get("metadata_server", "")),
                config.get("global_segment_size", DEFAULT_SEGMENT_BYTES),
                config.get("local_buffer_size", DEFAULT_LOCAL_BUFFER_BYTES),
                str(config.get("protocol", "tcp")),
                str(config.get("rdma_devices", config.get("device_name", ""))),
                str(config.get("master_server_addr", config.get("master_server_address", ""))
                    or DEFAULT_MASTER),
                leases=bool(config.get("leases", True)),
                busy_poll_us=config.get("busy_poll_us", DEFAULT_BUSY_POLL_US),
            )  # fmt: skip
        if self._client is not None:
            log.warning("setup() called twice; keeping the first connection")
            return codes.OK
        try:
            segment_bytes = parse_size(global_segment_size)
            parse_size(local_buffer_size)
            busy_poll = int(busy_poll_us)
        except (InvalidArgumentError, ValueError, TypeError, OverflowError) as exc:
            log.error("setup: %s", exc)
            return codes.INVALID_PARAMS
        self._log_notes(metadata_server, local_buffer_size, protocol, rdma_devices, engine, options)
        try:
            client = Client(master_server_addr, leases=leases, busy_poll_us=busy_poll)
        except InvalidArgumentError as exc:
            log.error("setup: %s", exc)
            return codes.INVALID_PARAMS
        try:
            client.connect()
        except Exception as exc:
            client.close()
            log.error("setup: cannot reach the master at %s: %s", master_server_addr, exc)
            return codes.code_of(exc)
        self._hostname = local_hostname
        if segment_bytes > 0:
            try:
                self._segment = self._contribute(client, master_server_addr, segment_bytes)
            except Exception as exc:
                client.close()
                log.error("setup: could not start the contributed store node: %s", exc)
                return (
                    codes.code_of(exc) if isinstance(exc, MooncakeError) else codes.INTERNAL_ERROR
                )
        self._client = client
        self._sessions = Sessions(client)
        return codes.OK

    def _log_notes(
        self, metadata_server: str, local_buffer_size: object, protocol: str,
        rdma_devices: str, engine: object, options: dict[str, Any],
    ) -> None:  # fmt: skip
        if protocol.lower() == "rdma":
            log.info(
                "protocol='rdma' accepted: this store moves bytes through shared memory with nodes "
                "on this host and over TCP with the others (RDMA only where pyverbs and a device "
                "exist); device_name %r is not used", rdma_devices,
            )  # fmt: skip
        elif protocol.lower() != "tcp":
            log.info("protocol=%r accepted; bytes move over shared memory or TCP", protocol)
        log.info(
            "local_buffer_size=%s accepted and not allocated: zero-copy calls copy straight "
            "between the caller's buffers and the pool or socket, with no staging buffer",
            local_buffer_size,
        )
        if metadata_server:
            log.info("metadata_server=%r is not needed here (the master serves metadata)",
                     metadata_server)  # fmt: skip
        if engine is not None:
            log.info("a transfer engine was passed; this store does not use one")
        for name in options:
            level = logging.INFO if name in _IGNORED_SETUP_OPTIONS else logging.WARNING
            log.log(level, "setup option %s=%r accepted and not used here", name, options[name])

    def _contribute(self, client: Client, master: str, size_bytes: int) -> ContributedSegment:
        host = self._hostname.rpartition(":")[0] if ":" in self._hostname else self._hostname
        mounted = {n.node_id for n in client.list_nodes()}
        node_id = self._hostname or f"mooncake-compat-{os.getpid()}"
        if node_id in mounted:
            node_id = f"{node_id}#{os.getpid()}-{id(self) & 0xFFFF:x}"
        segment = ContributedSegment(master, size_bytes, host=host or "127.0.0.1", node_id=node_id)
        deadline = time.monotonic() + 30.0
        while node_id not in {n.node_id for n in client.list_nodes()}:
            if time.monotonic() > deadline or not segment.alive():
                segment.stop()
                raise RuntimeError(f"store node {node_id} did not mount (log: {segment.log_path})")
            time.sleep(0.05)
        return segment

    def setup_dummy(self, mem_pool_size: int, local_buffer_size: int, server_address: str) -> int:
        """SGLang's standalone mode: here `server_address` is taken as the master's address,
        and this client contributes no memory (the standalone store process does)."""
        log.info("setup_dummy: connecting to %s as the master; no memory contributed",
                 server_address)  # fmt: skip
        return self.setup("", "", 0, local_buffer_size, "tcp", "", server_address)

    def init_all(self, protocol: str, device_name: str, mount_segment_size: int = 0) -> int:
        return codes.NOT_SUPPORTED

    def close(self) -> int:
        """Close the connection and stop the contributed store node (draining what it can)."""
        with self._lock:
            client, self._client = self._client, None
            segment, self._segment = self._segment, None
        if self._sessions is not None:
            self._sessions.close_all()
        if client is not None:
            client.close()
        if segment is not None:
            segment.stop()
        return codes.OK

    def __del__(self) -> None:  # Mooncake's store is torn down by its destructor
        try:
            self.close()
        except Exception:
            pass

    def get_hostname(self) -> str:
        """The data endpoint of this client's store node, or the local_hostname given."""
        return self._segment.endpoint if self._segment is not None else self._hostname

    @mooncake_call(lambda args, code: 1 if code == codes.INVALID_PARAMS else 2)
    def health_check(self) -> int:
        """0: healthy; 1: not set up; 2: the master does not answer."""
        assert self._client is not None
        self._client.stats()
        return 0

    def _local_nodes(self) -> list[str]:
        return [self._segment.node_id] if self._segment is not None else []

    def _put_options(self, config: ReplicateConfig | None) -> dict[str, Any]:
        return options_of(config, self._local_nodes())

    # ---- buffers ----------------------------------------------------------------------------

    @mooncake_call(fail_code)
    def register_buffer(self, buffer_ptr: int, size: int) -> int:
        self._buffers.register(buffer_ptr, size)
        return codes.OK

    @mooncake_call(fail_code)
    def unregister_buffer(self, buffer_ptr: int) -> int:
        return codes.OK if self._buffers.unregister(buffer_ptr) else codes.INVALID_PARAMS

    # ---- puts -------------------------------------------------------------------------------

    @mooncake_call(fail_code)
    def put(self, key: str, value: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_each([(key, value)], config)[0]

    @mooncake_call(fail_code)
    def put_parts(self, key: str, *parts: Any, config: ReplicateConfig | None = None) -> int:
        return self._put_each([(key, list(parts))], config, parts=True)[0]

    @mooncake_call(fail_code)
    def put_batch(
        self, keys: Sequence[str], values: Sequence[Any], config: ReplicateConfig | None = None
    ) -> int:
        same_length(keys, values)
        results = self._put_each(list(zip(keys, values, strict=True)), config)
        return next((r for r in results if r != codes.OK), codes.OK)

    @mooncake_call(fail_code)
    def put_from(
        self, key: str, buffer_ptr: int, size: int, config: ReplicateConfig | None = None
    ) -> int:
        return self._put_each([(key, self._buffers.view(buffer_ptr, size))], config)[0]

    @mooncake_call(fail_codes)
    def batch_put_from(
        self,
        keys: Sequence[str],
        buffer_ptrs: Sequence[int],
        sizes: Sequence[int],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        same_length(keys, buffer_ptrs, sizes)
        views = [self._buffers.view(p, s) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        return self._put_each(list(zip(keys, views, strict=True)), config)

    @mooncake_call(fail_codes)
    def batch_put_from_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        config: ReplicateConfig | None = None,
    ) -> list[int]:
        same_length(keys, all_buffer_ptrs, all_sizes)
        parts = [self._parts(p, s) for p, s in zip(all_buffer_ptrs, all_sizes, strict=True)]
        return self._put_each(list(zip(keys, parts, strict=True)), config, parts=True)

    def _put_each(
        self, items: list[tuple[str, Any]], config: ReplicateConfig | None, *, parts: bool = False
    ) -> list[int]:
        """Put every item; per item 0 or its code (a bad key fails alone, not the batch)."""
        assert self._client is not None
        out = [codes.OK] * len(items)
        good = []
        for n, (key, _) in enumerate(items):
            if not isinstance(key, str) or not key:
                out[n] = codes.INVALID_KEY
            else:
                good.append(n)
        if good:
            results = self._client.put_many_outcomes(
                [items[n] for n in good], parts=parts, **self._put_options(config)
            )
            for n, result in zip(good, results, strict=True):
                out[n] = outcome(result)
        return out

    # ---- gets -------------------------------------------------------------------------------

    @mooncake_call(fail_empty)
    def get(self, key: str) -> bytes:
        assert self._client is not None
        return self._client.get(key)

    @mooncake_call(lambda args, code: [b""] * len(args[0]) if args else [])
    def get_batch(self, keys: Sequence[str]) -> list[bytes]:
        assert self._client is not None
        try:
            return self._client.get_many(keys)
        except MooncakeError:  # some key failed: each on its own, b"" for the failures
            return [self.get(k) for k in keys]

    @mooncake_call(fail_none)
    def get_buffer(self, key: str) -> BufferHandle | None:
        data = self.get(key)
        return BufferHandle(bytearray(data)) if data else None

    @mooncake_call(lambda args, code: [None] * len(args[0]) if args else [])
    def batch_get_buffer(self, keys: Sequence[str]) -> list[BufferHandle | None]:
        return [BufferHandle(bytearray(d)) if d else None for d in self.get_batch(keys)]

    @mooncake_call(fail_code)
    def get_into(self, key: str, buffer_ptr: int, size: int) -> int:
        return self.batch_get_into([key], [buffer_ptr], [size])[0]  # type: ignore[no-any-return]

    @mooncake_call(fail_codes)
    def batch_get_into(
        self, keys: Sequence[str], buffer_ptrs: Sequence[int], sizes: Sequence[int]
    ) -> list[int]:
        same_length(keys, buffer_ptrs, sizes)
        parts = [self._parts([p], [s]) for p, s in zip(buffer_ptrs, sizes, strict=True)]
        return self._get_each(keys, parts)

    @mooncake_call(fail_codes)
    def batch_get_into_multi_buffers(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        prefer_alloc_in_same_node: bool = False,
    ) -> list[int]:
        """Scatter each object over its buffers; per key the bytes read or a code.  (A read
        takes the closest replica already: a same-host one first.)"""
        same_length(keys, all_buffer_ptrs, all_sizes)
        parts = [self._parts(p, s) for p, s in zip(all_buffer_ptrs, all_sizes, strict=True)]
        return self._get_each(keys, parts)

    def _get_each(self, keys: Sequence[str], parts: list[list[Any]]) -> list[int]:
        """Read every key into its parts; per key the bytes read or its code.  Host parts are
        filled straight; a key read into one device buffer takes the SDK's device path (DMA
        from a same-host pool); device parts of a multi-buffer read go through host staging
        (one copy to the device each)."""
        assert self._client is not None
        single = [
            n for n, p in enumerate(parts) if len(p) == 1 and isinstance(p[0], DeviceBuffer)
        ]  # fmt: skip
        out = [codes.OK] * len(keys)
        if single:
            got = self._get_devices([keys[n] for n in single], [parts[n][0] for n in single])
            for n, result in zip(single, got, strict=True):
                out[n] = result
        rest = [n for n in range(len(keys)) if n not in set(single)]
        if not rest:
            return out
        staged: dict[int, list[tuple[DeviceBuffer, Any]]] = {}
        host_parts: list[list[Any]] = []
        for n in rest:
            row = []
            for part in parts[n]:
                if isinstance(part, DeviceBuffer):
                    import numpy as np

                    host = np.empty(part.size, dtype=np.uint8)
                    staged.setdefault(n, []).append((part, host))
                    row.append(host)
                else:
                    row.append(part)
            host_parts.append(row)
        results = self._client.get_many_into_outcomes([keys[n] for n in rest], host_parts)
        for n, got_n in zip(rest, results, strict=True):
            out[n] = outcome(got_n)
            if n in staged and not isinstance(got_n, MooncakeError):
                import cupy

                for device, host in staged[n]:
                    cupy.asarray(device).set(host)
        return out

    def _get_devices(self, keys: list[str], buffers: list[DeviceBuffer]) -> list[int]:
        assert self._client is not None
        try:
            return list(self._client.get_many_into(keys, buffers))
        except MooncakeError:  # some key failed: each on its own for its code
            results = []
            for key, buffer in zip(keys, buffers, strict=True):
                try:
                    results.append(self._client.get_into(key, buffer))
                except MooncakeError as exc:
                    results.append(codes.code_of(exc))
            return results

    # ---- metadata ---------------------------------------------------------------------------

    @mooncake_call(fail_code)
    def is_exist(self, key: str) -> int:
        assert self._client is not None
        return 1 if self._client.exists(key) else 0

    @mooncake_call(fail_codes)
    def batch_is_exist(self, keys: Sequence[str]) -> list[int]:
        assert self._client is not None
        return [1 if e else 0 for e in self._client.exists_many(keys)]

    @mooncake_call(fail_code)
    def get_size(self, key: str) -> int:
        """The object's size from the master's metadata (no data read), or -704."""
        assert self._client is not None
        [info] = self._client.describe_many([key])
        return info.size_bytes if info is not None else codes.OBJECT_NOT_FOUND

    @mooncake_call(lambda args, code: [])
    def get_replica_desc(self, key: str) -> list[ReplicaDescriptor]:
        return self.batch_get_replica_desc([key]).get(key, [])  # type: ignore[no-any-return]

    @mooncake_call(lambda args, code: {})
    def batch_get_replica_desc(self, keys: Sequence[str]) -> dict[str, list[ReplicaDescriptor]]:
        """Each stored key's replicas from the master's placement (missing keys: absent)."""
        assert self._client is not None
        infos = self._client.describe_many(keys)
        return {k: _descriptors(i) for k, i in zip(keys, infos, strict=True) if i is not None}

    # ---- removal ----------------------------------------------------------------------------

    @mooncake_call(fail_code)
    def remove(self, key: str, force: bool = False) -> int:
        """0, or -704 (no such key), -706 (being read and not `force`), -703 (being put)."""
        return self.batch_remove([key], force)[0]  # type: ignore[no-any-return]

    @mooncake_call(fail_codes)
    def batch_remove(self, keys: Sequence[str], force: bool = False) -> list[int]:
        assert self._client is not None
        return [outcome(r) for r in self._client.remove_many_outcomes(keys, force=force)]

    @mooncake_call(fail_code)
    def remove_by_regex(self, regex_pattern: str, force: bool = False) -> int:
        """Remove every key the pattern matches (re.search); the number removed."""
        try:
            pattern = re.compile(regex_pattern)
        except re.error as exc:
            log.error("remove_by_regex: bad pattern %r: %s", regex_pattern, exc)
            return codes.INVALID_PARAMS
        return self._remove_matching(pattern.search, force)

    @mooncake_call(fail_code)
    def remove_all(self, force: bool = False) -> int:
        """Remove every key (leased ones too with `force`); the number removed."""
        return self._remove_matching(lambda key: True, force)

    def _remove_matching(self, match: Callable[[str], object], force: bool) -> int:
        """Page through the master's key listing and remove what matches, a page at a time."""
        assert self._client is not None
        removed, cursor = 0, ""
        while True:
            page, cursor = self._client.list_keys(cursor=cursor, limit=REMOVE_BATCH)
            keys = [k.key for k in page if match(k.key)]
            if keys:
                outcomes = self._client.remove_many_outcomes(keys, force=force)
                removed += sum(1 for r in outcomes if r is None)
            if not cursor:
                return removed


def _descriptors(info: ObjectInfo) -> list[ReplicaDescriptor]:
    out = []
    for r in info.replicas:
        if r.tier == "NVME":
            disk = DiskDescriptor(file_path=f"{r.node_id}:{r.offset}", object_size=info.size_bytes)
            out.append(ReplicaDescriptor(ReplicaStatus.COMPLETE, r.tier, r.node_id, disk=disk))
        else:
            memory = MemoryDescriptor(Descriptor(info.size_bytes, r.offset, r.endpoint))
            out.append(ReplicaDescriptor(ReplicaStatus.COMPLETE, r.tier, r.node_id, memory=memory))
    return out
