"""Clocks: monotonic time for every duration inside a process, wall time only at the edges.

The master's cores (object table, membership, replication, tiering) run on `time.monotonic`:
TTLs, leases, put deadlines, grace windows and pins are differences of monotonic instants, so a
wall-clock step (an NTP correction, an operator's `date -s`) changes none of them.  Wall time is
used only for values that leave the process:

- grant expiry (`common/grant.py`): the master signs a wall-clock expiry that the node checks
  against the master's clock as signed heartbeat replies carry it (`node/master_clock.py`), so
  node clocks need not agree with the master's; a step of the master's clock shortens or
  lengthens the grants issued just before it (by the step), and never deletes anything;
- a pin's end in RocksDB (`master/persistence.py`), which must mean the same after a reboot.

`to_wall` and `to_monotonic` convert an instant between the two at the moment of the call; 0
(never) and infinity (forever) are kept as they are.
"""

from __future__ import annotations

import math
import time


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


def expiry_ms(monotonic_s: float) -> int:
    """A grant's expiry: the wall-clock millisecond of a monotonic instant."""
    return int(to_wall(monotonic_s) * 1000)
