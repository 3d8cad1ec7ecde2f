"""The cap on the master's gRPC client connections (issue 11), the framed endpoint's sibling.

gRPC tells a Python server nothing about its connections, and cannot refuse one with a
message.  So `--max-connections` bounds the gRPC port in two steps:

- **A clear refusal at the cap.** Connections are admitted in the order of their first call,
  `cap` at a time; every call of a connection beyond them is answered RESOURCE_EXHAUSTED with a
  message naming `--max-connections` (`ConnectionCapInterceptor`).  An admitted connection
  keeps its place until the kernel no longer lists it as established (``/proc/net/tcp``, read as
  `grpc_owners.py` reads it): then the next connection to call takes it.
- **A hard bound on what a flood costs.** gRPC core closes, at accept, every connection beyond
  `hard_limit(cap)` (`grpc.max_allowed_incoming_connections`): a client there sees only
  "Socket closed", but no flood holds more than that many sockets and HTTP/2 states.  Calls in
  flight per connection (`--max-calls-per-connection`), message sizes and idle connections
  (`--idle-timeout`) are bounded by the server's other options.

Never refused: node calls (MountSegment, Heartbeat, UnmountSegment, DrainNode; heartbeats go to
their own liveness server anyway, see `liveness.py`) and the health service.  With
authentication on, a call that is refused for its token never reaches the check, so a
connection without a valid token takes no place.  Where ``/proc/net/tcp`` cannot be read, no
place would ever be freed: the clear refusal is off and only the hard bound holds.

`Admission` is the pure core (time and the kernel's list injected); the interceptor is its
shell.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import grpc

from mooncake_store.master.access import NODE_METHODS, SERVICE
from mooncake_store.master.grpc_owners import Remote, parse_peer, read_established

log = logging.getLogger("mooncake.master")

#: How often, at most, the kernel's list is read to free places (only while at the cap).
REFRESH_INTERVAL_S = 0.25


def hard_limit(cap: int) -> int:
    """Connections gRPC core accepts at all: the cap, and room to refuse a few more clearly."""
    return cap + max(16, cap // 16)


def refusal_message(cap: int) -> str:
    return (
        f"the master serves at most {cap} gRPC client connections (--max-connections); this "
        "one is refused: close idle clients or raise the cap"
    )


class Admission:
    """Which gRPC connections may call: the first `cap` to call among those still open."""

    def __init__(
        self,
        cap: int,
        *,
        clock: Callable[[], float],
        established: Callable[[int], set[Remote] | None] = read_established,
    ) -> None:
        self.cap = cap
        self.message = refusal_message(cap)
        #: The port whose connections are counted (set once the server is bound).
        self.local_port = 0
        self._clock = clock
        self._established = established
        self._admitted: dict[Remote, str] = {}  # -> its peer name; first caller first
        self._peers: set[str] = set()  # the admitted peer names: the check on every call
        self._checked_s = -REFRESH_INTERVAL_S
        self._enforced = True
        self.refused = 0  # calls refused

    def __len__(self) -> int:
        return len(self._admitted)

    def admit(self, peer: str) -> bool:
        """Whether the connection `peer` (``context.peer()``) may make its call."""
        if peer in self._peers or not self._enforced:
            return True  # admitted already
        remote = parse_peer(peer)
        if remote is None or remote in self._admitted:
            return True  # not a TCP peer (unix socket), or admitted under another spelling
        if len(self._admitted) >= self.cap:
            self._forget_closed()
        if len(self._admitted) < self.cap or not self._enforced:
            self._admitted[remote] = peer
            self._peers.add(peer)
            return True
        self.refused += 1
        return False

    def _forget_closed(self) -> None:
        """Free the places of admitted connections the kernel no longer lists (throttled)."""
        now = self._clock()
        if now - self._checked_s < REFRESH_INTERVAL_S:
            return
        self._checked_s = now
        live = self._established(self.local_port)
        if live is None:
            log.warning("cannot read /proc/net/tcp: the gRPC connection cap refuses nothing "
                        "(connections past %d are still closed at accept)",
                        hard_limit(self.cap))  # fmt: skip
            self._enforced = False
            return
        for remote in [r for r in self._admitted if r not in live]:
            self._peers.discard(self._admitted.pop(remote))


class ConnectionCapInterceptor(grpc.aio.ServerInterceptor):
    """Refuses the MasterService calls of connections `Admission` did not admit, with
    RESOURCE_EXHAUSTED naming --max-connections (see the module docstring)."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self._logged_s = float("-inf")

    async def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        handler = await continuation(details)
        service, _, method = details.method.rpartition("/")
        if (
            handler is None
            or handler.unary_unary is None
            or service.lstrip("/") != SERVICE
            or method in NODE_METHODS
        ):
            return handler
        return handler._replace(unary_unary=self._guarded(handler.unary_unary))

    def _guarded(self, inner: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
        admission = self.admission

        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if not admission.admit(context.peer()):
                self._log_refusal()
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, admission.message)
            return await inner(request, context)

        return call

    def _log_refusal(self) -> None:
        now = self.admission._clock()
        if now - self._logged_s >= 10.0:  # a flood must not flood the log too
            self._logged_s = now
            log.warning("refused calls of gRPC connections over the cap (%d connections, "
                        "--max-connections); %d calls refused so far",
                        self.admission.cap, self.admission.refused)  # fmt: skip
