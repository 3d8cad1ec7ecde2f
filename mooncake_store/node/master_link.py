"""The node's link to the master: mount, heartbeats from a dedicated thread, unmount.

Heartbeats run on their own thread with a blocking gRPC channel, so a busy event loop (a burst
of large transfers) cannot starve them and get a live node declared dead.  When the master does
not know the node (it restarted, or it declared the node dead after a stall), the thread mounts
again with the same incarnation and a fresh inventory of the persistent tiers, which lets a
restarted master rebuild its allocators from the replicas it reloaded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.errors import OK, SegmentNotFoundError
from mooncake_store.common.grpc_options import message_options
from mooncake_store.common.tls import PLAINTEXT, TlsConfig

log = logging.getLogger("mooncake.node")


class MasterLink:
    def __init__(
        self,
        master: str,
        build_mount: Callable[[], pb.MountSegmentRequest],
        *,
        tls: TlsConfig = PLAINTEXT,
    ) -> None:
        self.master = master
        self._build_mount = build_mount
        first = build_mount()
        self.node_id = first.node_id
        self.incarnation = first.incarnation
        options = message_options(256 * 1024 * 1024)
        if tls.serves:  # a node with TLS talks TLS to its master, presenting its certificate
            self._channel = grpc.secure_channel(master, tls.grpc_channel_credentials(), options)
        else:
            self._channel = grpc.insecure_channel(master, options=options)
        self._stub = pb_grpc.MasterServiceStub(self._channel)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self.interval_s = 1.0
        self.mounted = threading.Event()
        self.refusal = ""  # the master's reason when it refused the last mount
        self.heartbeats = 0

    def mount(self, timeout_s: float) -> bool:
        """Mount the node's segments; False (and a log line) when the master is unreachable."""
        try:
            request = self._build_mount()
            reply = self._stub.MountSegment(request, timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as exc:
            log.warning("cannot mount on master %s: %s: %s", self.master, exc.code().name,
                        exc.details())  # fmt: skip
            self.mounted.clear()
            return False
        if reply.status.code != OK:
            log.error("master %s refused the mount: %s", self.master, reply.status.message)
            self.refusal = reply.status.message
            return False
        self.refusal = ""
        if reply.heartbeat_interval_s > 0:
            self.interval_s = reply.heartbeat_interval_s
        if not self.mounted.is_set():
            log.info("mounted on master %s as %s (%d segments)", self.master, self.node_id,
                     len(request.segments))  # fmt: skip
        self.mounted.set()
        return True

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.mounted.is_set():
                self.mount(timeout_s=max(self.interval_s, 1.0))
                continue
            request = pb.HeartbeatRequest(node_id=self.node_id, incarnation=self.incarnation)
            try:
                reply = self._stub.Heartbeat(request, timeout=max(self.interval_s, 1.0))
            except grpc.RpcError as exc:
                log.warning("heartbeat to %s failed: %s", self.master, exc.code().name)
                continue
            self.heartbeats += 1
            if reply.status.code == SegmentNotFoundError.code:
                log.warning("master %s forgot this node; mounting again", self.master)
                self.mount(timeout_s=max(self.interval_s, 1.0))

    def stop(self, *, unmount: bool = True) -> None:
        """Stop heartbeating and (by default) unmount so the master drops this node at once."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        if unmount and self.mounted.is_set():
            request = pb.UnmountSegmentRequest(node_id=self.node_id, incarnation=self.incarnation)
            try:
                self._stub.UnmountSegment(request, timeout=2)
            except grpc.RpcError as exc:
                log.warning("unmount from %s failed: %s", self.master, exc.code().name)
        self._channel.close()
