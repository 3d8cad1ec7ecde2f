"""Put attempts whose reply never came, so that a retried put is not refused as busy.

A two-phase put leaves a pending put on the master from its PutStart until its PutEnd (or a
revoke).  When the PutStart's or the PutEnd's reply never reaches the client (the call timed
out, or the connection was lost after the request went out), the client cannot tell whether
that put is still pending, and a put of the same key would be refused (ObjectBusyError) until
the master reclaims it (`put_timeout_s`, 30 s by default).

So every PutStart item names an attempt id (random, nonzero) and a retry count.  The id of a
put whose call got no reply is kept here, by key, and the next put of that key sends it again
with the count one higher: the master revokes the pending put of that id and a lower count (its
writer, this client, never got its grant or had finished writing with it) and starts the new
one in its place, or waits for its commit when its PutEnd came (master/puts.py `put_start`).
A put whose reply came has forgotten its id (`start` took it).  The ids of at most `MAX_KEPT`
keys are kept (the oldest go first); a key whose id was dropped is only refused as before.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence

from mooncake_store.common.errors import MasterTimeoutError, MasterUnavailableError

MAX_KEPT = 4096

_random = random.SystemRandom()


def unanswered(error: BaseException) -> bool:
    """True for a master call's failure that may or may not have taken effect: no reply in
    time, a connection lost after sending, or the call abandoned while it was out (the
    caller's own timeout cancelled it, an interrupt, the flow closed)."""
    return isinstance(
        error,
        (
            MasterTimeoutError, MasterUnavailableError, asyncio.CancelledError,
            KeyboardInterrupt, GeneratorExit,
        ),
    )  # fmt: skip


class PutAttempts:
    """The attempts of this client's puts whose reply never came (see the module docstring).
    Shared by the threads of one client."""

    def __init__(self, max_kept: int = MAX_KEPT) -> None:
        self._kept: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self._max_kept = max_kept
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._kept)

    def start(self, keys: Sequence[str]) -> list[tuple[int, int]]:
        """(attempt id, retry count) for a PutStart of each of `keys`: a kept attempt of the
        key with its count one higher, else a new id.  A kept attempt is taken: one try of it
        at a time (a put of the key meanwhile gets a new id, and is refused as busy while this
        one is pending), until `lost` keeps it again."""
        out = []
        with self._lock:
            for key in keys:
                kept = self._kept.pop(key, None)
                out.append((kept[0], kept[1] + 1) if kept else (_random.getrandbits(64) or 1, 0))
        return out

    def lost(self, key: str, attempt: tuple[int, int]) -> None:
        """A call of `key`'s put made as `attempt` got no reply: its next put names it."""
        if not attempt[0]:
            return
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None and kept[0] == attempt[0] and kept[1] > attempt[1]:
                return  # a later try of it was lost as well: keep the higher count
            self._kept[key] = attempt
            self._kept.move_to_end(key)
            while len(self._kept) > self._max_kept:
                self._kept.popitem(last=False)
