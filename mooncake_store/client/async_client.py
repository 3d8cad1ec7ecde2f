"""AsyncClient: the client logic, written once (the sync `Client` is a facade over it).

A put is two-phase: one BatchPutStart for the whole batch (the master allocates replicas on
distinct nodes), the bytes go straight to the nodes (shared memory on this host, TCP otherwise),
then one BatchPutEnd commits them with their xxh3_64 checksums; a put whose every replica failed
is revoked, so a half-written object is never visible.  A get asks for replica locations (one
BatchGetReplicaList, which grants a read lease), copies from the closest replica and verifies
the checksum, falling back to the next replica on any failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import xxhash

from mooncake_store.client.device import (
    HostStaging,
    PinnedStaging,
    device_bytes,
    is_device_buffer,
    to_host,
)
from mooncake_store.client.master_client import (
    MasterCall,
    MasterClient,
    exists_call,
    get_prefix_call,
    get_replica_list_call,
    prefix_match_call,
    put_end_call,
    put_revoke_call,
    put_start_call,
    remove_call,
)
from mooncake_store.client.transport import ShmMapper, TcpPool
from mooncake_store.client.types import (
    ClusterStats,
    NodeStatus,
    PrefixRead,
    PutPlan,
    PutResult,
    PutSpec,
    ReplicaList,
    ReplicaLocation,
    Retry,
)
from mooncake_store.common.errors import (
    BufferTooSmallError,
    ChecksumMismatchError,
    DataPathError,
    GrantExpiredError,
    InvalidArgumentError,
    InvalidValueError,
    MooncakeError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.common.wire import Op

T = TypeVar("T")

DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_MAX_VALUE_BYTES = 1 << 30


def checksum(data: Any) -> int:
    """The xxh3_64 checksum stored with every object."""
    return xxhash.xxh3_64_intdigest(data)


_FUSE_CHUNK = 1 << 20  # in cache when the hash reads it; big enough for memcpy's fast path


def copy_checksum(dest: memoryview, src: memoryview) -> int:
    """Copy `src` into `dest` (same length) and return the checksum of `dest`.

    Copying and hashing in cache-sized steps reads memory once instead of twice.  On these VMs,
    between a shared-memory pool and numpy buffers at 1-16 MiB: copy-then-hash 8.0-9.8 GB/s,
    1 MiB steps 8.8-10.2 GB/s; 256 KiB steps fall to 5-6 GB/s on reads.  The copy is
    numpy's, which releases the GIL (a memoryview assignment holds it), so the threads of one
    process copy in parallel.
    """
    n = len(src)
    to = np.frombuffer(dest, dtype=np.uint8)
    frm = np.frombuffer(src, dtype=np.uint8)
    if n <= _FUSE_CHUNK:
        np.copyto(to, frm)
        return xxhash.xxh3_64_intdigest(dest)
    h = xxhash.xxh3_64()
    for start in range(0, n, _FUSE_CHUNK):
        stop = min(start + _FUSE_CHUNK, n)
        np.copyto(to[start:stop], frm[start:stop])
        h.update(dest[start:stop])
    return h.intdigest()


@dataclass(frozen=True, slots=True)
class MapPools:
    """Step: map the DRAM pools of `replicas` whose nodes share this host (once per pool)."""

    replicas: Sequence[ReplicaLocation]


@dataclass(frozen=True, slots=True)
class Transfer:
    """One node access over TCP: write `buffer` to, or read the replica into, `buffer`."""

    op: Op
    loc: ReplicaLocation
    buffer: memoryview


@dataclass(frozen=True, slots=True)
class Transfers:
    """Step: run the transfers; the result is one MooncakeError or None per transfer."""

    transfers: Sequence[Transfer]


# An operation written once as a generator of steps: master calls, pool mapping and TCP
# transfers.  The async client awaits each step (`AsyncClient._drive`, transfers in parallel);
# the sync Client takes them in the calling thread on blocking sockets of its own.
Step = MasterCall[Any] | MapPools | Transfers
Flow = Generator[Step, Any, T]


def as_readable(value: object, *, what: str = "value") -> memoryview:
    """A flat byte view of any C-contiguous buffer-protocol object, or InvalidValueError."""
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        hint = " (encode str with .encode())" if isinstance(value, str) else ""
        raise InvalidValueError(
            f"{what} must be a bytes-like object (bytes, bytearray, memoryview, numpy array), "
            f"got {type(value).__name__}{hint}"
        ) from None
    if not view.c_contiguous:
        raise InvalidValueError(
            f"{what} must be C-contiguous; pass numpy.ascontiguousarray(x) instead"
        )
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def as_writable(buffer: object) -> memoryview:
    view = as_readable(buffer, what="buffer")
    if view.readonly:
        raise InvalidValueError("buffer is read-only; pass a bytearray, numpy array or similar")
    return view


@dataclass(slots=True)
class _Pending:
    key: str
    value: memoryview
    spec: PutSpec
    plan: PutPlan | None = None
    failed: list[int] | None = None
    error: MooncakeError | None = None
    checksum: int = 0

    def landed(self) -> bool:
        """True once at least one replica was written."""
        return (
            self.plan is not None
            and self.failed is not None
            and len(self.failed) < len(self.plan.replicas)
        )


class AsyncClient:
    """Asynchronous client of a mooncake-store cluster.

    Example:
        async with AsyncClient("127.0.0.1:50051") as store:
            await store.put("block-0", b"kv bytes")
            data = await store.get("block-0")

    Args:
        master: the master's host:port.
        replicas: copies per put (None: the master's default); puts take `replicas=` too.
        timeout_s: deadline of each master call and each data transfer.
        local_shm: copy through shared memory when a replica's node is on this host.
        max_value_bytes: largest value accepted (a bigger one is a caller error).
        retry: how master calls retry while the master is unreachable.
        framed: make master calls on the master's framed endpoint when it has one (one
            persistent pipelined connection, ~10x cheaper per call than grpc.aio); False
            keeps every call on gRPC.
    """

    def __init__(
        self,
        master: str = DEFAULT_MASTER,
        *,
        replicas: int | None = None,
        timeout_s: float = 10.0,
        local_shm: bool = True,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        retry: Retry | None = None,
        framed: bool = True,
    ) -> None:
        if replicas is not None and replicas < 1:
            raise InvalidArgumentError(f"replicas must be >= 1, got {replicas}")
        if timeout_s <= 0:
            raise InvalidArgumentError(f"timeout_s must be > 0, got {timeout_s}")
        self.master = master
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.local_shm = local_shm
        self.max_value_bytes = max_value_bytes
        self.retry = retry or Retry()
        self.framed = framed
        self._master: MasterClient | None = None
        self._shm = ShmMapper()
        self._tcp = TcpPool(timeout_s=timeout_s)
        self._pinned = PinnedStaging()
        self._staging = HostStaging()
        #: Transfers by data path, and replicas that failed their checksum on read.
        #: Reads served per tier (dram_reads, nvme_reads, gpu_reads).  Master calls by
        #: endpoint (framed_calls, grpc_calls).
        self.counters: dict[str, int] = dict.fromkeys(
            ("shm_writes", "tcp_writes", "shm_reads", "tcp_reads", "checksum_failures",
             "dram_reads", "nvme_reads", "gpu_reads", "framed_calls", "grpc_calls"), 0,
        )  # fmt: skip

    # ---- lifecycle --------------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Open the channel and wait until the master answers.

        Raises:
            MasterUnavailableError: the master did not answer within `timeout_s`.
        """
        await self._master_client().wait_ready(self.timeout_s)
        return self

    async def close(self) -> None:
        if self._master is not None:
            await self._master.close()
            self._master = None
        self._tcp.close()
        self._shm.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _master_client(self) -> MasterClient:
        if self._master is None:
            self._master = MasterClient(
                self.master, timeout_s=self.timeout_s, retry=self.retry, framed=self.framed,
                counters=self.counters,
            )  # fmt: skip
        return self._master

    async def _drive(self, flow: Flow[T]) -> T:
        """Run an operation's steps on this loop."""
        master = self._master_client()
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            cleanup, error = error is not None, None
            try:
                if isinstance(step, MasterCall):
                    call = master.run(step)
                    # A step taken while unwinding a cancellation must not be cancelled too.
                    value = await (asyncio.shield(call) if cleanup else call)
                elif isinstance(step, Transfers):
                    value = await self._transfer_all(step.transfers)
                else:
                    await self._map_pools(step.replicas)
                    value = None
            except BaseException as exc:
                error = exc

    async def _transfer_all(self, transfers: Sequence[Transfer]) -> list[MooncakeError | None]:
        results = await asyncio.gather(
            *(self._tcp.exchange(t.loc, t.op, t.buffer) for t in transfers),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, MooncakeError):
                raise result
        return results  # type: ignore[return-value]

    async def _map_pools(self, replicas: Sequence[ReplicaLocation]) -> None:
        loop = asyncio.get_running_loop()
        for loc in self._unmapped(replicas):
            await loop.run_in_executor(None, self._shm.map, loc)

    def _unmapped(self, replicas: Sequence[ReplicaLocation]) -> list[ReplicaLocation]:
        """One replica per same-host-candidate DRAM pool that is not mapped yet."""
        if not self.local_shm:
            return []
        seen: dict[int, ReplicaLocation] = {}
        for loc in replicas:
            if loc.tier != "DRAM" or self._shm.cached(loc) is not None:
                continue
            if self._shm.worth_probing(loc):
                seen.setdefault(loc.segment_id, loc)
        return list(seen.values())

    # ---- puts -------------------------------------------------------------------------------

    async def put(
        self,
        key: str,
        value: object,
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parent: str | None = None,
        tag: bytes = b"",
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> PutResult:
        """Store `value` (any bytes-like object) under `key`.

        A put of a key that already exists succeeds without writing (keys name content).
        `fingerprint` records the writer's identity (a read presenting another one is refused),
        `parent` the previous block of the key's prefix chain, `tag` up to 256 bytes of
        metadata returned by prefix reads.  `pin=True` protects the object from eviction
        (for `pin_ttl_s` seconds, or until removed when 0).

        Raises:
            InvalidKeyError / InvalidValueError: bad key or value.
            NoSpaceError: no node has room.  ObjectBusyError: a put of `key` is in progress.
            IdentityMismatchError: `key` is stored under another fingerprint.
            DataPathError: no replica could be written (nothing is left visible).
        """
        return await self._drive(
            self._put_flow(
                key, value, replicas=replicas, fingerprint=fingerprint, parent=parent, tag=tag,
                pin=pin, pin_ttl_s=pin_ttl_s,
            )
        )  # fmt: skip

    def _put_flow(
        self,
        key: str,
        value: object,
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parent: str | None = None,
        tag: bytes = b"",
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> Flow[PutResult]:
        results = yield from self._put_many_flow(
            [(key, value)], replicas=replicas, fingerprint=fingerprint,
            parents=None if parent is None else [parent], tags=[tag], pin=pin,
            pin_ttl_s=pin_ttl_s,
        )  # fmt: skip
        return results[0]

    async def put_from(
        self,
        key: str,
        buffer: object,
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parent: str | None = None,
        tag: bytes = b"",
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> PutResult:
        """Store the bytes of `buffer` (numpy array, memoryview, ...) without an extra copy."""
        return await self.put(
            key, buffer, replicas=replicas, fingerprint=fingerprint, parent=parent, tag=tag,
            pin=pin, pin_ttl_s=pin_ttl_s,
        )  # fmt: skip

    async def put_many(
        self,
        items: Mapping[str, object] | Iterable[tuple[str, object]],
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parents: Sequence[str | None] | None = None,
        tags: Sequence[bytes] | None = None,
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> list[PutResult]:
        """Store many objects with one BatchPutStart and one BatchPutEnd.

        `parents` and `tags`, when given, hold one entry per item.  Every item is attempted; if
        any fails, the error of the first failure is raised after the others are committed
        (retrying the batch is safe: stored keys deduplicate).
        """
        return await self._drive(
            self._put_many_flow(
                items, replicas=replicas, fingerprint=fingerprint, parents=parents, tags=tags,
                pin=pin, pin_ttl_s=pin_ttl_s,
            )
        )  # fmt: skip

    def _put_many_flow(
        self,
        items: Mapping[str, object] | Iterable[tuple[str, object]],
        *,
        replicas: int | None = None,
        fingerprint: bytes = b"",
        parents: Sequence[str | None] | None = None,
        tags: Sequence[bytes] | None = None,
        pin: bool = False,
        pin_ttl_s: float = 0.0,
    ) -> Flow[list[PutResult]]:
        pairs = list(items.items()) if isinstance(items, Mapping) else list(items)
        for name, extra in (("parents", parents), ("tags", tags)):
            if extra is not None and len(extra) != len(pairs):
                raise InvalidArgumentError(f"{len(pairs)} items but {len(extra)} {name}")
        wanted = self._replicas(replicas)
        pending: list[_Pending] = []
        seen: set[str] = set()
        for i, (key, value) in enumerate(pairs):
            validate_key(key)
            if key in seen:  # a repeated key in one batch names the same content: write it once
                continue
            seen.add(key)
            view = as_readable(to_host(value) if is_device_buffer(value) else value)
            if len(view) == 0:
                raise InvalidValueError(f"value of {key!r} is empty; store at least 1 byte")
            if len(view) > self.max_value_bytes:
                raise InvalidValueError(
                    f"value of {key!r} is {len(view)} bytes, over max_value_bytes "
                    f"({self.max_value_bytes}); split it into blocks"
                )
            spec = PutSpec(
                key, len(view), wanted, bytes(fingerprint),
                (parents[i] or "") if parents is not None else "",
                bytes(tags[i]) if tags is not None else b"", pin, pin_ttl_s,
            )  # fmt: skip
            pending.append(_Pending(key, view, spec))
        if not pending:
            return []
        plans = yield put_start_call([p.spec for p in pending])
        for p, plan in zip(pending, plans, strict=True):
            if isinstance(plan, MooncakeError):
                p.error = plan
            else:
                p.plan = plan
        to_write = [p for p in pending if p.plan is not None and not p.plan.already_exists]
        try:
            # Replicas in pools already mapped on this host are plain copies: no task each.
            remote = [p for p in to_write if not self._write_local(p)]
            if remote:
                yield from self._write_remote(remote)
        except GeneratorExit:
            raise
        except BaseException:
            # Cancelled or broken mid-write: leave nothing pending behind (best effort; the
            # master also reclaims puts that never end).
            if to_write:
                yield put_revoke_call([p.key for p in to_write])
            raise
        to_end = [p for p in to_write if p.landed()]
        to_revoke = [p for p in to_write if not p.landed()]
        committed: dict[str, int] = {}
        if to_end:
            ends = yield put_end_call([(p.key, p.checksum, p.failed or ()) for p in to_end])
            for p, end in zip(to_end, ends, strict=True):
                if isinstance(end, MooncakeError):
                    p.error = end
                else:
                    committed[p.key] = end
        if to_revoke:
            yield put_revoke_call([p.key for p in to_revoke])
            for p in to_revoke:
                p.error = p.error or DataPathError(f"no replica of {p.key!r} could be written")
        for p in pending:
            if p.error is not None:
                raise p.error
        first = {p.key: p.plan is not None and p.plan.already_exists for p in pending}
        results = []
        for key, _ in pairs:
            if key in first:
                results.append(PutResult(key, committed.get(key, 0), first.pop(key)))
            else:  # a repeat within the batch
                results.append(PutResult(key, 0, True))
        return results

    def _write_remote(self, pending: list[_Pending]) -> Flow[None]:
        """Write every replica of `pending`: same-host pools by copy, the rest over TCP."""
        yield MapPools([loc for p in pending for loc in p.plan.replicas])  # type: ignore[union-attr]
        remote: list[tuple[_Pending, ReplicaLocation]] = []
        for p in pending:
            assert p.plan is not None
            p.failed = []
            hashed = False
            for loc in p.plan.replicas:
                pool = self._mapped(loc)
                if pool is None:
                    remote.append((p, loc))
                    continue
                dest = pool[loc.offset : loc.offset + len(p.value)]
                if hashed:
                    dest[:] = p.value
                else:
                    p.checksum, hashed = copy_checksum(dest, p.value), True
                self.counters["shm_writes"] += 1
            if not hashed:
                p.checksum = checksum(p.value)
        if remote:
            results = yield Transfers([Transfer(Op.WRITE, loc, p.value) for p, loc in remote])
            for (p, loc), err in zip(remote, results, strict=True):
                if err is None:
                    self.counters["tcp_writes"] += 1
                    continue
                assert p.failed is not None
                p.failed.append(loc.segment_id)
                p.error = p.error or DataPathError(
                    f"writing {p.key!r} to node {loc.node_id} failed: {err}"
                )
        for p in pending:
            if p.landed():
                p.error = None  # at least one replica landed: the put succeeds

    # ---- gets -------------------------------------------------------------------------------

    async def get(self, key: str, *, fingerprint: bytes = b"") -> bytes:
        """Return the bytes stored under `key`.

        Raises:
            ObjectNotFoundError (a KeyError): no such key.
            IdentityMismatchError: `fingerprint` is given and the object has another.
            ReplicaUnavailableError / ChecksumMismatchError: no replica gave verified bytes.
        """
        return (await self.get_many([key], fingerprint=fingerprint))[0]

    async def get_many(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> list[bytes]:
        """Return the values of `keys`, in order, with one BatchGetReplicaList.

        Raises:
            ObjectNotFoundError: naming every missing key (`.keys` lists them).
        """
        return await self._drive(self._get_many_flow(keys, fingerprint))

    def _get_many_flow(self, keys: Sequence[str], fingerprint: bytes) -> Flow[list[bytes]]:
        keys = [validate_key(k) for k in keys]
        infos = self._checked(keys, (yield get_replica_list_call(keys, fingerprint)))
        out: list[bytes | None] = [self._take_local(i) for i in infos]
        remote = [n for n, data in enumerate(out) if data is None]
        if remote:
            # Read through warm staging buffers, then one copy into the new bytes.
            staging = [self._staging.take(infos[n].size_bytes) for n in remote]
            try:
                views = [
                    memoryview(b)[: infos[n].size_bytes]
                    for n, b in zip(remote, staging, strict=True)
                ]
                yield from self._read_all(
                    [keys[n] for n in remote], [infos[n] for n in remote], views, fingerprint
                )
                for n, view in zip(remote, views, strict=True):
                    out[n] = bytes(view)
            finally:
                for buf in staging:
                    self._staging.give(buf)
        return out  # type: ignore[return-value]

    async def get_into(self, key: str, buffer: object, *, fingerprint: bytes = b"") -> int:
        """Copy the value of `key` into `buffer` (writable, C-contiguous); return its size.

        Raises:
            BufferTooSmallError: `buffer` is smaller than the object.
            ObjectNotFoundError, ReplicaUnavailableError, ChecksumMismatchError: as for get().
        """
        return (await self.get_many_into([key], [buffer], fingerprint=fingerprint))[0]

    async def get_many_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> list[int]:
        """Copy many values into the matching buffers with one master call; return sizes."""
        return await self._drive(self._get_many_into_flow(keys, buffers, fingerprint))

    def _get_many_into_flow(
        self, keys: Sequence[str], buffers: Sequence[object], fingerprint: bytes
    ) -> Flow[list[int]]:
        if len(keys) != len(buffers):
            raise InvalidArgumentError(f"{len(keys)} keys but {len(buffers)} buffers")
        keys = [validate_key(k) for k in keys]
        views, devices = self._targets(buffers)
        try:
            results = yield get_replica_list_call(keys, fingerprint)
            infos = self._checked(keys, results)
            yield from self._read_all(keys, infos, views, fingerprint)
            self._to_devices(devices, infos)
        finally:
            self._release(devices)
        return [info.size_bytes for info in infos]

    async def prefix_match(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> int:
        """Length of the longest leading run of `keys` that is stored (one RPC).

        A key stored under another fingerprint ends the run.  Like `exists`, this is a probe:
        it does not count as a read.
        """
        return await self._drive(self._prefix_match_flow(keys, fingerprint))

    def _prefix_match_flow(self, keys: Sequence[str], fingerprint: bytes) -> Flow[int]:
        keys = [validate_key(k) for k in keys]
        return (yield prefix_match_call(keys, fingerprint))  # type: ignore[no-any-return]

    async def get_prefix_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> PrefixRead:
        """Read the longest stored leading run of `keys` into the matching buffers.

        One master call finds the run and leases it; the blocks are then copied in parallel.
        Returns how many keys were read, with their sizes and tags.
        """
        return await self._drive(self._get_prefix_into_flow(keys, buffers, fingerprint))

    def _get_prefix_into_flow(
        self, keys: Sequence[str], buffers: Sequence[object], fingerprint: bytes
    ) -> Flow[PrefixRead]:
        if len(keys) != len(buffers):
            raise InvalidArgumentError(f"{len(keys)} keys but {len(buffers)} buffers")
        keys = [validate_key(k) for k in keys]
        views, devices = self._targets(buffers)
        try:
            results = yield get_prefix_call(keys, fingerprint)
            infos = self._checked(keys[: len(results)], results)
            yield from self._read_all(keys, infos, views, fingerprint)
            self._to_devices(devices, infos)
        finally:
            self._release(devices)
        return PrefixRead(len(infos), [i.size_bytes for i in infos], [i.tag for i in infos])

    def _targets(
        self, buffers: Sequence[object]
    ) -> tuple[list[memoryview], list[tuple[int, Any, np.ndarray]]]:
        """Host views to read into; device buffers get a pinned staging buffer each."""
        views: list[memoryview] = []
        devices: list[tuple[int, Any, np.ndarray]] = []
        for i, buf in enumerate(buffers):
            if is_device_buffer(buf):
                dev = device_bytes(buf)
                host = self._pinned.take(dev.nbytes)
                devices.append((i, dev, host))
                views.append(as_writable(host))
            else:
                views.append(as_writable(buf))
        return views, devices

    def _to_devices(
        self, devices: list[tuple[int, Any, np.ndarray]], infos: Sequence[ReplicaList]
    ) -> None:
        for i, dev, host in devices:
            if i < len(infos):
                n = infos[i].size_bytes
                dev[:n].set(host[:n])  # host-to-device from pinned memory

    def _release(self, devices: list[tuple[int, Any, np.ndarray]]) -> None:
        for _, _, host in devices:
            self._pinned.give(host)

    def _checked(
        self, keys: Sequence[str], results: Sequence[ReplicaList | MooncakeError]
    ) -> list[ReplicaList]:
        """The replica lists, or the error: ObjectNotFoundError naming every missing key."""
        missing = [
            k for k, r in zip(keys, results, strict=True) if isinstance(r, ObjectNotFoundError)
        ]
        if missing:
            shown = ", ".join(repr(k) for k in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            err = ObjectNotFoundError(f"no object under key {shown}{more}")
            err.keys = missing  # type: ignore[attr-defined]
            raise err
        infos: list[ReplicaList] = []
        for r in results:
            if isinstance(r, MooncakeError):
                raise r
            infos.append(r)
        return infos

    def _read_all(
        self,
        keys: Sequence[str],
        infos: Sequence[ReplicaList],
        views: Sequence[memoryview],
        fingerprint: bytes = b"",
    ) -> Flow[None]:
        """Copy each object into its view (zip stops at the shorter `infos` of a prefix)."""
        for key, info, view in zip(keys, infos, views, strict=False):
            if len(view) < info.size_bytes:
                raise BufferTooSmallError(
                    f"buffer holds {len(view)} bytes but {key!r} is {info.size_bytes} bytes; "
                    f"pass a buffer of at least {info.size_bytes} bytes"
                )
        remote = [
            (k, i, v[: i.size_bytes])
            for k, i, v in zip(keys, infos, views, strict=False)
            if not self._read_local(i, v[: i.size_bytes])
        ]
        if remote:
            yield from self._read_remote(remote, fingerprint)

    def _read_remote(
        self, remote: list[tuple[str, ReplicaList, memoryview]], fingerprint: bytes
    ) -> Flow[None]:
        """Read each object from its best replica, falling over to the next on any failure.
        Objects whose read grants expired before the node saw them (a batch that outlived its
        lease) get fresh replica lists once and are read again."""
        last = yield from self._read_rounds(remote)
        expired = [n for n, err in enumerate(last) if isinstance(err, GrantExpiredError)]
        if expired:
            keys = [remote[n][0] for n in expired]
            fresh = yield get_replica_list_call(keys, fingerprint)
            retry: list[tuple[str, ReplicaList, memoryview]] = []
            retried: list[int] = []
            for n, info in zip(expired, fresh, strict=True):
                key, old, dest = remote[n]
                if isinstance(info, MooncakeError):
                    last[n] = info  # removed meanwhile, say
                elif info.size_bytes != old.size_bytes or info.checksum != old.checksum:
                    last[n] = ReplicaUnavailableError(f"{key!r} changed while it was read")
                else:
                    retry.append((key, info, dest))
                    retried.append(n)
            again = yield from self._read_rounds(retry)
            for n, err in zip(retried, again, strict=True):
                last[n] = err
        for (key, _, _), err in zip(remote, last, strict=True):
            if err is None:
                continue
            if isinstance(err, ChecksumMismatchError | ObjectNotFoundError):
                raise err
            raise ReplicaUnavailableError(f"no replica of {key!r} could be read: {err}")

    def _read_rounds(
        self, remote: list[tuple[str, ReplicaList, memoryview]]
    ) -> Flow[list[MooncakeError | None]]:
        """Each round reads the next candidate replica of every object still unread, in
        parallel (same-host pools first); returns the last error of each object, or None."""
        if not remote:
            return []
        yield MapPools([loc for _, info, _ in remote for loc in info.replicas])
        rank = {"GPU": 1, "DRAM": 1, "NVME": 2}
        queues = [
            sorted(info.replicas, key=lambda loc: 0 if self._mapped(loc) is not None
                   else rank.get(loc.tier, 3))
            for _, info, _ in remote
        ]  # fmt: skip
        last: list[MooncakeError | None] = [None] * len(remote)
        todo = list(range(len(remote)))
        while todo:
            transfers: list[tuple[int, ReplicaLocation]] = []
            for n in todo:
                key, info, dest = remote[n]
                while queues[n]:
                    loc = queues[n].pop(0)
                    pool = self._mapped(loc)
                    if pool is None:
                        transfers.append((n, loc))
                        break
                    self.counters["shm_reads"] += 1
                    digest = copy_checksum(dest, pool[loc.offset : loc.offset + info.size_bytes])
                    last[n] = self._verified(key, loc, info, digest)
                    if last[n] is None:
                        break
            results: list[MooncakeError | None] = []
            if transfers:
                results = yield Transfers(
                    [Transfer(Op.READ, loc, remote[n][2]) for n, loc in transfers]
                )
            for (n, loc), err in zip(transfers, results, strict=True):
                key, info, dest = remote[n]
                if err is None:
                    self.counters["tcp_reads"] += 1
                    err = self._verified(key, loc, info, checksum(dest))
                last[n] = err
            todo = [n for n in todo if last[n] is not None and queues[n]]
        return last

    def _verified(
        self, key: str, loc: ReplicaLocation, info: ReplicaList, digest: int
    ) -> MooncakeError | None:
        if digest == info.checksum:
            tier = f"{loc.tier.lower()}_reads"
            self.counters[tier] = self.counters.get(tier, 0) + 1
            return None
        self.counters["checksum_failures"] += 1
        return ChecksumMismatchError(
            f"replica of {key!r} on node {loc.node_id} failed its checksum"
        )

    def _mapped(self, loc: ReplicaLocation) -> memoryview | None:
        """The pool of `loc` if it is a DRAM replica already mapped on this host."""
        if not self.local_shm or loc.tier != "DRAM":
            return None
        return self._shm.cached(loc)

    def _read_local(self, info: ReplicaList, dest: memoryview) -> bool:
        """Copy from an already-mapped same-host replica; False means: take the full path."""
        for loc in info.replicas:
            pool = self._mapped(loc)
            if pool is not None:
                if copy_checksum(dest, pool[loc.offset : loc.offset + info.size_bytes]) == (
                    info.checksum
                ):
                    self.counters["shm_reads"] += 1
                    self.counters["dram_reads"] += 1
                    return True
                return False  # the full path retries every replica and reports the failure
        return False

    def _take_local(self, info: ReplicaList) -> bytes | None:
        """New bytes copied straight from an already-mapped same-host replica, verified; None
        means: take the full path."""
        for loc in info.replicas:
            pool = self._mapped(loc)
            if pool is not None:
                data = bytes(pool[loc.offset : loc.offset + info.size_bytes])
                if checksum(data) == info.checksum:
                    self.counters["shm_reads"] += 1
                    self.counters["dram_reads"] += 1
                    return data
                return None
        return None

    def _write_local(self, p: _Pending) -> bool:
        """Write every replica by plain copies when all are in mapped same-host pools."""
        assert p.plan is not None
        pools = [self._mapped(loc) for loc in p.plan.replicas]
        if any(pool is None for pool in pools):
            return False
        n = len(p.value)
        for i, (loc, pool) in enumerate(zip(p.plan.replicas, pools, strict=True)):
            assert pool is not None
            dest = pool[loc.offset : loc.offset + n]
            if i == 0:
                p.checksum = copy_checksum(dest, p.value)
            else:
                dest[:] = p.value
            self.counters["shm_writes"] += 1
        p.failed = []
        return True

    # ---- metadata ---------------------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        """True when `key` is stored and readable.  Does not count as a read."""
        return (await self.exists_many([key]))[0]

    async def exists_many(self, keys: Sequence[str]) -> list[bool]:
        return await self._drive(self._exists_many_flow(keys))

    def _exists_many_flow(self, keys: Sequence[str]) -> Flow[list[bool]]:
        keys = [validate_key(k) for k in keys]
        return (yield exists_call(keys))  # type: ignore[no-any-return]

    async def remove(self, key: str) -> bool:
        """Remove `key`; True if it was stored, False if there was nothing to remove.

        Raises:
            ObjectBusyError: a put of `key` is in progress.
        """
        return (await self.remove_many([key]))[0]

    async def remove_many(self, keys: Sequence[str]) -> list[bool]:
        return await self._drive(self._remove_many_flow(keys))

    def _remove_many_flow(self, keys: Sequence[str]) -> Flow[list[bool]]:
        keys = [validate_key(k) for k in keys]
        out = []
        for err in (yield remove_call(keys)):
            if err is not None and not isinstance(err, ObjectNotFoundError):
                raise err
            out.append(err is None)
        return out

    async def stats(self) -> ClusterStats:
        """Cluster-wide counts from the master."""
        s = await self._master_client().stats()
        return ClusterStats(
            s.objects,
            s.processing,
            s.bytes_stored,
            s.nodes,
            s.capacity_bytes,
            s.used_bytes,
            s.max_object_bytes,
            dict(s.counters),
        )

    async def list_nodes(self) -> list[NodeStatus]:
        """The mounted store nodes with their usage."""
        reply = await self._master_client().list_nodes()
        return [
            NodeStatus(
                n.node_id,
                n.segment_id,
                n.endpoint,
                n.tier,
                n.size_bytes,
                n.used_bytes,
                n.objects,
                n.last_heartbeat_age_s,
            )
            for n in reply.nodes
        ]

    def _replicas(self, replicas: int | None) -> int:
        wanted = replicas if replicas is not None else self.replicas
        if wanted is None:
            return 0
        if wanted < 1:
            raise InvalidArgumentError(f"replicas must be >= 1, got {wanted}")
        return wanted
