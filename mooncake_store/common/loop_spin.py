"""Keep an event loop polling instead of sleeping while requests come close together.

A loop with nothing to do sleeps in epoll, and the next request pays the wake-up: on the 2-core
VMs ~50-150 us of a ~250 us same-host put's master call.  `LoopSpinner` keeps the loop turning
(each turn polls the sockets without sleeping) for `window_s` after a request, but only when
that request came within `window_s` of the one before: a spin that would have caught it.  So a
client putting small values back to back finds the master awake, while a master whose requests
are further apart (big values, idle clients) never spins and costs nothing.

The rule is `spins` (pure, injected clock); `LoopSpinner` runs it on a loop.  Spinning takes a
core while it lasts: worth it where the master has cores of its own, not where it shares two
with the nodes and clients it serves (the master's `--busy-poll`, off by default; README).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def spins(now_s: float, last_s: float, window_s: float) -> bool:
    """Whether a request at `now_s` whose predecessor came at `last_s` starts a spin."""
    return window_s > 0 and now_s - last_s <= window_s


class LoopSpinner:
    """Spins the running loop for `window_s` after each request that `spins` admits."""

    def __init__(self, window_s: float, clock: Callable[[], float] = time.perf_counter) -> None:
        self.window_s = window_s
        self._clock = clock
        self._last_s = float("-inf")
        self._until_s = float("-inf")
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.spins = 0  # spins started
        self.turns = 0  # loop turns spun (a test reads them: zero while idle)

    def activity(self) -> None:
        """A request arrived (call it on the loop)."""
        now = self._clock()
        start = spins(now, self._last_s, self.window_s)
        self._last_s = now
        if not start or self._stopped:
            return
        self._until_s = now + self.window_s
        if self._task is None:
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._spin())
        assert self._wake is not None
        if not self._wake.is_set():
            self.spins += 1
            self._wake.set()

    async def _spin(self) -> None:
        assert self._wake is not None
        while True:
            if self._clock() < self._until_s:
                self.turns += 1
                await asyncio.sleep(0)  # one loop turn: its poll of the sockets does not sleep
                continue
            self._wake.clear()
            await self._wake.wait()

    async def stop(self) -> None:
        """Stop spinning for good (the server is stopping)."""
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
