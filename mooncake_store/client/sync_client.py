"""Client: the synchronous client, sharing its logic with AsyncClient.

Every operation is written once, as a flow of steps (see `steps.py`), reached through the
`ClientFlows` of an AsyncClient (`flows.py`, its public `flows`).  The sync Client runs a flow
in the calling thread: master calls go out on a blocking framed socket that the
thread keeps (no event loop, no thread hop: on these VMs that is ~100 us of a ~200 us call),
same-host copies are plain memcpys, and TCP transfers run on blocking node sockets of the thread
(a batch pipelined: every request sent, then the replies read in order).  An `Overlapped` step
(a speculative same-host read, client/speculative.py) sends its request, runs its local work,
then reads the reply.  One private event loop
on a daemon thread carries the master calls when the master has no framed endpoint, and the
fallback after a socket error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from mooncake_store.client.async_client import DEFAULT_MASTER, AsyncClient
from mooncake_store.client.framed_channel import (
    BlockingFramedChannel,
    CallTimeoutError,
    ChannelClosedError,
    FramedCallError,
)
from mooncake_store.client.master_client import MasterCall, MasterClient
from mooncake_store.client.ranges import Range, ReadSession
from mooncake_store.client.steps import Flow, Overlapped, Transfer, Transfers, run_meanwhile
from mooncake_store.client.tcp_blocking import BlockingNodeConnections
from mooncake_store.client.types import (
    ClusterStats,
    KeyInfo,
    NodeStatus,
    ObjectInfo,
    PrefixRead,
    PutResult,
)
from mooncake_store.common.errors import (
    InvalidArgumentError,
    MasterTimeoutError,
    MasterUnavailableError,
    MooncakeError,
)
from mooncake_store.common.grpc_options import DEFAULT_MAX_MESSAGE_BYTES
from mooncake_store.common.loop import new_event_loop
from mooncake_store.common.tls import TlsConfig

T = TypeVar("T")


DEFAULT_BUSY_POLL_US = 250


class Client:
    """Synchronous client; takes the same arguments as AsyncClient, and `busy_poll_us`.

    `busy_poll_us` (default 250; 0: never; at most `timeout_s`): while one thread of this
    client is running an operation, it waits for a master or node reply by polling its socket
    for up to this long before it sleeps, which saves the wake-up (~40-70 us a call on small
    VMs) for the CPU it spends polling.  With several threads in operations at once, none
    polls (they would take turns on the GIL instead).

    Example:
        with Client("127.0.0.1:50051") as store:
            store.put("key", b"bytes")
            assert store.get("key") == b"bytes"
    """

    def __init__(
        self, master: str = DEFAULT_MASTER, *, busy_poll_us: int = DEFAULT_BUSY_POLL_US,
        **options: Any,
    ) -> None:  # fmt: skip
        if isinstance(busy_poll_us, bool) or not isinstance(busy_poll_us, int) or busy_poll_us < 0:
            raise InvalidArgumentError(f"busy_poll_us must be an int >= 0, got {busy_poll_us!r}")
        self._driving = 0  # threads inside an operation (`_drive`): busy polling while one
        self._driving_lock = threading.Lock()
        self._async = AsyncClient(master, **options)  # its runner carries stats, list_nodes
        # A window past the timeout would outlast it (the read's timeout starts after it).
        self._busy_poll_s = min(busy_poll_us / 1e6, self._async.timeout_s)
        self._flows = self._async.flows  # the operations, driven here in the calling thread
        self._loop = new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="mooncake-client", daemon=True
        )
        self._thread.start()
        self._closed = False
        self._local = threading.local()  # each thread's framed channel and node sockets
        self._channels: list[BlockingFramedChannel] = []
        self._node_sets: list[BlockingNodeConnections] = []
        self._channels_lock = threading.Lock()

    @property
    def master(self) -> str:
        return self._async.master

    @property
    def tls(self) -> TlsConfig:
        """The TLS settings of this client's connections (plaintext when none are set)."""
        return self._async.tls

    @property
    def counters(self) -> dict[str, int]:
        """Transfers by data path and checksum failures (see AsyncClient.counters), and the
        replies waited for by busy polling: `busy_polls`, and `busy_poll_hits` (those whose
        reply came within the window)."""
        out = dict(self._async.counters)
        with self._channels_lock:
            polls = [c.busy_polls() for c in self._channels]
            polls += [n.busy_polls() for n in self._node_sets]
        out["busy_polls"] = sum(p[0] for p in polls)
        out["busy_poll_hits"] = sum(p[1] for p in polls)
        return out

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RuntimeError("this Client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _drive(self, flow: Flow[T]) -> T:
        """Run an operation's steps in this thread (see the module docstring)."""
        if self._closed:
            flow.close()
            raise RuntimeError("this Client is closed")
        with self._driving_lock:
            self._driving += 1
        try:
            return self._steps(flow)
        finally:
            with self._driving_lock:
                self._driving -= 1

    def _busy_poll_now(self) -> float:
        """How long this thread may poll for its next reply: the window while it is the only
        thread in an operation, else 0 (client/busy_poll.py)."""
        return self._busy_poll_s if self._driving == 1 else 0.0

    def _steps(self, flow: Flow[T]) -> T:
        value: Any = None
        error: BaseException | None = None
        while True:
            try:
                step = flow.send(value) if error is None else flow.throw(error)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            error = None
            try:
                if isinstance(step, MasterCall):
                    value = self._master_call(step)
                elif isinstance(step, Overlapped):
                    value = self._overlapped(step)
                elif isinstance(step, Transfers):
                    value = self._transfer_all(step.transfers)
                else:
                    for loc in self._flows.unmapped(step.replicas):
                        self._flows.shm.map(loc)
            except BaseException as exc:
                error = exc

    def _transfer_all(self, transfers: Sequence[Transfer]) -> list[MooncakeError | None]:
        """The transfers on this thread's blocking node sockets, pipelined per node."""
        nodes: BlockingNodeConnections | None = getattr(self._local, "nodes", None)
        if nodes is None:
            nodes = self._local.nodes = BlockingNodeConnections(
                timeout_s=self._async.timeout_s, ssl=self._async.ssl_context
            )
            with self._channels_lock:
                self._node_sets.append(nodes)
        nodes.busy_poll_s = self._busy_poll_now()
        if len(transfers) == 1:
            t = transfers[0]
            try:
                nodes.exchange(t.loc, t.op, t.buffer, hasher=t.hasher)
            except MooncakeError as exc:
                return [exc]
            return [None]
        return nodes.exchange_many(
            [(t.loc, t.op, t.buffer) for t in transfers], [t.hasher for t in transfers]
        )

    def _overlapped(self, step: Overlapped) -> tuple[Any, Any]:
        """An Overlapped step: the call sent on this thread's framed socket, `meanwhile` run,
        then the reply read.  Where the call cannot go that way (no framed channel, a batch
        sent as slices, the channel found closed), meanwhile and the plain call, one after
        the other: the same result, without the overlap."""
        outcome: list[Any] = []

        def meanwhile() -> None:
            outcome.append(run_meanwhile(step.meanwhile))

        call = step.call
        channel = self._channel()
        if channel is None or call.slices(self._master().max_batch_items):
            meanwhile()
            return self._master_call(call), outcome[0]
        try:
            reply = self._master_call_once(call, channel, meanwhile)
        except InvalidArgumentError as exc:
            if not self._master().refused_batch(call, exc):
                raise
            reply = self._master_call(call)
        if not outcome:  # not sent on the socket: the call went the async way
            meanwhile()
        return reply, outcome[0]

    def _master_call(self, call: MasterCall[T]) -> T:
        """One master call; a batch over the master's cap goes as slices, one after the other
        (see MasterCall.slices)."""
        channel = self._channel()  # asks the master (Hello) for its endpoint and cap once
        master = self._master()
        parts = call.slices(master.max_batch_items)
        if parts and call.then is not None:  # a prefix: each slice continues the run
            replies: list[T | BaseException] = []
            for part in parts:
                reply = self._master_call(part)
                replies.append(reply)
                if not call.then(reply, part.items()):
                    break
            return call.join(parts[: len(replies)], replies)
        if parts:
            outcomes: list[T | BaseException] = []
            for part in parts:
                unreachable = next(
                    (o for o in outcomes if isinstance(o, MasterUnavailableError)), None
                )
                if unreachable is not None:  # the retries gave up: not again for each slice
                    outcomes.append(unreachable)
                    continue
                try:
                    outcomes.append(self._master_call(part))
                except MooncakeError as exc:
                    outcomes.append(exc)
            return call.join(parts, outcomes)
        try:
            return self._master_call_once(call, channel)
        except InvalidArgumentError as exc:
            if not master.refused_batch(call, exc):
                raise
            return self._master_call(call)

    def _master_call_once(
        self,
        call: MasterCall[T],
        channel: BlockingFramedChannel | None,
        meanwhile: Callable[[], None] | None = None,
    ) -> T:
        """One master call on this thread's blocking framed socket; `meanwhile`, if given, runs
        once the request is sent, before the reply is read.  What may be tried again (see
        `Retry`) goes to the async path, which retries, reconnects and asks the master for its
        endpoint again; what may not raises here."""
        if channel is not None:
            try:
                call_id = channel.send(call.name, call.request)
                if meanwhile is not None:
                    try:
                        meanwhile()
                    except BaseException:  # an interrupt: the reply is skipped by the next call
                        channel.abandon(call_id)
                        raise
                reply = channel.receive(call.name, call_id, self._busy_poll_now())
                self._async.counters["framed_calls"] += 1
                return call.parse(reply)
            except FramedCallError as exc:
                raise exc.translated(self.master, call.name) from exc
            except CallTimeoutError as exc:
                # The socket stays (the late reply is skipped), unless the reply was cut off.
                if channel.broken:
                    self._drop_channel(channel)
                if not call.idempotent:
                    raise MasterTimeoutError(
                        f"mooncake master at {self.master} did not answer {call.name} within "
                        f"{self._async.timeout_s:g}s ({exc}); it may or may not have taken effect"
                    ) from None
            except ChannelClosedError as exc:
                self._drop_channel(channel)
                if exc.sent and not call.idempotent:
                    raise MasterUnavailableError(
                        f"the connection to the mooncake master at {self.master} was lost "
                        f"during {call.name} ({exc}); it may or may not have taken effect"
                    ) from None
        return self._run(self._call_on_loop(call))

    async def _call_on_loop(self, call: MasterCall[T]) -> T:
        return await self._flows.master_client().run(call)

    def _master(self) -> MasterClient:
        """The flows' MasterClient, created on the loop (grpc.aio binds to it)."""
        master = self._flows.master_created
        if master is None:

            async def create() -> MasterClient:
                return self._flows.master_client()

            master = self._run(create())
        return master

    def _channel(self) -> BlockingFramedChannel | None:
        channel: BlockingFramedChannel | None = getattr(self._local, "channel", None)
        if channel is not None:
            return channel
        if getattr(self._local, "retry_after", 0.0) > time.monotonic():
            return None
        master = self._master()
        if not master.framed_wanted:
            return None
        if master.framed_endpoint is None:
            try:
                self._run(master.framed_channel())
            except Exception:
                return None  # the async path will report why
        endpoint = master.framed_endpoint
        if endpoint is None:
            return None
        try:
            channel = BlockingFramedChannel.connect(
                endpoint,
                timeout_s=self._async.timeout_s,
                max_frame_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                ssl=master.ssl_context,
                token=master.token,
            )
        except OSError:
            self._local.retry_after = time.monotonic() + 1.0  # not on every call
            return None
        self._local.channel = channel
        with self._channels_lock:
            self._channels.append(channel)
        return channel

    def _drop_channel(self, channel: BlockingFramedChannel) -> None:
        channel.close()
        self._local.channel = None
        with self._channels_lock:
            if channel in self._channels:
                self._channels.remove(channel)

    def connect(self) -> Client:
        self._run(self._async.connect())
        return self

    def close(self) -> None:
        """Close connections and stop the client's thread (idempotent)."""
        if self._closed:
            return
        with self._channels_lock:
            channels, self._channels = self._channels, []
            node_sets, self._node_sets = self._node_sets, []
        for channel in channels:
            channel.close()
        for nodes in node_sets:
            nodes.close()
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
        return self._drive(self._flows.put_flow(key, value, **options))

    def put_from(self, key: str, buffer: object, **options: Any) -> PutResult:
        return self._drive(self._flows.put_flow(key, buffer, **options))

    def put_many(
        self, items: Mapping[str, object] | Iterable[tuple[str, object]], **options: Any
    ) -> list[PutResult]:
        return self._drive(self._flows.put_many_flow(items, **options))

    def put_many_from_parts(
        self,
        items: Mapping[str, Sequence[object]] | Iterable[tuple[str, Sequence[object]]],
        **options: Any,
    ) -> list[PutResult]:
        return self._drive(self._flows.put_many_flow(items, parts=True, **options))

    def put_many_outcomes(
        self, items: Mapping[str, object] | Iterable[tuple[str, object]], **options: Any
    ) -> list[PutResult | MooncakeError]:
        return self._drive(self._flows.put_many_flow(items, outcomes=True, **options))  # type: ignore[arg-type]

    def get_many_into_parts(
        self, keys: Sequence[str], buffers: Sequence[Sequence[object]]
    ) -> list[int]:
        return self._drive(self._flows.read_parts_flow(keys, buffers, outcomes=False))  # type: ignore[arg-type]

    def get_many_into_outcomes(
        self, keys: Sequence[str], buffers: Sequence[Sequence[object]]
    ) -> list[int | MooncakeError]:
        return self._drive(self._flows.read_parts_flow(keys, buffers, outcomes=True))

    def remove_many_outcomes(
        self, keys: Sequence[str], *, force: bool = True
    ) -> list[MooncakeError | None]:
        return self._drive(self._flows.remove_outcomes_flow(keys, force))

    def read_session(self, keys: Sequence[str]) -> ReadSession:
        return self._drive(self._flows.session_flow(keys))

    def get_ranges_into(
        self, session: ReadSession, reads: Sequence[tuple[str, Sequence[Range]]]
    ) -> list[list[int | MooncakeError]]:
        return self._drive(self._flows.ranges_flow(session, reads))

    def describe_many(self, keys: Sequence[str]) -> list[ObjectInfo | None]:
        return self._drive(self._flows.describe_flow(keys))

    def list_keys(
        self, prefix: str = "", *, cursor: str = "", limit: int = 1000
    ) -> tuple[list[KeyInfo], str]:
        return self._drive(self._flows.list_keys_flow(prefix, cursor, limit))

    def get(self, key: str, *, fingerprint: bytes = b"") -> bytes:
        return self._drive(self._flows.get_many_flow([key], fingerprint))[0]

    def get_many(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> list[bytes]:
        return self._drive(self._flows.get_many_flow(keys, fingerprint))

    def get_into(self, key: str, buffer: object, *, fingerprint: bytes = b"") -> int:
        return self._drive(self._flows.get_many_into_flow([key], [buffer], fingerprint))[0]

    def get_many_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> list[int]:
        return self._drive(self._flows.get_many_into_flow(keys, buffers, fingerprint))

    def prefix_match(self, keys: Sequence[str], *, fingerprint: bytes = b"") -> int:
        return self._drive(self._flows.prefix_match_flow(keys, fingerprint))

    def get_prefix_into(
        self, keys: Sequence[str], buffers: Sequence[object], *, fingerprint: bytes = b""
    ) -> PrefixRead:
        return self._drive(self._flows.get_prefix_into_flow(keys, buffers, fingerprint))

    def exists(self, key: str) -> bool:
        return self._drive(self._flows.exists_many_flow([key]))[0]

    def exists_many(self, keys: Sequence[str]) -> list[bool]:
        return self._drive(self._flows.exists_many_flow(keys))

    def remove(self, key: str) -> bool:
        return self._drive(self._flows.remove_many_flow([key]))[0]

    def remove_many(self, keys: Sequence[str]) -> list[bool]:
        return self._drive(self._flows.remove_many_flow(keys))

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
        "put_many_from_parts",
        "put_many_outcomes",
        "get_many_into_parts",
        "get_many_into_outcomes",
        "remove_many_outcomes",
        "describe_many",
        "list_keys",
        "read_session",
        "get_ranges_into",
        "stats",
        "list_nodes",
    ):
        locals()[_name].__doc__ = getattr(AsyncClient, _name).__doc__
    del _name
