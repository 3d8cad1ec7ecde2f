"""The client's view of the master: typed calls over grpc.aio, with errors translated once.

This is the one boundary where `grpc.RpcError` becomes a MooncakeError: an unreachable master
becomes MasterUnavailableError naming its address, a call without a reply in time
MasterTimeoutError, per-key statuses the exception class their code names
(`common.errors.error_for_code`).

Retries know what they repeat (see `Retry`): a call is sent again only when it provably never
reached the master (no connection, or the connection was closed before the request went out) or
when it is idempotent (`MasterCall.idempotent`).  A timeout fails that call alone: the shared
framed connection stays open for the calls in flight beside it.

A batch of more items than the master takes in one call (`max_batch_items`, which its Hello
says; common/batching.py) is sent as slices of at most that many, all in flight at once, and
their outcomes are merged in order (`MasterCall.slices`); a prefix lookup's slices go one after
another while the run goes on.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.client.framed_channel import (
    CallTimeoutError,
    ChannelClosedError,
    FramedCallError,
    FramedChannel,
    FramedEndpoint,
)

# The calls as values and the reply parsers live in master_calls.py; importable from here too.
from mooncake_store.client.master_calls import MasterCall as MasterCall
from mooncake_store.client.master_calls import _location as _location
from mooncake_store.client.master_calls import _replica_list as _replica_list
from mooncake_store.client.master_calls import _replica_lists as _replica_lists
from mooncake_store.client.master_calls import describe_call as describe_call
from mooncake_store.client.master_calls import exists_call as exists_call
from mooncake_store.client.master_calls import get_prefix_call as get_prefix_call
from mooncake_store.client.master_calls import get_replica_list_call as get_replica_list_call
from mooncake_store.client.master_calls import list_keys_call as list_keys_call
from mooncake_store.client.master_calls import prefix_match_call as prefix_match_call
from mooncake_store.client.master_calls import put_end_call as put_end_call
from mooncake_store.client.master_calls import put_revoke_call as put_revoke_call
from mooncake_store.client.master_calls import put_start_call as put_start_call
from mooncake_store.client.master_calls import remove_call as remove_call
from mooncake_store.client.master_calls import report_corrupt_call as report_corrupt_call
from mooncake_store.client.master_calls import status_error as status_error
from mooncake_store.client.types import PutPlan, PutSpec, ReplicaList, Retry
from mooncake_store.common.auth import Role, bearer
from mooncake_store.common.batching import DEFAULT_MAX_BATCH_ITEMS, cap_in_message
from mooncake_store.common.credentials import discover_token
from mooncake_store.common.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    MasterTimeoutError,
    MasterUnavailableError,
    MooncakeError,
    RpcError,
    TlsError,
)
from mooncake_store.common.grpc_options import DEFAULT_MAX_MESSAGE_BYTES, message_options
from mooncake_store.common.tls import (
    CLIENT_CERT_HINT,
    PLAINTEXT,
    PLAINTEXT_HINT,
    TlsConfig,
    describe_tls_failure,
    grpc_tls_failure,
)

R = TypeVar("R")

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
_REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


class _NotSent(Exception):
    """The request provably never reached the master: always safe to try again."""


class _Unanswered(Exception):
    """The request went out and the connection died before its reply (it may have run)."""


class _TimedOut(Exception):
    """The request went out and no reply came in time (it may have run)."""


def _host_of(address: str) -> str | None:
    """The host part of a plain host:port address, or None for other gRPC target forms."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


class MasterClient:
    """Typed master calls.  They travel on the framed endpoint when the master offers one
    (`framed=True`, the default) and on gRPC otherwise; both reach the same servicer."""

    def __init__(
        self,
        address: str,
        *,
        timeout_s: float,
        retry: Retry,
        framed: bool = True,
        counters: dict[str, int] | None = None,
        tls: TlsConfig = PLAINTEXT,
        token: str | None = None,
    ) -> None:
        self.address = address
        if token is None:  # MOONCAKE_TOKEN(_FILE), then the master's local token file
            token = discover_token(address, Role.CLIENT)
        #: The bearer part of the caller's token ("" without one).
        self.token = bearer(token) if token else ""
        self._metadata = (("authorization", f"Bearer {self.token}"),) if self.token else None
        self.timeout_s = timeout_s
        self.retry = retry
        self.tls = tls
        #: The client TLS context of the framed endpoint (None: plaintext).
        self.ssl_context = tls.client_context() if tls.enabled else None
        # A connection of its own (gRPC shares one between equal channels of a process by
        # default): the master revokes a client's pending puts when its connection closes
        # (master/grpc_owners.py), which a connection still used by another client never does.
        options = [
            *message_options(DEFAULT_MAX_MESSAGE_BYTES),
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if tls.enabled:
            self._channel = grpc.aio.secure_channel(
                address, tls.grpc_channel_credentials(), options=options
            )
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        self._stub = pb_grpc.MasterServiceStub(self._channel)
        self._framed_wanted = framed and _host_of(address) is not None
        self._framed: FramedChannel | None = None
        #: Where the framed endpoint was last found (None: not asked yet, or gRPC only).
        self.framed_endpoint: FramedEndpoint | None = None
        self._framed_lock = asyncio.Lock()
        #: Calls made on each endpoint ("framed_calls", "grpc_calls").
        self.counters = counters if counters is not None else {}
        self.counters.setdefault("framed_calls", 0)
        self.counters.setdefault("grpc_calls", 0)
        #: The most items the master takes in one batch call (its Hello says; until then, and
        #: from an older master that does not, its default).  Bigger batches go as slices.
        self.max_batch_items = DEFAULT_MAX_BATCH_ITEMS

    async def close(self) -> None:
        if self._framed is not None:
            self._framed.close()
            self._framed = None
        await self._channel.close()

    async def wait_ready(self, timeout_s: float) -> None:
        """Return once the master answers (any answer, a refusal included).

        Raises:
            TlsError: the TLS handshake failed (at once: waiting would not change it).
            MasterUnavailableError: no answer within `timeout_s`.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        delay, problem = 0.02, ""
        while True:
            left = deadline - loop.time()
            try:
                hello = await self._stub.Hello(
                    pb.HelloRequest(), timeout=max(left, 0.01), metadata=self._metadata
                )
                self.learn(hello)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _UNREACHABLE:
                    return  # it answered
                self._raise_tls_failure(exc)
                problem = f" ({exc.code().name}: {exc.details()})"
            if loop.time() + delay >= deadline:
                hint = self._tls_hint("; ")
                raise MasterUnavailableError(
                    f"cannot reach the mooncake master at {self.address} within {timeout_s:g}s"
                    f"{problem}: is mooncake-master running there{hint}?"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)

    def _tls_hint(self, sep: str) -> str:
        """What to check when the master hangs up: TLS settings it may want and we lack."""
        if not self.tls.enabled:
            return sep + PLAINTEXT_HINT
        if not self.tls.cert:
            return sep + CLIENT_CERT_HINT
        return ""

    def _raise_tls_failure(self, exc: grpc.aio.AioRpcError) -> None:
        """Raise TlsError when a gRPC failure was a TLS handshake failure."""
        explained = grpc_tls_failure(exc.details() or "", f"the master at {self.address}")
        if explained is not None:
            raise TlsError(explained) from exc

    @property
    def framed_wanted(self) -> bool:
        return self._framed_wanted

    async def framed_channel(self) -> FramedChannel | None:
        """The open framed connection, opening one (after a Hello) when there is none."""
        async with self._framed_lock:
            if self._framed is not None and not self._framed.closed:
                return self._framed
            self._framed = None
            try:
                hello = await self._stub.Hello(
                    pb.HelloRequest(), timeout=self.timeout_s, metadata=self._metadata
                )
            except grpc.aio.AioRpcError as exc:
                if exc.code() in _REFUSED:
                    raise AccessDeniedError(
                        f"master {self.address} refused the call: {exc.details()}"
                    ) from None
                if exc.code() != grpc.StatusCode.UNIMPLEMENTED:
                    raise
                hello = pb.HelloResponse()  # a master without the framed endpoint
            self.learn(hello)
            if not hello.framed_port:
                self._framed_wanted = False
                return None
            host = _host_of(self.address)
            assert host is not None
            host = hello.framed_host or host  # the master's --advertise-host, if it has one
            self.framed_endpoint = FramedEndpoint(host, hello.framed_port, hello.framed_socket)
            try:
                self._framed = await FramedChannel.connect(
                    self.framed_endpoint,
                    max_frame_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                    ssl=self.ssl_context,
                    token=self.token,
                    timeout_s=self.timeout_s,
                )
            except ssl.SSLError as exc:
                address = f"the master's framed endpoint {host}:{hello.framed_port}"
                raise TlsError(describe_tls_failure(exc, address) or str(exc)) from exc
            return self._framed

    async def _call(self, name: str, request: Message, *, idempotent: bool) -> Any:
        """Make one call, retried where that is safe (see the module docstring)."""
        delays = self.retry.delays()
        for attempt in range(len(delays) + 1):
            try:
                return await self._attempt(name, request, idempotent)
            except _NotSent as exc:
                problem, timed_out = str(exc), False
            except _Unanswered as exc:
                if not idempotent:
                    raise MasterUnavailableError(
                        f"the connection to the mooncake master at {self.address} was lost "
                        f"during {name} ({exc}); it may or may not have taken effect"
                    ) from None
                problem, timed_out = str(exc), False
            except _TimedOut as exc:
                if not idempotent:
                    raise MasterTimeoutError(
                        f"mooncake master at {self.address} did not answer {name} within "
                        f"{self.timeout_s:g}s ({exc}); it may or may not have taken effect"
                    ) from None
                problem, timed_out = str(exc), True
            if attempt == len(delays):
                if timed_out:
                    raise MasterTimeoutError(
                        f"mooncake master at {self.address} did not answer {name} within "
                        f"{self.timeout_s:g}s, {attempt + 1} tries ({problem})"
                    )
                hint = self._tls_hint(", or ")
                raise MasterUnavailableError(
                    f"mooncake master at {self.address} is unreachable ({problem}); "
                    f"is mooncake-master running{hint}?"
                )
            await asyncio.sleep(delays[attempt])
        raise AssertionError("unreachable")

    async def _attempt(self, name: str, request: Message, idempotent: bool) -> Any:
        """One try, its failure classified as _NotSent, _Unanswered or _TimedOut."""
        channel = self._framed
        if channel is None or channel.closed:
            try:
                channel = await self.framed_channel() if self._framed_wanted else None
            except grpc.aio.AioRpcError as exc:  # the Hello: our request is not sent yet
                if exc.code() not in _UNREACHABLE:
                    raise self._failed(name, exc) from exc
                self._raise_tls_failure(exc)
                raise _NotSent(f"{exc.code().name}: {exc.details()}") from None
            except MooncakeError:  # TlsError: it would fail the same way again
                raise
            except OSError as exc:  # connecting to the framed endpoint
                raise _NotSent(f"{type(exc).__name__}: {exc}") from None
        if channel is not None:
            try:
                reply = await channel.call(name, request, self.timeout_s)
            except FramedCallError as exc:
                raise exc.translated(self.address, name) from exc
            except CallTimeoutError as exc:
                raise _TimedOut(str(exc)) from None
            except ChannelClosedError as exc:
                if self._framed is channel:
                    self._framed = None
                raise (_Unanswered if exc.sent else _NotSent)(str(exc)) from None
            self.counters["framed_calls"] += 1
            return reply
        if not idempotent:
            # gRPC cannot say whether a failed call left: only send once the channel is up.
            try:
                await asyncio.wait_for(self._channel.channel_ready(), self.timeout_s)
            except TimeoutError:
                raise _NotSent("no gRPC connection to the master") from None
        try:
            reply = await getattr(self._stub, name)(
                request, timeout=self.timeout_s, metadata=self._metadata
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise _TimedOut(f"{exc.code().name}: {exc.details()}") from None
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._raise_tls_failure(exc)
                raise _Unanswered(f"{exc.code().name}: {exc.details()}") from None
            raise self._failed(name, exc) from exc
        self.counters["grpc_calls"] += 1
        return reply

    def _failed(self, name: str, exc: grpc.aio.AioRpcError) -> MooncakeError:
        if exc.code() == grpc.StatusCode.INVALID_ARGUMENT:  # refused as bad input (batch cap)
            return InvalidArgumentError(str(exc.details()))
        if exc.code() in _REFUSED:
            return AccessDeniedError(f"master {self.address} refused {name}: {exc.details()}")
        return RpcError(
            f"master {self.address} failed the call {name}: {exc.code().name}: {exc.details()}"
        )

    def learn(self, hello: pb.HelloResponse) -> None:
        """Take what the master's Hello says about its limits."""
        if hello.max_batch_items:  # 0: an older master, which does not say
            self.max_batch_items = hello.max_batch_items

    def refused_batch(self, call: MasterCall[Any], exc: InvalidArgumentError) -> bool:
        """Whether `exc` refused `call` for carrying more items than the master's cap, smaller
        than we knew (a master restarted with another cap): the cap is learnt, send again."""
        cap = cap_in_message(exc.message)
        if cap is None or not 0 < cap < call.items():
            return False
        self.max_batch_items = cap
        return True

    async def run(self, call: MasterCall[R]) -> R:
        """Make one master call and parse its reply; a batch over the master's cap goes as
        slices, all in flight at once (see MasterCall.slices)."""
        parts = call.slices(self.max_batch_items)
        if parts and call.then is not None:  # a prefix: each slice continues the run
            replies: list[R | BaseException] = []
            for part in parts:
                reply: R = await self.run(part)
                replies.append(reply)
                if not call.then(reply, part.items()):
                    break
            return call.join(parts[: len(replies)], replies)
        if parts:
            outcomes = await asyncio.gather(*map(self.run, parts), return_exceptions=True)
            return call.join(parts, outcomes)
        try:
            answer = await self._call(call.name, call.request, idempotent=call.idempotent)
        except InvalidArgumentError as exc:
            if not self.refused_batch(call, exc):
                raise
            return await self.run(call)
        return call.parse(answer)

    async def put_start(self, items: Sequence[PutSpec]) -> list[PutPlan | MooncakeError]:
        return await self.run(put_start_call(items))

    async def get_replica_list(
        self, keys: Sequence[str], fingerprint: bytes = b""
    ) -> list[ReplicaList | MooncakeError]:
        return await self.run(get_replica_list_call(keys, fingerprint))

    async def stats(self) -> pb.StatsResponse:
        reply = await self._call("Stats", pb.StatsRequest(), idempotent=True)
        return reply  # type: ignore[no-any-return]

    async def list_nodes(self) -> pb.ListNodesResponse:
        reply = await self._call("ListNodes", pb.ListNodesRequest(), idempotent=True)
        return reply  # type: ignore[no-any-return]
