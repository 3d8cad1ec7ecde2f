"""The client end of the master's framed control endpoint (see `common/framed.py`).

One persistent TCP connection (TLS when the client has TLS settings; the same-host unix socket
stays plain) carries every call of the client, pipelined: each call writes one
frame and waits on a future that the reply with its call id resolves.  A lost connection fails
every call in flight with `ChannelClosedError` (`sent` says whether the request had gone out);
the MasterClient then reconnects (asking the master for its framed port again, since a restarted
master may have a new one) and retries what its retry rules allow.  A call that gets no reply in
time fails alone with `CallTimeoutError`: the connection stays open for the other calls in
flight, and its late reply, if one comes, is dropped.
"""

from __future__ import annotations

import asyncio
import select
import socket
import ssl
from dataclasses import dataclass
from ssl import SSLContext

from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.client.busy_poll import BusyPoll
from mooncake_store.common.errors import (
    AccessDeniedError,
    InvalidArgumentError,
    MooncakeError,
    RpcError,
)
from mooncake_store.common.framed import (
    HEADER,
    METHOD_IDS,
    REPLY_TYPES,
    FrameStatus,
    split_frames,
)


@dataclass(frozen=True)
class FramedEndpoint:
    """The master's framed endpoint as its Hello described it."""

    host: str
    port: int
    unix_name: str = ""  # abstract unix socket; reachable only from the master's host

    def unix_socket(self) -> socket.socket | None:
        """A blocking socket connected to the unix endpoint, or None if it is not reachable."""
        if not self.unix_name:
            return None
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect("\0" + self.unix_name)
        except OSError:
            sock.close()
            return None
        return sock


class ChannelClosedError(ConnectionError):
    """The framed connection to the master is gone.  `sent` False: the request never went out
    (safe to send again); True: it did, and may or may not have run."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


class CallTimeoutError(TimeoutError):
    """No reply within the call's timeout (the call may or may not have run).  The connection
    stays usable unless `broken` (a reply was cut off half-read)."""

    def __init__(self, message: str, *, broken: bool = False) -> None:
        super().__init__(message)
        self.broken = broken


def keep_alive(sock: socket.socket) -> None:
    """TCP keepalive probes, so a connection to a master whose host vanished fails in ~25 s
    instead of leaving every call on it to time out (a timeout does not close it)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


class FramedCallError(Exception):
    """The master answered a framed call with an error status instead of a reply."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"status {status}: {message}")
        self.status = status
        self.detail = message

    def translated(self, master: str, name: str) -> MooncakeError:
        """The MooncakeError this failure stands for (refusals: AccessDeniedError)."""
        if self.status in (FrameStatus.UNAUTHENTICATED, FrameStatus.PERMISSION_DENIED):
            return AccessDeniedError(f"master {master} refused {name}: {self.detail}")
        if self.status == FrameStatus.BAD_REQUEST:  # refused as bad input (a batch cap)
            return InvalidArgumentError(self.detail)
        return RpcError(f"master {master} failed the call {name}: {self}")


def _auth_request(token: str) -> pb.AuthenticateRequest:
    return pb.AuthenticateRequest(token=token)


def _check_auth(reply: Message, address: str) -> None:
    status = reply.status  # type: ignore[attr-defined]
    if status.code != 0:
        raise AccessDeniedError(f"master {address} refused the token: {status.message}")


class _Protocol(asyncio.Protocol):
    def __init__(self, channel: FramedChannel) -> None:
        self.channel = channel

    def data_received(self, data: bytes) -> None:
        self.channel.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.channel.lost(exc)


class FramedChannel:
    def __init__(self, address: str, *, max_frame_bytes: int) -> None:
        self.address = address
        self.max_frame_bytes = max_frame_bytes
        self._transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._pending: dict[int, tuple[asyncio.Future[Message], type[Message]]] = {}
        self._next_id = 0

    @classmethod
    async def connect(
        cls,
        endpoint: FramedEndpoint,
        *,
        max_frame_bytes: int,
        ssl: SSLContext | None = None,
        token: str = "",
        timeout_s: float = 10.0,
    ) -> FramedChannel:
        """Connect over the unix socket when it is reachable from here, else over TCP (with
        TLS when `ssl` is given), and authenticate with `token` (its bearer part) when given.

        Raises:
            AccessDeniedError: the master refused the token.
        """
        loop = asyncio.get_running_loop()
        sock = endpoint.unix_socket()
        if sock is not None:
            channel = cls(endpoint.unix_name, max_frame_bytes=max_frame_bytes)
            sock.setblocking(False)
            transport, _ = await loop.create_unix_connection(lambda: _Protocol(channel), sock=sock)
        else:
            channel = cls(f"{endpoint.host}:{endpoint.port}", max_frame_bytes=max_frame_bytes)
            transport, _ = await loop.create_connection(
                lambda: _Protocol(channel),
                endpoint.host,
                endpoint.port,
                ssl=ssl,
                server_hostname=endpoint.host if ssl is not None else None,
            )
            raw = transport.get_extra_info("socket")
            if raw is not None:
                keep_alive(raw)
        channel._transport = transport  # type: ignore[assignment]
        if token:
            try:
                reply = await channel.call("Authenticate", _auth_request(token), timeout_s)
                _check_auth(reply, channel.address)
            except FramedCallError as exc:
                channel.close()
                raise exc.translated(channel.address, "Authenticate") from None
            except BaseException:
                channel.close()
                raise
        return channel

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def call(self, name: str, request: Message, timeout_s: float) -> Message:
        """Send one call and wait for its reply.

        Raises:
            ChannelClosedError: the connection is closed (`sent` False) or was lost after the
                request went out (`sent` True).
            CallTimeoutError: no reply within `timeout_s`; the connection stays open.
            FramedCallError: the master answered with an error status.
        """
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ChannelClosedError(f"framed connection to {self.address} is closed", sent=False)
        loop = asyncio.get_running_loop()
        call_id = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        future: asyncio.Future[Message] = loop.create_future()
        self._pending[call_id] = (future, REPLY_TYPES[name])
        payload = request.SerializeToString()
        transport.write(HEADER.pack(len(payload), call_id, METHOD_IDS[name]) + payload)
        timer = loop.call_later(timeout_s, self._expire, call_id)
        try:
            return await future
        finally:
            timer.cancel()
            self._pending.pop(call_id, None)

    def _expire(self, call_id: int) -> None:
        entry = self._pending.pop(call_id, None)
        if entry is not None and not entry[0].done():
            entry[0].set_exception(CallTimeoutError(f"no reply from {self.address} in time"))

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        try:
            frames, used = split_frames(self._buffer, self.max_frame_bytes)
        except ValueError as exc:
            transport = self._transport
            self.lost(exc)
            if transport is not None:
                transport.close()
            return
        del self._buffer[:used]
        for call_id, status, payload in frames:
            entry = self._pending.pop(call_id, None)
            if entry is None or entry[0].done():
                continue  # the call timed out already
            future, reply_type = entry
            if status == FrameStatus.OK:
                future.set_result(reply_type.FromString(payload))
            else:
                message = payload.decode("utf-8", "replace")
                future.set_exception(FramedCallError(status, message))

    def lost(self, exc: Exception | None) -> None:
        self._transport = None
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(
                    ChannelClosedError(
                        f"framed connection to {self.address} was lost: {exc}", sent=True
                    )
                )


class BlockingFramedChannel:
    """One blocking framed connection, for one thread at a time (the sync Client keeps one per
    thread): a call is a send and a receive, with no event loop between the caller and the
    socket.  A call that times out before any of its reply arrived leaves the channel usable
    (the late reply is skipped by the next call); any other failure leaves it unusable
    (`broken`), and the caller drops it.  `send` and `receive` are the two halves of `call`,
    for a caller that works while the master answers (the sync Client's Overlapped steps)."""

    def __init__(self, sock: socket.socket, address: str, *, max_frame_bytes: int) -> None:
        self.sock = sock
        self.address = address
        self.max_frame_bytes = max_frame_bytes
        self.broken = False
        self._next_id = 0
        self._abandoned: set[int] = set()  # calls that timed out: their replies are skipped
        self._buffer = bytearray(64 * 1024)
        self._poll = BusyPoll(sock)  # client/busy_poll.py

    @classmethod
    def connect(
        cls,
        endpoint: FramedEndpoint,
        *,
        timeout_s: float,
        max_frame_bytes: int,
        ssl: SSLContext | None = None,
        token: str = "",
    ) -> BlockingFramedChannel:
        """Connect (unix socket if reachable, else TCP) and authenticate with `token`.

        Raises:
            AccessDeniedError: the master refused the token.
        """
        sock = endpoint.unix_socket()
        address = endpoint.unix_name
        if sock is None:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            keep_alive(sock)
            if ssl is not None:
                try:
                    sock = ssl.wrap_socket(sock, server_hostname=endpoint.host)
                except OSError:
                    sock.close()
                    raise
            address = f"{endpoint.host}:{endpoint.port}"
        sock.settimeout(timeout_s)
        channel = cls(sock, address, max_frame_bytes=max_frame_bytes)
        if token:
            try:
                _check_auth(channel.call("Authenticate", _auth_request(token)), address)
            except FramedCallError as exc:
                channel.close()
                raise exc.translated(address, "Authenticate") from None
            except BaseException:
                channel.close()
                raise
        return channel

    @property
    def unix(self) -> bool:
        return self.sock.family == socket.AF_UNIX

    def close(self) -> None:
        self.broken = True
        self.sock.close()

    def call(self, name: str, request: Message) -> Message:
        """Send one call and read its reply (the method's reply type, from REPLY_TYPES).

        Raises:
            ChannelClosedError: the request could not be sent (`sent` False) or the connection
                failed after it was (`sent` True).
            CallTimeoutError: no reply within the socket's timeout.
            FramedCallError: the master answered with an error status.
        """
        return self.receive(name, self.send(name, request))

    def busy_polls(self) -> tuple[int, int]:
        """(polls made, polls that saw the reply arrive) on this socket (client/busy_poll.py)."""
        return self._poll.polls, self._poll.hits

    def send(self, name: str, request: Message) -> int:
        """Send one call and return its id, for `receive` (the caller may do other work in
        between: the reply waits in the socket).  Every sent call must be received, or
        `abandon`ed.

        Raises:
            ChannelClosedError: the request could not be sent (`sent` False).
        """
        if self.broken or self._closed_by_peer():
            self.broken = True
            raise ChannelClosedError(f"framed connection to {self.address} is closed", sent=False)
        call_id = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        payload = request.SerializeToString()
        try:
            self.sock.sendall(HEADER.pack(len(payload), call_id, METHOD_IDS[name]) + payload)
        except OSError as exc:
            # Not all of the frame went out, and the connection is dropped with the part that
            # did: the master never runs a frame it did not receive whole.
            self.broken = True
            raise ChannelClosedError(
                f"sending to {self.address} failed: {exc}", sent=False
            ) from exc
        return call_id

    def abandon(self, call_id: int) -> None:
        """Give up on a sent call without reading its reply (the next call skips it)."""
        self._abandoned.add(call_id)

    def receive(self, name: str, call_id: int, busy_poll_s: float = 0.0) -> Message:
        """Read the reply of the call `send` sent as `call_id`, first polling the socket for up
        to `busy_poll_s` before the read may sleep (client/busy_poll.py).

        Raises:
            ChannelClosedError: the connection failed after the request went out (`sent` True).
            CallTimeoutError: no reply within the socket's timeout.
            FramedCallError: the master answered with an error status.
        """
        try:
            self._poll.wait(busy_poll_s)
        except BaseException:  # an interrupt, with nothing read: the next call skips the reply
            self._abandoned.add(call_id)
            raise
        while True:
            try:
                reply_id, status, body = self._read_frame()
            except CallTimeoutError as exc:
                if exc.broken:
                    self.broken = True
                else:
                    self._abandoned.add(call_id)
                raise
            except OSError as exc:
                self.broken = True
                raise ChannelClosedError(
                    f"framed connection to {self.address} failed: {exc}", sent=True
                ) from exc
            except BaseException:  # an interrupt mid-read: where the stream stands is unknown
                self.broken = True
                raise
            if reply_id == call_id:
                break
            if reply_id not in self._abandoned:
                self.broken = True
                raise ChannelClosedError(
                    f"reply {reply_id} to call {call_id} from {self.address}", sent=True
                )
            self._abandoned.discard(reply_id)  # the late reply of a call that timed out
        if status != FrameStatus.OK:
            message = bytes(body).decode("utf-8", "replace")
            raise FramedCallError(status, message)
        return REPLY_TYPES[name].FromString(body)

    def _closed_by_peer(self) -> bool:
        """True when the master closed this connection (an idle timeout, a restart) while it
        sat unused: sending on it would fail only after the request had gone out, and the call
        could not be told apart from one the master received."""
        if _is_tls(self.sock):
            return self._tls_closed_by_peer()
        try:
            return self._poll.readable() and self.sock.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _tls_closed_by_peer(self) -> bool:
        """`_closed_by_peer` under TLS, where a readable socket may hold only records with no
        data for us (a session ticket): one non-blocking read tells them from a close."""
        sock = self.sock
        assert isinstance(sock, ssl.SSLSocket)
        try:
            readable, _, _ = select.select([sock], [], [], 0)
        except OSError:
            return True
        if (not readable and not sock.pending()) or self._abandoned:
            return False  # nothing arrived, or it may be a late reply: _read_frame takes it
        timeout = sock.gettimeout()
        sock.setblocking(False)
        try:
            sock.recv(1)
        except ssl.SSLWantReadError:
            return False  # TLS housekeeping only: the connection is open
        except OSError:
            return True
        finally:
            sock.settimeout(timeout)
        return True  # closed (b"") or bytes nobody asked for: either way, start afresh

    def _read_frame(self) -> tuple[int, int, memoryview]:
        """The next reply frame: (call id, status, body, a view valid until the next read)."""
        view = memoryview(self._buffer)
        got = 0
        # With a late reply still to come, two frames may be queued: read no further than this
        # one's header.  Otherwise only this reply can come, and one read usually takes it all.
        ahead = view[: HEADER.size] if self._abandoned else view
        try:
            while got < HEADER.size:
                n = self.sock.recv_into(ahead[got:])
                if n == 0:
                    raise ConnectionError("the master closed the connection")
                got += n
            length, reply_id, status = HEADER.unpack_from(view)
            if length > self.max_frame_bytes:
                raise ConnectionError(f"a reply of {length} bytes is too big")
            total = HEADER.size + length
            if total > len(self._buffer):
                grown = bytearray(total)
                grown[:got] = view[:got]
                self._buffer = grown
                view = memoryview(grown)
            while got < total:
                n = self.sock.recv_into(view[got:total])
                if n == 0:
                    raise ConnectionError("the master closed the connection")
                got += n
        except TimeoutError:
            raise CallTimeoutError(
                f"no reply from {self.address} in time", broken=got > 0
            ) from None
        return reply_id, status, view[HEADER.size : total]


def _is_tls(sock: socket.socket) -> bool:
    return isinstance(sock, ssl.SSLSocket)
