"""The client end of the master's framed control endpoint (see `common/framed.py`).

One persistent TCP connection (TLS when the client has TLS settings; the same-host unix socket
stays plain) carries every call of the client, pipelined: each call writes one
frame and waits on a future that the reply with its call id resolves.  A lost connection fails
every call in flight with `ChannelClosedError`; the MasterClient then reconnects (asking the
master for its framed port again, since a restarted master may have a new one) under its retry
policy.
"""

from __future__ import annotations

import asyncio
import socket
from dataclasses import dataclass
from ssl import SSLContext

from google.protobuf.message import Message

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
    """The framed connection to the master is gone (the call may or may not have run)."""


class FramedCallError(Exception):
    """The master answered a framed call with an error status instead of a reply."""


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
        cls, endpoint: FramedEndpoint, *, max_frame_bytes: int, ssl: SSLContext | None = None
    ) -> FramedChannel:
        """Connect over the unix socket when it is reachable from here, else over TCP (with
        TLS when `ssl` is given)."""
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
        channel._transport = transport  # type: ignore[assignment]
        return channel

    @property
    def closed(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def call(self, name: str, request: Message, timeout_s: float) -> Message:
        """Send one call and wait for its reply; TimeoutError after `timeout_s`."""
        transport = self._transport
        if transport is None or transport.is_closing():
            raise ChannelClosedError(f"framed connection to {self.address} is closed")
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
            entry[0].set_exception(TimeoutError(f"no reply from {self.address}"))

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
                future.set_exception(FramedCallError(f"status {status}: {message}"))

    def lost(self, exc: Exception | None) -> None:
        self._transport = None
        pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(
                    ChannelClosedError(f"framed connection to {self.address} was lost: {exc}")
                )


class BlockingFramedChannel:
    """One blocking framed connection, for one thread at a time (the sync Client keeps one per
    thread): a call is a send and a receive, with no event loop between the caller and the
    socket.  Any OSError leaves the channel unusable; callers drop it and fall back."""

    def __init__(self, sock: socket.socket, address: str, *, max_frame_bytes: int) -> None:
        self.sock = sock
        self.address = address
        self.max_frame_bytes = max_frame_bytes
        self._next_id = 0
        self._buffer = bytearray(64 * 1024)

    @classmethod
    def connect(
        cls,
        endpoint: FramedEndpoint,
        *,
        timeout_s: float,
        max_frame_bytes: int,
        ssl: SSLContext | None = None,
    ) -> BlockingFramedChannel:
        sock = endpoint.unix_socket()
        address = endpoint.unix_name
        if sock is None:
            sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if ssl is not None:
                try:
                    sock = ssl.wrap_socket(sock, server_hostname=endpoint.host)
                except OSError:
                    sock.close()
                    raise
            address = f"{endpoint.host}:{endpoint.port}"
        sock.settimeout(timeout_s)
        return cls(sock, address, max_frame_bytes=max_frame_bytes)

    @property
    def unix(self) -> bool:
        return self.sock.family == socket.AF_UNIX

    def close(self) -> None:
        self.sock.close()

    def call(self, name: str, request: Message) -> Message:
        """Send one call and read its reply (the method's reply type, from REPLY_TYPES)."""
        call_id = self._next_id = (self._next_id + 1) & 0xFFFFFFFF
        payload = request.SerializeToString()
        self.sock.sendall(HEADER.pack(len(payload), call_id, METHOD_IDS[name]) + payload)
        view = memoryview(self._buffer)
        got = 0
        while got < HEADER.size:
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise ChannelClosedError(f"framed connection to {self.address} was closed")
            got += n
        length, reply_id, status = HEADER.unpack_from(view)
        if reply_id != call_id:
            raise ChannelClosedError(f"reply {reply_id} to call {call_id} from {self.address}")
        if length > self.max_frame_bytes:
            raise ChannelClosedError(f"reply of {length} bytes from {self.address} is too big")
        total = HEADER.size + length
        if total > len(self._buffer):
            grown = bytearray(total)
            grown[:got] = view[:got]
            self._buffer = grown
            view = memoryview(grown)
        while got < total:
            n = self.sock.recv_into(view[got:total])
            if n == 0:
                raise ChannelClosedError(f"framed connection to {self.address} was closed")
            got += n
        body = view[HEADER.size : total]
        if status != FrameStatus.OK:
            message = bytes(body).decode("utf-8", "replace")
            raise FramedCallError(f"status {status}: {message}")
        return REPLY_TYPES[name].FromString(body)
