"""Waiting for a reply without sleeping: poll the socket for a while before the read blocks.

A thread that blocks in recv and is woken by the reply pays a wake-up: on small VMs ~30-70 us
of a ~150 us master call (measured on the 2-core VM by scripts/bench_busy_poll.py: a 64 KiB
same-host put 285 -> 249 us p50, a 64 KiB same-host get 148 -> 119 us, a TCP put 444 -> 370).
The price is the thread's CPU while it polls, so the sync Client polls only while one of its
threads is in an operation (sync_client.py `busy_poll_us`), and a socket whose reply did not
come within the window (a busy host, a long call) is not polled for its next `BACKOFF_CALLS`
replies.
"""

from __future__ import annotations

import select
import socket
import ssl
import time

BACKOFF_CALLS = 16


class BusyPoll:
    """Polls one socket for input, backing off after a poll that found none in time."""

    def __init__(self, sock: socket.socket) -> None:
        # None under TLS, where a reply may wait decrypted in the SSL object while the socket
        # itself is idle.  poll(), not select(): select cannot watch a socket numbered >= 1024.
        self._poller: select.poll | None = None
        if not isinstance(sock, ssl.SSLSocket):
            self._poller = select.poll()
            self._poller.register(sock, select.POLLIN)
        self._skip = 0
        self.polls = self.hits = 0  # polls made, and those that saw the input arrive

    def readable(self) -> bool:
        """Whether the socket has input (or is closed or failed) now; False under TLS."""
        return self._poller is not None and bool(self._poller.poll(0))

    def wait(self, seconds: float) -> None:
        """Return when the socket has input (or is closed or failed: the read takes it from
        there), after `seconds`, or at once while backing off."""
        poller = self._poller
        if poller is None or seconds <= 0:
            return
        if self._skip:
            self._skip -= 1
            return
        self.polls += 1
        end = time.perf_counter() + seconds
        while not poller.poll(0):
            if time.perf_counter() >= end:
                self._skip = BACKOFF_CALLS
                return
        self.hits += 1
