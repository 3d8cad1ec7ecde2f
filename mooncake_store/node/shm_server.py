"""Hands the pool's memfd to same-host clients over an abstract unix socket (SCM_RIGHTS).

A client that can connect to the socket named in a replica location is on this host; it
receives the descriptor plus the segment id and size, maps the pool once and copies directly.
Abstract sockets live in the network namespace, so this never crosses hosts.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading

log = logging.getLogger("mooncake.node")

HELLO = struct.Struct("<QQ")  # segment id, size


class ShmServer:
    def __init__(self, name: str, fd: int, segment_id: int, size_bytes: int) -> None:
        self.name = name
        self._fd = fd
        self._hello = HELLO.pack(segment_id, size_bytes)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + name)
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name="shm-server", daemon=True)
        self._closed = False

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
                    socket.send_fds(conn, [self._hello], [self._fd])
                except OSError as exc:
                    log.debug("shm hand-off failed: %s", exc)

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
