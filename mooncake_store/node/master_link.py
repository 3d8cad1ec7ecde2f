"""The node's link to the master: mount, heartbeats from a dedicated thread, unmount.

Heartbeats run on their own thread with a blocking gRPC channel, so a busy event loop (a burst
of large transfers) cannot starve them and get a live node declared dead.  They go to the port
the master names in its MountSegment reply (its heartbeat endpoint, served on threads of its
own so that client load on the master cannot delay them either), or to the main port.  When
the master does not know the node (it restarted, or it declared the node dead after a stall),
the node mounts again with the same incarnation and a fresh inventory of the persistent
tiers, which lets a restarted master rebuild its allocators from the replicas it reloaded.
That mount runs on a thread of its own and waits up to --mount-timeout: heartbeats go on
meanwhile (at the heartbeat port, or the main port when that does not answer), because a busy
master may apply a mount long before its reply gets out, and from then on it drops the node
if it stops hearing from it.  A
mount refused because another live node holds this node's id (IdentityConflictError) is kept
in `conflict`: the daemon exits with it instead of fighting the other node for the id.

Each mount reply carries the first write fence of every DRAM segment (node/write_gate.py) and
the master's signature of them, handed to `on_fences`; before mounting again a node the master
forgot, `on_fences(None, "")` closes its segments to writes, so no grant of the forgotten mount
lands while the mount is under way; it also closes the pool to same-host copies, and the mount
waits `REMOUNT_GRACE_S` for a copy already started to land (common/shm_fence.py).  Every mount
after the first refuses writes until its reply is in; one that gets no reply (the master may
have applied it, afresh) leaves them refused, and the node mounts again every heartbeat interval
until a reply comes (`fences_owed`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence

import grpc
from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.auth import (
    SIGNATURE_METADATA,
    master_time_signed,
    node_proof_key,
    sign_request,
)
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    IdentityConflictError,
    SegmentNotFoundError,
)
from mooncake_store.common.grpc_options import message_options
from mooncake_store.common.shm_fence import REMOUNT_GRACE_S
from mooncake_store.common.tls import PLAINTEXT, TlsConfig

log = logging.getLogger("mooncake.node")


class MasterLink:
    def __init__(
        self,
        master: str,
        build_mount: Callable[[], pb.MountSegmentRequest],
        *,
        tls: TlsConfig = PLAINTEXT,
        token: str = "",
        node_secret: bytes = b"",
        max_message_bytes: int = 256 * 1024 * 1024,
        call_timeout_s: float = 1.0,
        unmount_timeout_s: float = 2.0,
        mount_timeout_s: float = 5.0,
        on_fences: Callable[[Sequence[pb.WriteFence] | None, str], bool] | None = None,
        on_mounting: Callable[[bool], None] | None = None,
        on_master_time: Callable[..., None] | None = None,
        time_key: Callable[[], bytes | None] | None = None,
    ) -> None:
        self.master = master
        # Called with each OK heartbeat or mount reply's master time and the request's send
        # and reply times (monotonic), and `mount=True` and the master's heartbeat TTL
        # (`max_age_s`) for a mount reply: the node keeps the master's clock
        # (MasterClock.observe in master_clock.py).  With
        # a control key (`time_key`; None: the node has no token), only a time the master
        # signed over the request's nonce is taken.
        self._on_master_time = on_master_time
        self._time_key = time_key or (lambda: None)
        # Called (on this link's thread) with True before a mount again (same-host copies
        # stop: the mount may be new to the master, which then hands the pool's room out
        # afresh) and with False once its reply is in (its fences shown).
        self._on_mounting = on_mounting
        # A mount again got no reply (it timed out, the connection broke): the master may
        # have applied it, afresh, and be handing the pool's room out under fences the node
        # never saw, so writes stay refused (`on_mounting` stays True) and the node mounts
        # again every heartbeat interval until a reply is in.
        self.fences_owed = False
        self.ever_mounted = False
        self.master_run = 0  # the run of the master whose mount reply came last (0: none)
        # Called (on this link's thread) with each mount reply's fences and their signature
        # (False: not taken, the node mounts again), and with None before mounting again
        # after the master forgot the node.
        self._on_fences = on_fences
        self._closed_at = -REMOUNT_GRACE_S  # when `_close` last closed the pool to copies
        self._max_message_bytes = max_message_bytes
        # Heartbeats and re-mounts wait this long, or the heartbeat interval when longer.
        self._call_timeout_s = call_timeout_s
        self._unmount_timeout_s = unmount_timeout_s
        # A mount again waits this long for its reply: a restarted or busy master may take
        # seconds to reconcile inventories, and re-asking would only give it more to do.
        self._mount_timeout_s = mount_timeout_s
        self._remounting: threading.Thread | None = None  # the mount under way, if any
        self._remount_lock = threading.Lock()
        # The bearer part of the node token (never its secret), sent with every call.
        self._metadata = [("authorization", f"Bearer {token}")] if token else None
        self._build_mount = build_mount
        first = build_mount()
        self.node_id = first.node_id
        self.incarnation = first.incarnation
        # Signs mount, heartbeats, unmount and drain: the master checks that the caller holds
        # the secret.
        self._proof_key = (
            node_proof_key(node_secret, self.node_id, self.incarnation) if node_secret else b""
        )
        self._stamp_s = 0.0  # of the last signature
        self._stamp_lock = threading.Lock()
        self._tls = tls
        self._channel = self._open(master)
        self._stub = pb_grpc.MasterServiceStub(self._channel)
        self._beat_channel: grpc.Channel | None = None  # to the heartbeat endpoint
        self._beat_address = ""
        self._beat_stub = self._stub
        self.conflict = ""  # why the master refused this node's identity, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.interval_s = 1.0
        self.mounted = threading.Event()
        self.refusal = ""  # the master's reason when it refused the last mount
        self.heartbeats = 0
        self._beat_refused = False  # the last heartbeat was refused (AccessDeniedError)

    def _signed(self, method: str, request: Message) -> list[tuple[str, str]] | None:
        """The call metadata: the bearer, and the proof signature of `request` (a fresh one
        each call: the master refuses a replayed signature)."""
        if not self._proof_key or self._metadata is None:
            return self._metadata
        body = request.SerializeToString(deterministic=True)
        # Later than the last stamp, even after this host's clock stepped back: the master
        # refuses a stamp no later than the last one it accepted (a replay).
        with self._stamp_lock:
            self._stamp_s = max(time.time(), self._stamp_s + 0.001)
            stamp = self._stamp_s
        signature = sign_request(self._proof_key, method, body, stamp)
        return [*self._metadata, (SIGNATURE_METADATA, signature)]

    def _open(self, address: str) -> grpc.Channel:
        # Its own connection: gRPC shares one between channels of a process with the same
        # target and options (store nodes run in one process in tests: cluster_inprocess.py).
        options = [*message_options(self._max_message_bytes), ("grpc.use_local_subchannel_pool", 1)]
        if self._tls.serves:  # a node with TLS talks TLS to its master, presenting its cert
            return grpc.secure_channel(address, self._tls.grpc_channel_credentials(), options)
        return grpc.insecure_channel(address, options=options)

    def _use_liveness_port(self, port: int) -> None:
        """Send heartbeats to the master's heartbeat endpoint (`port` on the master's host)."""
        address = f"{self.master.rpartition(':')[0]}:{port}" if port else ""
        if address == self._beat_address:
            return
        if self._beat_channel is not None:
            self._beat_channel.close()
        self._beat_channel, self._beat_address = None, address
        self._beat_stub = self._stub
        if address:
            self._beat_channel = self._open(address)
            self._beat_stub = pb_grpc.MasterServiceStub(self._beat_channel)

    def set_token(self, token: str, node_secret: bytes) -> None:
        """Present `token` (the bearer part of the node token) from now on, and sign mount,
        unmount and drain with the proof key of `node_secret`."""
        self._metadata = [("authorization", f"Bearer {token}")]
        self._proof_key = node_proof_key(node_secret, self.node_id, self.incarnation)

    def mount(self, timeout_s: float, *, keep_mounted: bool = False) -> bool:
        """Mount the node's segments; False (and a log line) when the master is unreachable.

        `keep_mounted`: an unreachable master leaves the node counted as mounted (it goes on
        heartbeating), for a mount that only asks where to heartbeat."""
        # Closed to same-host copies a moment ago (`_close`): let a copy that checked the
        # fences just before land before the master can hand the pool's room out again.
        wait = self._closed_at + REMOUNT_GRACE_S - time.monotonic()
        if wait > 0 and self._stop.wait(wait):
            return False
        again = self.ever_mounted
        if again and self._on_mounting is not None:
            self._on_mounting(True)
        outcome: bool | None = None
        try:
            outcome = self._mount(timeout_s, keep_mounted=keep_mounted, again=again)
            return bool(outcome)
        finally:
            if outcome is None and again and not self._stop.is_set():
                if not self.fences_owed:
                    log.warning("the mount got no reply from master %s: client writes stay "
                                "refused until a mount reply comes", self.master)  # fmt: skip
                self.fences_owed = True  # it may have been applied (a refusal was not)
            # Stopping: writes stay refused (the old fences may be a forgotten mount's).
            if again and not self.fences_owed and not self._stop.is_set():
                if self._on_mounting is not None:
                    self._on_mounting(False)

    def _mount(self, timeout_s: float, *, keep_mounted: bool, again: bool) -> bool | None:
        """True: mounted; False: refused (or stopping); None: no reply came."""
        try:
            request = self._build_mount()
            request.remount = again  # the master holds the room of a mount new to it back
            request.master_run = self.master_run  # another run starts past generation_seen
            request.nonce = secrets.randbits(63)  # the reply's master time is for this request
            sent = time.monotonic()
            reply = self._stub.MountSegment(
                request,
                timeout=timeout_s,
                wait_for_ready=True,
                metadata=self._signed("MountSegment", request),
            )
        except grpc.RpcError as exc:
            log.warning("cannot mount on master %s: %s: %s", self.master, exc.code().name,
                        exc.details())  # fmt: skip
            if not keep_mounted:
                self.mounted.clear()
            return None
        if self._stop.is_set():  # stopping: do not count as mounted again (stop() unmounts)
            return False
        if reply.status.code != OK:
            self.refusal = reply.status.message
            if reply.status.code == IdentityConflictError.code:
                self.conflict = reply.status.message  # the daemon exits with it: one line
                return False
            log.error("master %s refused the mount: %s", self.master, reply.status.message)
            return False
        self.refusal = ""
        self.master_run = reply.master_run
        self._take_master_time(request.nonce, reply, sent, mount=True)  # before the fences
        if self._on_fences is not None:  # fences it cannot take (unsigned) are owed still
            self.fences_owed = not self._on_fences(list(reply.fences), reply.fences_signature)
        else:
            self.fences_owed = False
        if reply.heartbeat_interval_s > 0:
            self.interval_s = reply.heartbeat_interval_s
        self._use_liveness_port(reply.liveness_port)
        if not self.mounted.is_set():
            log.info("mounted on master %s as %s (%d segments)", self.master, self.node_id,
                     len(request.segments))  # fmt: skip
        self.mounted.set()
        self.ever_mounted = True
        return True

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.mounted.is_set() or self.fences_owed:
                self._remount(keep_mounted=self.mounted.is_set())
            # Beat even while a mount is under way: the master may have mounted this node
            # already and only be slow to reply, and it drops a node it does not hear from.
            self._beat()

    def _remount(self, *, keep_mounted: bool) -> None:
        """Mount again on a thread of its own (one at a time), so that heartbeats go on while
        a busy or freshly restarted master takes seconds to answer.  A mount whose reply came
        too late to be read must not cost the node its replicas: the master counts the node
        from the moment it mounted it, and only heartbeats keep it alive."""
        with self._remount_lock:
            if self._stop.is_set() or (
                self._remounting is not None and self._remounting.is_alive()
            ):
                return
            self._remounting = threading.Thread(
                target=self.mount, args=(self._mount_timeout_s,),
                kwargs={"keep_mounted": keep_mounted}, name="remount", daemon=True,
            )  # fmt: skip
            self._remounting.start()

    def _beat(self) -> None:
        channel = self._beat_channel
        reply = self._heartbeat(self._beat_stub)
        if reply is None and channel is not None:
            # The heartbeat port does not answer (the master is restarting, or came back on
            # another port, and something else may hold the old one): ask the main port
            # where to heartbeat, on the side, and beat there meanwhile.  A restarted master
            # listens on its old heartbeat port again when it is free (master/liveness.py).
            self._remount(keep_mounted=True)
            reply = self._heartbeat(self._stub)
        if reply is None:
            return
        self.heartbeats += 1
        refused = reply.status.code == AccessDeniedError.code
        if refused and not self._beat_refused:  # the master will drop this node: say so
            log.error("master %s refuses this node's heartbeats: %s", self.master,
                      reply.status.message)  # fmt: skip
        self._beat_refused = refused
        if reply.status.code == SegmentNotFoundError.code and self.mounted.is_set():
            log.warning("master %s forgot this node; mounting again", self.master)
            self._close()
            self.mounted.clear()
            self._remount(keep_mounted=False)

    def _heartbeat(self, stub: pb_grpc.MasterServiceStub) -> pb.HeartbeatResponse | None:
        request = pb.HeartbeatRequest(
            node_id=self.node_id, incarnation=self.incarnation, nonce=secrets.randbits(63)
        )
        sent = time.monotonic()
        try:
            reply = stub.Heartbeat(
                request,
                timeout=max(self.interval_s, self._call_timeout_s),
                metadata=self._signed("Heartbeat", request),
            )
        except grpc.RpcError as exc:
            if self.mounted.is_set():
                log.warning("heartbeat to %s failed: %s", self.master, exc.code().name)
            return None
        if reply.status.code == OK:
            self._take_master_time(request.nonce, reply, sent)
        return reply  # type: ignore[no-any-return]

    def _take_master_time(
        self,
        nonce: int,
        reply: pb.HeartbeatResponse | pb.MountSegmentResponse,
        sent: float,
        *,
        mount: bool = False,
    ) -> None:
        """Pass the master's time in an OK reply to a request sent at `sent` (monotonic) with
        `nonce` on to the node's clock of the master; with a control key, only a time the
        master signed over that nonce."""
        if self._on_master_time is None or not reply.master_time_ms:
            return
        key = self._time_key()
        if key is None or master_time_signed(
            key, self.node_id, self.incarnation, nonce, reply.master_time_ms, reply.time_signature
        ):
            # A mount reply says how old a reading may get (the master's heartbeat TTL).
            ttl = reply.heartbeat_ttl_s if mount else None  # type: ignore[union-attr]
            self._on_master_time(reply.master_time_ms, sent, time.monotonic(), mount=mount,
                                 max_age_s=ttl)  # fmt: skip

    def _close(self) -> None:
        """The master forgot this node (or never mounted it): refuse writes until it has."""
        if self._on_fences is not None:
            self._on_fences(None, "")
            self._closed_at = time.monotonic()

    def drain(self, timeout_s: float) -> pb.DrainNodeResponse:
        """Ask the master to drain this node (or how far the drain is); raises grpc.RpcError."""
        request = pb.DrainNodeRequest(node_id=self.node_id, incarnation=self.incarnation)
        signed = self._signed("DrainNode", request)
        return self._stub.DrainNode(request, timeout=timeout_s, metadata=signed)  # type: ignore[no-any-return]

    def stop(self, *, unmount: bool = True) -> None:
        """Stop heartbeating and (by default) unmount so the master drops this node at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        with self._remount_lock:
            remounting = self._remounting
        if remounting is not None and remounting.is_alive():
            remounting.join(timeout=self._mount_timeout_s + 1)
        if unmount and self.mounted.is_set():
            request = pb.UnmountSegmentRequest(node_id=self.node_id, incarnation=self.incarnation)
            try:
                signed = self._signed("UnmountSegment", request)
                self._stub.UnmountSegment(request, timeout=self._unmount_timeout_s, metadata=signed)
            except grpc.RpcError as exc:
                log.warning("unmount from %s failed: %s", self.master, exc.code().name)
        if self._beat_channel is not None:
            self._beat_channel.close()
        self._channel.close()
