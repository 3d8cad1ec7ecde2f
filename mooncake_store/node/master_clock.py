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

A reading gets old when replies stop coming back (the master down, replies lost or late,
mounts too slow to be taken) while the master may still hear the node.  The master gives
away the extent of a put that ended only once every reading a node could hold has passed its
grant's expiry, counting readings up to its heartbeat TTL old (common/clock.py OffsetLog), so
`stale()` says when the reading is older than that TTL (the mount reply says it): the node then
refuses writes (node/data_server.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A mount reply is off by up to half its round trip, and a mount may wait long for its master
# (`wait_for_ready`): one that took longer than this replaces no reading (the next heartbeat
# brings a better one), but beats having none.
LONG_ROUND_TRIP_S = 1.0
# What `watcher` is shown while the reading is stale: a master's clock at the end of time, by
# which every grant has expired, so same-host clients copy under none (common/shm_fence.py).
STALE_OFFSET_MS = float(1 << 62)


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
        self._taken_s = 0.0  # when the request that brought the reading was sent (monotonic)
        #: How old a reading may get before `stale()` (the master's heartbeat TTL; 0: never).
        self.max_age_s = 0.0
        self._shown_stale = False
        self._lock = threading.Lock()  # observed on the link's thread, read on the loop
        self._changed = threading.Condition(self._lock)  # a reading or a limit came in
        self._watching: threading.Thread | None = None
        self._stop_watching = False
        # Called with each new offset (the node shows it to same-host clients in the fence
        # page: common/shm_fence.py); on the thread that observed it.
        self.watcher: Callable[[float], None] | None = None

    def observe(
        self,
        master_ms: int,
        sent_s: float,
        received_s: float,
        *,
        mount: bool = False,
        max_age_s: float | None = None,
    ) -> None:
        """A reply that left the master at `master_ms` (its wall clock) came back to a request
        sent at `sent_s` and answered at `received_s` (this node's monotonic clock).  Every
        heartbeat reply is taken (so a step of the master's clock is followed at the next one,
        however slow the replies); a `mount` reply slower than LONG_ROUND_TRIP_S only when
        there is no reading yet.  `max_age_s` (a mount reply's: the master's heartbeat TTL)
        replaces `max_age_s`, taken or not."""
        if max_age_s is not None:
            with self._lock:
                self.max_age_s = max(0.0, max_age_s)
                self._changed.notify_all()
        if master_ms <= 0 or received_s < sent_s:
            return  # a master that sends no time, or a clock that went wrong
        middle_ms = (sent_s + received_s) * 500.0
        with self._lock:
            if mount and self._offset_ms is not None and received_s - sent_s > LONG_ROUND_TRIP_S:
                return
            self._offset_ms = master_ms - middle_ms
            self._taken_s = sent_s
            self._shown_stale = False
            self._changed.notify_all()
            if self.watcher is not None:  # under the lock: shown in the order observed
                self.watcher(self._offset_ms)

    def _left_s(self) -> float | None:
        """Seconds until the reading goes stale (below 0: it is; no reading with a limit set
        is stale), None with no limit; under the lock."""
        if self.max_age_s <= 0:
            return None
        if self._offset_ms is None:
            return -1.0
        return self._taken_s + self.max_age_s - self._monotonic()

    def stale(self) -> bool:
        """True when the reading is older than `max_age_s` (counted from when the request that
        brought it was sent), or there is none while a maximum age is set."""
        if self.max_age_s <= 0:
            return False
        with self._lock:
            left = self._left_s()
        return left is not None and left < 0

    def start_watching(self) -> None:
        """Show `watcher` STALE_OFFSET_MS the moment the reading goes stale, from a thread of
        its own: the heartbeat loop may be blocked on the very replies whose absence makes it
        stale, and the master stops counting the reading a second after its TTL."""
        if self._watching is None:
            self._stop_watching = False
            self._watching = threading.Thread(
                target=self._watch, name="mooncake-master-clock", daemon=True
            )
            self._watching.start()

    def stop_watching(self) -> None:
        with self._lock:
            self._stop_watching = True
            self._changed.notify_all()
        if self._watching is not None:
            self._watching.join(timeout=5)
            self._watching = None

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._stop_watching:
                    return
                left = self._left_s()
                if left is None or self._shown_stale:
                    self._changed.wait()  # until a limit or a reading comes in
                    continue
                if left >= 0:
                    self._changed.wait(left + 0.001)
                    continue
            self.show_if_stale()

    def show_if_stale(self) -> None:
        """Show `watcher` STALE_OFFSET_MS once the reading went stale (the next reading taken
        shows the real offset again)."""
        with self._lock:
            left = self._left_s()
            if self._shown_stale or left is None or left >= 0:
                return  # shown already, not stale, or no limit
            self._shown_stale = True
            if self.watcher is not None:
                self.watcher(STALE_OFFSET_MS)

    def now_ms(self) -> int:
        with self._lock:
            offset = self._offset_ms
        if offset is None:
            return int(self._wall() * 1000)
        return int(self._monotonic() * 1000 + offset)
