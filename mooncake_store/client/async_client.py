"""AsyncClient: the public async API, and the runner that takes operations' steps on an event loop.

The operations themselves are flows of steps (`steps.py`), reached through `ClientFlows`
(`flows.py`, the `flows` attribute); the sync `Client` runs the same flows in the calling
thread.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from mooncake_store.client.flows import DEFAULT_MASTER, DEFAULT_MAX_VALUE_BYTES, ClientFlows
from mooncake_store.client.master_client import MasterCall, MasterClient
from mooncake_store.client.metadata import MetadataCalls
from mooncake_store.client.ranges import Range, ReadSession
from mooncake_store.client.steps import Flow, Overlapped, Transfer, Transfers, run_meanwhile
from mooncake_store.client.tcp_async import TcpPool
from mooncake_store.client.types import PrefixRead, PutResult, ReplicaLocation, Retry
from mooncake_store.common.errors import MooncakeError
from mooncake_store.common.tls import TlsConfig

T = TypeVar("T")

__all__ = ["DEFAULT_MASTER", "DEFAULT_MAX_VALUE_BYTES", "AsyncClient"]


class AsyncClient(MetadataCalls):
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
        tls: TLS settings of the connections to the master and the nodes (`TlsConfig`); or
            `tls_ca` (verify the servers against this CA) with `tls_cert` and `tls_key` (the
            client certificate, for a cluster that asks for one).  Unset: MOONCAKE_TLS_CA,
            MOONCAKE_TLS_CERT and MOONCAKE_TLS_KEY, else plaintext.  Same-host shared memory is
            used either way.
        leases: hold allocation leases (on by default), so that a put of a size put before
            is one master round trip (the value is copied into space granted ahead, then
            committed) instead of two (PutStart, copy, PutEnd).  The master grants them from
            free room only, takes them back when another put needs the room, and ends them
            when the client's connection closes (client/leases.py, master/leases.py).  False:
            every put is two-phase.
        token: the caller's token (`mooncake-admin token create --role client --tenant T`);
            None looks in MOONCAKE_TOKEN, MOONCAKE_TOKEN_FILE, then (master on this host, same
            uid) the master's local token file.  The tenant of the token is the namespace of
            every key this client names.
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
        tls: TlsConfig | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        leases: bool = True,
        token: str | None = None,
    ) -> None:
        #: The operations as flows, over the settings, counters, master client and same-host
        #: transport they share (flows.py); the sync Client drives the same object's flows.
        self.flows = ClientFlows(
            master, replicas=replicas, timeout_s=timeout_s, local_shm=local_shm,
            max_value_bytes=max_value_bytes, retry=retry, framed=framed, tls=tls, tls_ca=tls_ca,
            tls_cert=tls_cert, tls_key=tls_key, leases=leases, token=token,
        )  # fmt: skip
        #: This runner's TCP transport (the sync Client has blocking sockets of its own).
        self._tcp = TcpPool(timeout_s=timeout_s, ssl=self.flows.ssl_context)

    # ---- settings (held by `flows`) ---------------------------------------------------------

    @property
    def master(self) -> str:
        return self.flows.master

    @property
    def replicas(self) -> int | None:
        return self.flows.replicas

    @property
    def timeout_s(self) -> float:
        return self.flows.timeout_s

    @property
    def local_shm(self) -> bool:
        return self.flows.local_shm

    @property
    def max_value_bytes(self) -> int:
        return self.flows.max_value_bytes

    @property
    def retry(self) -> Retry:
        return self.flows.retry

    @property
    def framed(self) -> bool:
        return self.flows.framed

    @property
    def tls(self) -> TlsConfig:
        return self.flows.tls

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """The client TLS context of TCP connections (None: plaintext)."""
        return self.flows.ssl_context

    @property
    def token(self) -> str | None:
        return self.flows.token

    @property
    def counters(self) -> dict[str, int]:
        """Transfers by data path, and replicas that failed their checksum on read.  Reads
        served per tier (dram_reads, nvme_reads, gpu_reads).  Master calls by endpoint
        (framed_calls, grpc_calls).  Objects whose every replica failed its checksum, reported
        to the master for deletion (corrupt_reported)."""
        return self.flows.counters

    # ---- lifecycle --------------------------------------------------------------------------

    async def connect(self) -> AsyncClient:
        """Open the channel and wait until the master answers.

        Raises:
            MasterUnavailableError: the master did not answer within `timeout_s`.
        """
        await self.flows.master_client().wait_ready(self.timeout_s)
        return self

    async def close(self) -> None:
        await self.flows.close()
        self._tcp.close()

    async def __aenter__(self) -> AsyncClient:
        return await self.connect()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _drive(self, flow: Flow[T]) -> T:
        """Run an operation's steps on this loop."""
        master = self.flows.master_client()
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
                elif isinstance(step, Overlapped):
                    value = await self._overlapped(master, step)
                elif isinstance(step, Transfers):
                    value = await self._transfer_all(step.transfers)
                else:
                    await self._map_pools(step.replicas)
                    value = None
            except BaseException as exc:
                error = exc

    @staticmethod
    async def _overlapped(master: MasterClient, step: Overlapped) -> tuple[Any, Any]:
        """An Overlapped step: the call started as a task and let run to its first wait (the
        request is sent), `meanwhile` run on the loop, then the reply awaited."""
        task = asyncio.ensure_future(master.run(step.call))
        try:
            await asyncio.sleep(0)
        except BaseException:
            task.cancel()
            raise
        outcome = run_meanwhile(step.meanwhile)
        return await task, outcome

    async def _transfer_all(self, transfers: Sequence[Transfer]) -> list[MooncakeError | None]:
        return await self._tcp.exchange_many(
            [(t.loc, t.op, t.buffer) for t in transfers], [t.hasher for t in transfers]
        )

    async def _map_pools(self, replicas: Sequence[ReplicaLocation]) -> None:
        loop = asyncio.get_running_loop()
        for loc in self.flows.unmapped(replicas):
            await loop.run_in_executor(None, self.flows.shm.map, loc)

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
            self.flows.put_flow(
                key, value, replicas=replicas, fingerprint=fingerprint, parent=parent, tag=tag,
                pin=pin, pin_ttl_s=pin_ttl_s,
            )
        )  # fmt: skip

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
            self.flows.put_many_flow(
                items, replicas=replicas, fingerprint=fingerprint, parents=parents, tags=tags,
                pin=pin, pin_ttl_s=pin_ttl_s,
            )
        )  # fmt: skip

    async def put_many_from_parts(
        self,
        items: Mapping[str, Sequence[object]] | Iterable[tuple[str, Sequence[object]]],
        *,
        replicas: int | None = None,
        pin: bool = False,
        pin_ttl_s: float = 0.0,
        soft_pin_ttl_s: float = 0.0,
        preferred_nodes: Sequence[str] = (),
    ) -> list[PutResult]:
        """Store each key's buffers (a sequence of bytes-like parts) as one object: their
        concatenation, copied from each part straight to the nodes (scatter-gather, no
        staging copy).  `get_many_into_parts` scatters it back.  Failures as put_many.

        `soft_pin_ttl_s` keeps the objects that long unless nothing else can be evicted;
        `preferred_nodes` (node ids or data endpoints) receive the replicas when they have
        room.
        """
        return await self._drive(
            self.flows.put_many_flow(
                items, replicas=replicas, pin=pin, pin_ttl_s=pin_ttl_s,
                soft_pin_ttl_s=soft_pin_ttl_s, preferred_nodes=preferred_nodes, parts=True,
            )
        )  # fmt: skip

    async def put_many_outcomes(
        self,
        items: Mapping[str, object] | Iterable[tuple[str, object]],
        *,
        parts: bool = False,
        replicas: int | None = None,
        pin: bool = False,
        pin_ttl_s: float = 0.0,
        soft_pin_ttl_s: float = 0.0,
        preferred_nodes: Sequence[str] = (),
    ) -> list[PutResult | MooncakeError]:
        """put_many (put_many_from_parts with `parts`) that reports each item's outcome: a
        PutResult, or the MooncakeError of that item, instead of raising the first."""
        return await self._drive(
            self.flows.put_many_flow(  # type: ignore[arg-type]
                items, replicas=replicas, pin=pin, pin_ttl_s=pin_ttl_s,
                soft_pin_ttl_s=soft_pin_ttl_s, preferred_nodes=preferred_nodes, parts=parts,
                outcomes=True,
            )
        )  # fmt: skip

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
        return await self._drive(self.flows.get_many_flow(keys, fingerprint))

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
        return await self._drive(self.flows.get_many_into_flow(keys, buffers, fingerprint))

    async def get_many_into_parts(
        self, keys: Sequence[str], buffers: Sequence[Sequence[object]]
    ) -> list[int]:
        """Scatter each object over its list of writable host buffers, in order (the object
        fills them one after the other; together they must hold it); return the sizes.  One
        master call; the bytes go straight from the pool or the TCP reply into the parts and
        are verified as one object.

        Raises:
            ObjectNotFoundError, BufferTooSmallError, ReplicaUnavailableError,
            ChecksumMismatchError: as get_many_into.
        """
        return await self._drive(self.flows.read_parts_flow(keys, buffers, outcomes=False))  # type: ignore[arg-type]

    async def get_many_into_outcomes(
        self, keys: Sequence[str], buffers: Sequence[Sequence[object]]
    ) -> list[int | MooncakeError]:
        """get_many_into_parts that reports each key's outcome (its size, or its
        MooncakeError: ObjectNotFoundError for a missing key, ...) instead of raising."""
        return await self._drive(self.flows.read_parts_flow(keys, buffers, outcomes=True))

    async def read_session(self, keys: Sequence[str]) -> ReadSession:
        """Lease `keys` for ranged reads (`get_ranges_into`) until the session is closed.

        A key that cannot be read is recorded in the session (`session.error(key)`) rather
        than raised.  See client/ranges.py for how ranges are verified.
        """
        return await self._drive(self.flows.session_flow(keys))

    async def get_ranges_into(
        self, session: ReadSession, reads: Sequence[tuple[str, Sequence[Range]]]
    ) -> list[list[int | MooncakeError]]:
        """Copy ranges of the session's objects: for each (key, [(buffer, offset), ...]),
        the object's bytes [offset, offset + len(buffer)) into each buffer.  Returns, per
        range, the bytes copied or the MooncakeError that stopped it (only the requested
        bytes are copied; each is verified against the stored checksum first)."""
        return await self._drive(self.flows.ranges_flow(session, reads))

    async def prefix_match(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> int:
        """Length of the longest leading run of `keys` that is stored (one RPC).

        A key stored under another fingerprint ends the run.  Like `exists`, this is a probe:
        it does not count as a read.
        """
        return await self._drive(self.flows.prefix_match_flow(keys, fingerprint))

    async def get_prefix_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> PrefixRead:
        """Read the longest stored leading run of `keys` into the matching buffers.

        One master call finds the run and leases it; the blocks are then copied in parallel.
        Returns how many keys were read, with their sizes and tags.
        """
        return await self._drive(self.flows.get_prefix_into_flow(keys, buffers, fingerprint))
