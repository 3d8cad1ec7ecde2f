"""The master's wall clock as this node reads it (pure core: clocks injected).

Grants name their expiry in the master's wall-clock milliseconds (common/grant.py).  A node
that compared them with its own wall clock refused every grant while the master's clock
stood behind (an NTP step back, a host with a skewed clock: a chaos run saw ~100 puts fail
per 60 s step back) and honoured them for too long while it stood ahead.  So each heartbeat
reply carries the master's wall time, and the node keeps the master's clock as an offset from
its own *monotonic* clock, taken at the middle of the round trip that brought it: a step of
either wall clock is followed within one heartbeat, and the node's own wall clock plays no
part once one reply is in.  Before that (or with a master that sends no time), the node's
wall clock stands in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A mount reply is off by up to half its round trip, and a mount may wait long for its master
# (`wait_for_ready`): one that took longer than this replaces no reading (the next heartbeat
# brings a better one), but beats having none.
LONG_ROUND_TRIP_S = 1.0


class MasterClock:
    """`now_ms()`: the master's wall clock now, in milliseconds (see the module docstring)."""

    def __init__(
        self,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._offset_ms: float | None = None  # master wall ms - node monotonic ms
        self._lock = threading.Lock()  # observed on the link's thread, read on the loop
        # Called with each new offset (the node shows it to same-host clients in the fence
        # page: common/shm_fence.py); on the thread that observed it.
        self.watcher: Callable[[float], None] | None = None

    def observe(
        self, master_ms: int, sent_s: float, received_s: float, *, mount: bool = False
    ) -> None:
        """A reply that left the master at `master_ms` (its wall clock) came back to a request
        sent at `sent_s` and answered at `received_s` (this node's monotonic clock).  Every
        heartbeat reply is taken (so a step of the master's clock is followed at the next one,
        however slow the replies); a `mount` reply slower than LONG_ROUND_TRIP_S only when
        there is no reading yet."""
        if master_ms <= 0 or received_s < sent_s:
            return  # a master that sends no time, or a clock that went wrong
        middle_ms = (sent_s + received_s) * 500.0
        with self._lock:
            if mount and self._offset_ms is not None and received_s - sent_s > LONG_ROUND_TRIP_S:
                return
            self._offset_ms = master_ms - middle_ms
            if self.watcher is not None:  # under the lock: shown in the order observed
                self.watcher(self._offset_ms)

    def now_ms(self) -> int:
        with self._lock:
            offset = self._offset_ms
        if offset is None:
            return int(self._wall() * 1000)
        return int(self._monotonic() * 1000 + offset)
