"""Clocks: monotonic time for every duration inside a process, wall time only at the edges.

The master's cores (object table, membership, replication, tiering) run on `time.monotonic`:
TTLs, leases, put deadlines, grace windows and pins are differences of monotonic instants, so a
wall-clock step (an NTP correction, an operator's `date -s`) changes none of them.  Wall time is
used only for values that leave the process:

- grant expiry (`common/grant.py`): the master signs a wall-clock expiry that the node checks
  against the master's clock as signed heartbeat replies carry it (`node/master_clock.py`), so
  node clocks need not agree with the master's; a step of the master's clock shortens or
  lengthens the grants issued just before it (by the step), and never deletes anything.  A
  step back lengthens them on the node, so every expiry signed is noted in `SIGNED_OFFSETS`,
  and what the master gives away once a write grant has expired waits for the node's clock of
  the master to pass that expiry too (`OffsetLog.behind`, master/fences.py);
- a pin's end in RocksDB (`master/persistence.py`), which must mean the same after a reboot.

`to_wall` and `to_monotonic` convert an instant between the two at the moment of the call; 0
(never) and infinity (forever) are kept as they are.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial


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
    """The wall-clock offsets (wall minus monotonic) that grant expiries were signed with, and
    those the master's time was published with (heartbeat and mount replies), by the monotonic
    second: enough to say how far behind the signing clock a node's clock of the master may be
    now (pure: both clocks injected).

    Signed seconds older than `keep_s` fold into one floor, so the log stays small; a question
    about them is answered with the largest offset of that whole span (never less than the
    truth).
    """

    TOLERANCE_S = 0.001  # expiries are whole milliseconds: less than this is no step

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
        self._signed: dict[int, float] = {}  # monotonic second -> largest offset signed
        self._published: dict[int, float] = {}  # monotonic second -> smallest offset published
        self._oldest = 0  # signed seconds before this are folded into _floor
        self._floor = -math.inf
        self._top = -math.inf  # the largest offset signed (the quick answer of `behind`)

    def offset_s(self) -> float:
        """Wall minus monotonic now."""
        return self._wall() - self._monotonic()

    def expiry_ms(self, monotonic_s: float) -> int:
        """The wall-clock millisecond of monotonic instant `monotonic_s` (a grant's expiry),
        noting the offset it was signed with."""
        now = self._monotonic()
        offset = self._wall() - now
        second = int(now)
        if offset > self._signed.get(second, -math.inf):
            self._signed[second] = offset
            self._top = max(self._top, offset)
            if second - self._oldest > 2 * self._keep_s:
                self._fold(second - int(self._keep_s))
        return int((monotonic_s + offset) * 1000)

    def published_ms(self) -> int:
        """The master's wall time now in milliseconds, for a node's clock of the master,
        noting the offset it was published with."""
        now = self._monotonic()
        offset = self._wall() - now
        second = int(now)
        if offset < self._published.get(second, math.inf):
            self._published[second] = offset
            if len(self._published) > 2 * self._keep_s:
                self._published = {
                    k: v for k, v in self._published.items() if k > second - self._keep_s
                }
        return int((now + offset) * 1000)

    def behind(self, stale_s: float) -> Callable[[float, float], float]:
        """`behind(since, until)`: how far a node's clock of the master may be behind the one
        expiries were signed by between monotonic instants `since` and `until` (0 when it is
        not): a grant signed then and expiring at monotonic `e` lasts on its node until `e`
        plus this.  A node's clock is the offset of a reply it took in the last `stale_s`
        seconds (a node silent longer is not offered to puts), or the one now."""
        now = self._monotonic()
        node_offset = min(
            [self._wall() - now]
            + [o for second, o in self._published.items() if second >= int(now - stale_s)]
        )
        if self._top <= node_offset + self.TOLERANCE_S:
            return _NOT_BEHIND  # no step back since anything in the log was signed
        return partial(self._behind, node_offset)

    def _behind(self, node_offset: float, since_s: float, until_s: float) -> float:
        lo, hi = int(since_s), int(until_s)
        signed = self._floor if lo < self._oldest else -math.inf
        if hi - lo < len(self._signed):
            found = (self._signed.get(second, -math.inf) for second in range(lo, hi + 1))
        else:
            found = (o for second, o in self._signed.items() if lo <= second <= hi)
        signed = max(signed, *found, -math.inf)
        behind = signed - node_offset
        return behind if behind > self.TOLERANCE_S else 0.0

    def _fold(self, before: int) -> None:
        for second in [s for s in self._signed if s < before]:
            self._floor = max(self._floor, self._signed.pop(second))
        self._oldest = before
        self._top = max([self._floor, *self._signed.values()])


def _NOT_BEHIND(since_s: float, until_s: float) -> float:
    return 0.0


SIGNED_OFFSETS = OffsetLog()  # the process's: every grant the master signs goes through it


def expiry_ms(monotonic_s: float) -> int:
    """A grant's expiry: the wall-clock millisecond of a monotonic instant (noted in
    SIGNED_OFFSETS)."""
    return SIGNED_OFFSETS.expiry_ms(monotonic_s)
