"""The master's framed control endpoint (see `common/framed.py`): same servicer, less machinery.

With TLS (common/tls.py) the TCP endpoint speaks TLS.  The abstract unix socket (same host only)
stays plain, and is not offered when the master requires client certificates.

Each request runs the MasterServicer method of the same name that gRPC would run.  A call that
finishes without waiting (lookups, PutStart on a quiet table) is answered before the next frame
is read, with no task created; one that waits (a PutEnd's group commit) continues as a task, so
later calls on the connection are not held behind it.

Bounds (issue 11), so one client cannot take the master's memory or its loop:
- calls in flight per connection: at `max_calls_per_connection` the server stops reading the
  socket (the client's writes then block in its kernel buffer: backpressure, no unbounded
  buffering here) and reads again once calls finish.  The same when the client does not read
  its replies: once the replies waiting to be sent pass the transport's high-water mark, the
  server stops reading (and answering) that connection until the client catches up;
- an idle connection (nothing in flight, nothing received for `idle_timeout_s`) is closed;
- at most `max_connections` connections: one more is answered with a refusal frame (call id 0,
  BAD_REQUEST, naming the cap) and closed, and the refusal is logged.  With authentication on,
  connections that have not authenticated cannot hold the cap against clients that have: a
  connection not authenticated within `auth_timeout_s` is closed, and at the cap a new
  connection takes the place of the oldest one still unauthenticated;
- a call refused as bad input (InvalidArgumentError, e.g. a batch over the cap) is answered
  BAD_REQUEST with its message, without a stack trace in the log.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import time
from collections.abc import Callable, Coroutine, Generator
from typing import Any

from google.protobuf.message import DecodeError, Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.auth import HOW_TO_GET_A_TOKEN
from mooncake_store.common.errors import OK, AccessDeniedError, InvalidArgumentError
from mooncake_store.common.framed import (
    HEADER,
    METHOD_IDS,
    METHODS,
    FrameStatus,
    message_types,
    split_frames,
)
from mooncake_store.common.grpc_options import port_in_use
from mooncake_store.common.loop_spin import LoopSpinner
from mooncake_store.common.tls import PLAINTEXT, TlsConfig
from mooncake_store.master.access import TRUSTED, AccessControl, Caller, allowed

log = logging.getLogger("mooncake.master")

Handler = Callable[[Message, object], Coroutine[Any, Any, Message]]
_AUTHENTICATE = METHOD_IDS["Authenticate"]


class _Resume:
    """Await a coroutine that was already stepped once and is suspended on `waiting`."""

    def __init__(self, coro: Coroutine[Any, Any, Message], waiting: object) -> None:
        self.coro = coro
        self.waiting = waiting

    def __await__(self) -> Generator[Any, None, Message]:
        waiting = self.waiting
        while True:
            try:
                yield waiting
            except BaseException as exc:  # cancellation goes on to the coroutine
                try:
                    waiting = self.coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
                continue
            try:
                waiting = self.coro.send(None)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]


class _Connection(asyncio.Protocol):
    """One client connection; it is the `context` of the servicer calls it carries, and its
    `owner_id` names the puts it started (revoked when it closes, and again when its last call
    in flight then ends)."""

    def __init__(self, server: FramedServer) -> None:
        self.server = server
        server.opened += 1
        self.owner_id = server.opened
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.tasks: set[asyncio.Task[None]] = set()
        self.paused = False  # reading stopped: too many calls in flight, or replies unread
        self.write_blocked = False  # the client does not read its replies fast enough
        self.active_s = time.monotonic()  # when a frame last came or a reply last went
        self.opened_s = self.active_s
        # Who the connection speaks for; None until its Authenticate call succeeds.
        self.caller: Caller | None = None if server.access.enabled else TRUSTED
        self.allowed: frozenset[int] = (
            frozenset(range(len(METHODS))) if self.caller else frozenset()
        )

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        cap = self.server.max_connections
        if len(self.server.connections) >= cap and self.server.drop_unauthenticated():
            log.warning("framed connections at the cap (%s): closed the oldest one that had "
                        "not authenticated to make room", cap)  # fmt: skip
        if len(self.server.connections) >= cap:
            message = (
                f"the master serves at most {cap} framed connections (--max-connections); "
                "this one is refused: close idle clients or raise the cap"
            )
            log.warning("refused a framed connection: %s connections open", cap)
            self.reply(0, FrameStatus.BAD_REQUEST, message.encode())
            self.transport.close()  # type: ignore[union-attr]
            return
        self.server.connections.add(self)
        if self.caller is None:
            asyncio.get_running_loop().call_later(self.server.auth_timeout_s, self.auth_deadline)

    def auth_deadline(self) -> None:
        """Close the connection if it has not authenticated by now."""
        if self.caller is None and self.transport is not None:
            log.info("closing a framed connection that did not authenticate within %.0fs",
                     self.server.auth_timeout_s)  # fmt: skip
            self.server.connections.discard(self)
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.server.connections.discard(self)
        self.transport = None
        self.end_owned()

    def end_owned(self) -> None:
        """The connection's puts and leases end (`connection_closed`): as it closes, and again
        as its last call in flight ends (what that call started meanwhile had no owner left)."""
        closed = getattr(self.server.servicer, "connection_closed", None)
        if closed is not None:
            closed(self.owner_id)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.active_s = time.monotonic()
        self.run_frames()
        if self.server.spinner is not None:
            self.server.spinner.activity()

    def run_frames(self) -> None:
        """Dispatch the whole frames buffered, until calls in flight reach the cap: then stop
        reading the socket and keep the rest for when calls finish (`call_done`)."""
        try:
            frames, _ = split_frames(self.buffer, self.server.max_frame_bytes)
        except ValueError as exc:
            log.warning("framed client sent a bad frame, closing it: %s", exc)
            if self.transport is not None:
                self.transport.close()
            return
        used = 0
        for call_id, method, payload in frames:
            if self.blocked():
                break
            used += HEADER.size + len(payload)
            self.dispatch(call_id, method, payload)
        del self.buffer[:used]
        self.update_reading()

    def blocked(self) -> bool:
        return self.write_blocked or len(self.tasks) >= self.server.max_calls_per_connection

    def update_reading(self) -> None:
        full = self.blocked()
        if full != self.paused and self.transport is not None and not self.transport.is_closing():
            self.paused = full
            if full:
                self.transport.pause_reading()
            else:
                self.transport.resume_reading()

    def call_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if self.transport is None:  # closed while this call was in flight
            if not self.tasks:
                self.end_owned()
            return
        if self.paused and not self.blocked():
            self.run_frames()  # the frames kept back, then reading resumes

    def pause_writing(self) -> None:  # the transport's reply buffer passed its high-water mark
        self.write_blocked = True
        self.update_reading()

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self.paused and not self.blocked():
            self.run_frames()

    def reply(self, call_id: int, status: FrameStatus, payload: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(HEADER.pack(len(payload), call_id, status) + payload)
            self.active_s = time.monotonic()

    def authenticate(self, call_id: int, payload: bytes) -> None:
        try:
            request = pb.AuthenticateRequest.FromString(payload)
        except DecodeError as exc:
            self.reply(call_id, FrameStatus.BAD_REQUEST, f"malformed request: {exc}".encode())
            return
        try:
            caller = self.server.access.authenticate(request.token, request.tenant)
        except AccessDeniedError as exc:
            self.refuse(call_id, FrameStatus.UNAUTHENTICATED, str(exc))
            return
        self.caller = caller
        self.allowed = frozenset(i for i, name in enumerate(METHODS) if allowed(caller.role, name))
        reply = pb.AuthenticateResponse(
            status=pb.Status(code=OK), role=caller.role.value, tenant=caller.tenant,
            node_id=caller.node_id, auth=self.server.access.enabled,
        )  # fmt: skip
        self.reply(call_id, FrameStatus.OK, reply.SerializeToString())

    def refuse(self, call_id: int, status: FrameStatus, message: str) -> None:
        self.reply(call_id, status, message.encode())
        if status is FrameStatus.UNAUTHENTICATED and self.transport is not None:
            self.transport.close()  # nothing more is read from an unauthenticated peer

    def dispatch(self, call_id: int, method: int, payload: bytes) -> None:
        if method == _AUTHENTICATE:
            self.authenticate(call_id, payload)
            return
        if method not in self.allowed:
            if self.caller is None:
                self.server.access.denied += 1
                self.refuse(call_id, FrameStatus.UNAUTHENTICATED,
                            "this master requires a token: authenticate first; "
                            + HOW_TO_GET_A_TOKEN)  # fmt: skip
            elif method < len(METHODS):
                self.server.access.denied += 1
                problem = f"a {self.caller.role.value} token may not call {METHODS[method]}"
                self.refuse(call_id, FrameStatus.PERMISSION_DENIED, problem)
            else:
                self.reply(call_id, FrameStatus.UNKNOWN_METHOD, f"unknown method {method}".encode())
            return
        handler = self.server.handlers.get(method)
        if handler is None:
            self.reply(call_id, FrameStatus.UNKNOWN_METHOD, f"unknown method {method}".encode())
            return
        call, request_type = handler
        try:
            request = request_type.FromString(payload)
        except DecodeError as exc:
            self.reply(call_id, FrameStatus.BAD_REQUEST, f"malformed request: {exc}".encode())
            return
        coro = call(request, self)
        try:
            waiting = coro.send(None)
        except StopIteration as stop:
            self.reply(call_id, FrameStatus.OK, stop.value.SerializeToString())
            return
        except Exception as exc:
            self.failed(call_id, method, exc)
            return
        task = asyncio.get_running_loop().create_task(
            self.finish(call_id, method, _Resume(coro, waiting))
        )
        self.tasks.add(task)
        task.add_done_callback(self.call_done)

    async def finish(self, call_id: int, method: int, pending: _Resume) -> None:
        try:
            reply = await pending
        except Exception as exc:
            self.failed(call_id, method, exc)
            return
        self.reply(call_id, FrameStatus.OK, reply.SerializeToString())

    def failed(self, call_id: int, method: int, exc: Exception) -> None:
        if isinstance(exc, InvalidArgumentError):  # bad input (a batch over the cap, ...)
            self.reply(call_id, FrameStatus.BAD_REQUEST, str(exc).encode())
            return
        log.exception("framed call %s failed", METHODS[method], exc_info=exc)
        self.reply(call_id, FrameStatus.INTERNAL, f"{type(exc).__name__}: {exc}".encode())


class FramedServer:
    """Serves `servicer`'s framed methods on host:port (port 0 picks a free one)."""

    def __init__(
        self,
        servicer: object,
        *,
        max_frame_bytes: int,
        tls: TlsConfig = PLAINTEXT,
        max_calls_per_connection: int = 256,
        idle_timeout_s: float = 600.0,
        max_connections: int = 4096,
        access: AccessControl | None = None,
        auth_timeout_s: float = 10.0,
        busy_poll_s: float = 0.0,
    ) -> None:
        self.max_frame_bytes = max_frame_bytes
        # Keeps the loop awake between requests that come close together (--busy-poll).
        self.spinner = LoopSpinner(busy_poll_s) if busy_poll_s > 0 else None
        self.auth_timeout_s = auth_timeout_s
        self.max_calls_per_connection = max_calls_per_connection
        self.idle_timeout_s = idle_timeout_s
        self.max_connections = max_connections
        self._reaper: asyncio.Task[None] | None = None
        self.tls = tls
        self.servicer = servicer
        self.opened = 0  # connections accepted: each one's owner id
        self.access = access or AccessControl(None)
        self.handlers: dict[int, tuple[Handler, type[Message]]] = {
            i: (getattr(servicer, name), message_types(name)[0]) for i, name in enumerate(METHODS)
        }
        self.connections: set[_Connection] = set()
        self._server: asyncio.Server | None = None
        self._unix: asyncio.AbstractServer | None = None
        self.unix_name = ""

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port and on the abstract unix socket `self.unix_name`; the port."""
        loop = asyncio.get_running_loop()
        ssl = self.tls.server_context() if self.tls.serves else None
        try:
            self._server = await loop.create_server(lambda: _Connection(self), host, port, ssl=ssl)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise port_in_use("master's framed endpoint", f"{host}:{port}") from exc
        port = int(self._server.sockets[0].getsockname()[1])
        # With client certificates required, a unix socket would let a same-host process in
        # without one: none is offered.
        if not (self.tls.serves and self.tls.ca and self.tls.require_client_cert):
            await self._start_unix(port)
        if self.idle_timeout_s > 0:
            self._reaper = loop.create_task(self._close_idle())
        return port

    async def _start_unix(self, port: int) -> None:
        """Listen on the abstract unix socket `self.unix_name` too (same-host clients)."""
        loop = asyncio.get_running_loop()
        # Built by hand: uvloop does not take abstract names as a path.
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        name = f"mooncake-master-{os.getpid()}-{port}"
        try:
            sock.bind("\0" + name)
            sock.listen(128)
            sock.setblocking(False)
            self._unix = await loop.create_unix_server(lambda: _Connection(self), sock=sock)
            self.unix_name = name
        except OSError as exc:  # the TCP endpoint is enough
            sock.close()
            log.warning("no unix framed endpoint (%s); clients use TCP", exc)

    def drop_unauthenticated(self) -> bool:
        """Close the oldest connection that has not authenticated; False when there is none."""
        strangers = [c for c in self.connections if c.caller is None and c.transport]
        if not strangers:
            return False
        oldest = min(strangers, key=lambda c: c.opened_s)
        self.connections.discard(oldest)
        oldest.transport.close()  # type: ignore[union-attr]
        return True

    def drop_token(self, token_id: str) -> int:
        """Close the connections that authenticated with `token_id` (revoked): its holder's
        calls from now on must authenticate again, which is refused.  How many were closed."""
        holders = [
            c for c in self.connections
            if c.caller is not None and c.caller.token_id == token_id and c.transport
        ]  # fmt: skip
        for connection in holders:
            self.connections.discard(connection)
            connection.allowed = frozenset()  # nothing more is answered on it
            connection.transport.close()  # type: ignore[union-attr]
        return len(holders)

    async def _close_idle(self) -> None:
        """Close connections with nothing in flight and nothing received for the timeout."""
        while True:
            await asyncio.sleep(min(self.idle_timeout_s / 4, 30.0))
            quiet_since = time.monotonic() - self.idle_timeout_s
            for connection in list(self.connections):
                idle = not connection.tasks and not connection.buffer
                transport = connection.transport
                # (A TLS transport stays open while it waits for the peer's close_notify.)
                if idle and connection.active_s < quiet_since and transport is not None:
                    if transport.is_closing():
                        continue
                    log.info("closing a framed connection idle for %.0fs", self.idle_timeout_s)
                    transport.close()

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, let calls in flight finish for up to `grace_s`, then close."""
        if self._server is None:
            return
        if self._reaper is not None:
            self._reaper.cancel()
            self._reaper = None
        if self.spinner is not None:
            await self.spinner.stop()
        self._server.close()
        if self._unix is not None:
            self._unix.close()
        pending = [t for c in self.connections for t in c.tasks]
        if pending:
            await asyncio.wait(pending, timeout=grace_s)
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.close()
        await self._server.wait_closed()
        self._server = None
        if self._unix is not None:
            await self._unix.wait_closed()
            self._unix = None
