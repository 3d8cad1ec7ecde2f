"""Clocks: monotonic time for every duration inside a process, wall time only at the edges.

The master's cores (object table, membership, replication, tiering) run on `time.monotonic`:
TTLs, leases, put deadlines, grace windows and pins are differences of monotonic instants, so a
wall-clock step (an NTP correction, an operator's `date -s`) changes none of them.  Wall time is
used only for values that leave the process:

- grant expiry (`common/grant.py`): the master signs an expiry in its clock (`SIGNED_OFFSETS`:
  the wall clock, never going back) that the node checks against the master's clock as signed
  heartbeat replies carry it (`node/master_clock.py`), so node clocks need not agree with the
  master's; a step forward of the master's clock shortens the grants issued just before it,
  and what the master gives away once a write grant expired waits for every reading a node
  may still hold to pass that expiry (`OffsetLog.behind`, master/fences.py);
- a pin's end in RocksDB (`master/persistence.py`), which must mean the same after a reboot.

`to_wall` and `to_monotonic` convert an instant between the two at the moment of the call; 0
(never) and infinity (forever) are kept as they are.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from functools import partial

log = logging.getLogger("mooncake.clock")


def _offset_s() -> float:
    return time.time() - time.monotonic()


def to_wall(monotonic_s: float) -> float:
    """The wall-clock instant of a monotonic one (0 and inf unchanged)."""
    if monotonic_s == 0.0 or math.isinf(monotonic_s):
        return monotonic_s
    return monotonic_s + _offset_s()


def to_monotonic(wall_s: float) -> float:
    """The monotonic instant of a wall-clock one (0 and inf unchanged)."""
    if wall_s == 0.0 or math.isinf(wall_s):
        return wall_s
    return wall_s - _offset_s()


class OffsetLog:
    """The master's clock for everything it tells nodes (grant expiries, its time in heartbeat
    and mount replies, control request stamps): the wall clock, except that it never goes back.
    A step back of the wall clock would lengthen on the nodes every grant signed before it,
    even after the master gave the grant's extent to another put, so it is not followed: the
    offset (wall minus monotonic) only grows, and the warning says by how much the wall clock
    went back.  A restarted master takes the wall clock as it is; its nodes mount again, and a
    mount's first fence ends every grant of earlier runs.  Pure: both clocks injected.

    A step forward is followed, and it too can lengthen a grant, on a node whose last reading
    of the master's time is from before the step: the log notes, per monotonic second, the
    offsets expiries were signed with and those readings were published with, so `behind` can
    say how much later than its monotonic expiry a grant may still work on a node.  Signed
    seconds older than `keep_s` fold into one floor (never answering less than the truth).
    Safe to call from any thread (heartbeat replies are made on the liveness server's).
    """

    TOLERANCE_S = 0.001  # expiries are whole milliseconds: less than this is no step
    STEP_WARNING_S = 1.0

    def __init__(
        self,
        *,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        keep_s: float = 3600.0,
    ) -> None:
        self._monotonic = monotonic
        self._wall = wall
        self._keep_s = keep_s
        self._lock = threading.Lock()
        self._high = -math.inf  # the offset in use: the largest seen
        self._signed: dict[int, float] = {}  # monotonic second -> largest offset signed
        self._published: dict[int, float] = {}  # monotonic second -> smallest published
        self._oldest = 0  # seconds before this are folded into the floors
        self._floor = -math.inf  # largest offset signed before _oldest
        self._published_floor = math.inf  # smallest offset published before _oldest
        self._top = -math.inf  # the largest offset signed (the quick answer of `behind`)
        self.ignored_back_s = 0.0  # how far the wall clock went back, not followed

    def _now(self) -> tuple[float, float]:
        """(monotonic now, the offset in use); under the lock."""
        now = self._monotonic()
        offset = self._wall() - now
        if offset < self._high:
            back = self._high - offset
            if back > self.ignored_back_s + self.STEP_WARNING_S:
                log.warning(
                    "the wall clock went back %.1f s: grant expiries and the time sent to nodes "
                    "keep to the clock before it (a restarted master takes the new one)",
                    back,
                )
            self.ignored_back_s = max(self.ignored_back_s, back)
            return now, self._high
        self._high = offset
        return now, offset

    def now_s(self) -> float:
        """The master's clock now (seconds), for a control request's stamp."""
        with self._lock:
            now, offset = self._now()
        return now + offset

    def expiry_ms(self, monotonic_s: float) -> int:
        """The master's-clock millisecond of monotonic instant `monotonic_s` (a grant's
        expiry), noting the offset it was signed with."""
        with self._lock:
            now, offset = self._now()
            second = int(now)
            if offset > self._signed.get(second, -math.inf):
                self._signed[second] = offset
                self._top = max(self._top, offset)
                if second - self._oldest > 2 * self._keep_s:
                    self._fold(second - int(self._keep_s))
        return int((monotonic_s + offset) * 1000)

    def published_ms(self) -> int:
        """The master's clock now in milliseconds, for a node's reading of it, noting the
        offset it was published with."""
        with self._lock:
            now, offset = self._now()
            second = int(now)
            if offset < self._published.get(second, math.inf):
                self._published[second] = offset
                if second - self._oldest > 2 * self._keep_s:
                    self._fold(second - int(self._keep_s))
        return int((now + offset) * 1000)

    def behind(self, stale_s: float) -> Callable[[float, float], float]:
        """`behind(since, until)`: how far a node's reading of the master's clock may be behind
        the clock expiries were signed with between monotonic instants `since` and `until` (0
        when it is not): a grant signed then and expiring at monotonic `e` may work on its node
        until `e` plus this.  A node takes a reading from each reply and refuses writes once
        its reading is older than the heartbeat TTL (node/master_clock.py), so readings
        published in the last `stale_s` seconds (that TTL and a margin) count, and now's."""
        with self._lock:
            now, node_offset = self._now()
            lo = int(now - stale_s)
            if lo < self._oldest:
                node_offset = min(node_offset, self._published_floor)
            for second in range(max(lo, self._oldest), int(now) + 1):
                node_offset = min(node_offset, self._published.get(second, math.inf))
            if self._top <= node_offset + self.TOLERANCE_S:
                return _NOT_BEHIND  # nothing was signed ahead of what a node may hold
            return partial(self._behind, node_offset)

    def _behind(self, node_offset: float, since_s: float, until_s: float) -> float:
        lo, hi = int(since_s), int(until_s)
        with self._lock:
            signed = self._floor if lo < self._oldest else -math.inf
            if hi - lo < len(self._signed):
                found = [self._signed.get(second, -math.inf) for second in range(lo, hi + 1)]
            else:
                found = [o for second, o in self._signed.items() if lo <= second <= hi]
        signed = max(signed, *found, -math.inf)
        behind = signed - node_offset
        return behind if behind > self.TOLERANCE_S else 0.0

    def _fold(self, before: int) -> None:
        """Fold the seconds before `before` into the floors; under the lock."""
        for second in [s for s in self._signed if s < before]:
            self._floor = max(self._floor, self._signed.pop(second))
        for second in [s for s in self._published if s < before]:
            self._published_floor = min(self._published_floor, self._published.pop(second))
        self._oldest = before
        self._top = max([self._floor, *self._signed.values()])


def _NOT_BEHIND(since_s: float, until_s: float) -> float:
    return 0.0


SIGNED_OFFSETS = OffsetLog()  # the process's: every grant the master signs goes through it


def expiry_ms(monotonic_s: float) -> int:
    """A grant's expiry: the master's-clock millisecond of a monotonic instant (noted in
    SIGNED_OFFSETS)."""
    return SIGNED_OFFSETS.expiry_ms(monotonic_s)
