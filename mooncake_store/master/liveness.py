"""Node liveness that client load cannot starve: heartbeats land on their own thread.

The master serves clients on one asyncio loop.  A legal but heavy load (100k-key lookups back to
back, a pipelined burst) can hold that loop for seconds; if heartbeats were answered there, the
master would stop hearing its nodes and declare them dead.  So heartbeats are received by a
small gRPC server of their own (`LivenessServer`, a thread pool on its own port, which nodes
learn from the MountSegment reply) and recorded in `Heartbeats`, a thread-safe map the object
table's tick reads.  The tick may itself run late under load, but it judges a node by when its
heartbeats actually arrived, on the monotonic clock, so a late tick never finds a live node
silent.

The rules built on these times (suspect after `heartbeat_ttl_s`, dropped after the grace window)
are in `membership.py`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.auth import sign_master_time
from mooncake_store.common.clock import SIGNED_OFFSETS
from mooncake_store.common.errors import OK, AccessDeniedError, SegmentNotFoundError
from mooncake_store.common.grpc_options import bind_grpc, server_options
from mooncake_store.common.tls import PLAINTEXT, TlsConfig
from mooncake_store.master.access import AccessControl

log = logging.getLogger("mooncake.master")


class Heartbeats:
    """When each mounted node (of one incarnation) last heartbeated; safe to use from any thread.

    `clock` is monotonic (injected: tests drive it by hand).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[str, tuple[int, float]] = {}  # node id -> (incarnation, last beat)

    def expect(self, node_id: str, incarnation: int) -> None:
        """A node (re)mounted: count it as heard from now."""
        with self._lock:
            self._last[node_id] = (incarnation, self._clock())

    def beat(self, node_id: str, incarnation: int) -> bool:
        """Record a heartbeat; False when this incarnation of the node is not mounted."""
        now = self._clock()
        with self._lock:
            known = self._last.get(node_id)
            if known is None or known[0] != incarnation:
                return False
            self._last[node_id] = (incarnation, now)
            return True

    def forget(self, node_id: str) -> None:
        with self._lock:
            self._last.pop(node_id, None)

    def last(self, node_id: str) -> float | None:
        """The node's last heartbeat (monotonic seconds), None when it is not mounted."""
        with self._lock:
            known = self._last.get(node_id)
        return None if known is None else known[1]


def signed_master_time(
    key: bytes | None, node_id: str, incarnation: int, nonce: int
) -> tuple[int, str]:
    """The master's clock now (ms; common/clock.py) and its signature with the node's control
    key over the request's nonce ("" for a node without one): what a heartbeat or mount reply
    carries for the node's clock of the master (node/master_clock.py)."""
    now_ms = SIGNED_OFFSETS.published_ms()  # noted: a held free waits out what nodes took
    if key is None:
        return now_ms, ""
    return now_ms, sign_master_time(key, node_id, incarnation, nonce, now_ms)


def master_time_reply(request: pb.HeartbeatRequest, key: bytes | None) -> pb.HeartbeatResponse:
    """An OK heartbeat reply carrying the master's signed time (`signed_master_time`)."""
    now_ms, signature = signed_master_time(key, request.node_id, request.incarnation, request.nonce)
    return pb.HeartbeatResponse(
        status=pb.Status(code=OK), master_time_ms=now_ms, time_signature=signature
    )


class _HeartbeatServicer(pb_grpc.MasterServiceServicer):
    """Only Heartbeat; every other method of the service is UNIMPLEMENTED on this port."""

    def __init__(
        self, heartbeats: Heartbeats, access: AccessControl, control_keys: dict[str, bytes]
    ) -> None:
        self.heartbeats = heartbeats
        self.access = access
        self.control_keys = control_keys  # the master's, read here (one dict lookup)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: object) -> pb.HeartbeatResponse:
        if self.access.enabled:  # only the node itself (its node token) may heartbeat for it
            try:
                metadata = context.invocation_metadata()  # type: ignore[attr-defined]
                caller = self.access.from_metadata(metadata)
                if not caller.may_act_as_node(request.node_id):
                    raise AccessDeniedError(
                        f"a {caller.role.value} token may not heartbeat as node {request.node_id!r}"
                    )
                self.access.check_node_proof(caller, "Heartbeat", request, metadata)
            except AccessDeniedError as refused:
                status = pb.Status(code=refused.code, message=refused.message)
                return pb.HeartbeatResponse(status=status)
        if self.heartbeats.beat(request.node_id, request.incarnation):
            return master_time_reply(request, self.control_keys.get(request.node_id))
        exc = SegmentNotFoundError(f"node {request.node_id} is not mounted; mount again")
        return pb.HeartbeatResponse(status=pb.Status(code=exc.code, message=exc.message))


class LivenessServer:
    """The heartbeat endpoint: a gRPC server on its own threads and port (port 0: a free one).

    Example:
        server = LivenessServer(heartbeats)
        port = server.start("127.0.0.1", 0)
        ...
        server.stop()
    """

    def __init__(
        self,
        heartbeats: Heartbeats,
        *,
        tls: TlsConfig = PLAINTEXT,
        access: AccessControl | None = None,
    ) -> None:
        self.heartbeats = heartbeats
        self.access = access or AccessControl(None)
        #: node id -> control key (the master's dict): heartbeat replies sign the master's time.
        self.control_keys: dict[str, bytes] = {}
        self._tls = tls
        self._server: grpc.Server | None = None
        self.port = 0

    def start(self, host: str, port: int) -> int:
        """Listen on host:port; return the bound port.  Raises OSError ("port in use")."""
        server = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="liveness"),
            options=server_options(),
        )
        pb_grpc.add_MasterServiceServicer_to_server(
            _HeartbeatServicer(self.heartbeats, self.access, self.control_keys), server
        )
        bound = bind_grpc(server, f"{host}:{port}", self._tls, "master's heartbeat endpoint")
        server.start()
        self._server = server
        self.port = bound
        return bound

    def start_remembered(self, host: str, port: int, memo: Path) -> int:
        """`start`, but with `port` 0 first try the port the last master of this data
        directory listened on (kept in `memo`): its nodes go on heartbeating there while it
        restarts, so the new master hears them as soon as it has mounted them again, however
        long its busy main port takes to answer their mounts.  Writes the bound port to
        `memo`."""
        bound = 0
        if port == 0:
            try:
                previous = int(memo.read_text().strip())
            except (OSError, ValueError):
                previous = 0
            if 0 < previous < 65536:
                try:
                    bound = self.start(host, previous)
                except OSError:  # taken since: any free port will do
                    log.info("heartbeat port %d of the last run is taken; picking another",
                             previous)  # fmt: skip
        if not bound:
            bound = self.start(host, port)
        try:
            memo.write_text(f"{bound}\n")
        except OSError as exc:
            log.warning("cannot remember the heartbeat port in %s: %s", memo, exc)
        return bound

    def stop(self, grace_s: float = 1.0) -> None:
        if self._server is not None:
            self._server.stop(grace_s).wait()
            self._server = None
