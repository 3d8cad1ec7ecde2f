"""Hands the pool's memfd to same-host clients over an abstract unix socket (SCM_RIGHTS).

A client that can connect to the socket named in a replica location is on this host.  If the
kernel's credentials of the peer (`SO_PEERCRED`) show the node's own uid or a member of the
node's shm group, it receives the descriptor (and, read-only, the page of the node's write fences:
common/shm_fence.py) plus the segment id and size, maps the pool once and
copies directly; anyone else is told REFUSED and uses the TCP data path (see
`common/shm_handoff.py`).  Abstract sockets live in the network namespace, so this never
crosses hosts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from mooncake_store.common.shm_handoff import HELLO, REFUSED, peer_allowed, peer_of

log = logging.getLogger("mooncake.node")


class ShmServer:
    def __init__(
        self,
        name: str,
        fd: int,
        segment_id: int,
        size_bytes: int,
        *,
        group_gid: int | None = None,
        fence_fd: int | None = None,
    ) -> None:
        self.name = name
        self._fd = fd
        # The write fences' page, reopened read-only: a client cannot map it for writing.
        self._fence_fd = (
            -1 if fence_fd is None else os.open(f"/proc/self/fd/{fence_fd}", os.O_RDONLY)
        )
        self._hello = HELLO.pack(segment_id, size_bytes)
        self._uid = os.getuid()
        self._group_gid = group_gid
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + name)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="shm-server", daemon=True)
        self._closed = False
        self.granted = 0
        self.refused = 0
        self._refused_uids: set[int] = set()

    def start(self) -> None:
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    self._hand_off(conn)
                except OSError as exc:
                    log.debug("shm hand-off failed: %s", exc)

    def _hand_off(self, conn: socket.socket) -> None:
        peer = peer_of(conn)
        if not peer_allowed(peer, node_uid=self._uid, group_gid=self._group_gid):
            self.refused += 1
            if peer.uid not in self._refused_uids:  # once per uid: a client asks per process
                self._refused_uids.add(peer.uid)
                log.warning(
                    "refused the shared-memory pool to pid %d (uid %d): only uid %d%s may map "
                    "it; that client uses TCP", peer.pid, peer.uid, self._uid,
                    "" if self._group_gid is None else f" and group {self._group_gid}",
                )  # fmt: skip
            conn.sendall(REFUSED)
            return
        fds = [self._fd] if self._fence_fd < 0 else [self._fd, self._fence_fd]
        socket.send_fds(conn, [self._hello], fds)
        self.granted += 1

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=2)
        if self._fence_fd >= 0:
            os.close(self._fence_fd)
            self._fence_fd = -1
