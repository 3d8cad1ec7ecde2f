"""Which client writes a node's DRAM segment still takes (pure: no I/O, time passed in).

Two rules end a WRITE grant (common/grant.py) on the node, both checked before a byte moves:

- **Seals (synchronous).**  A grant writes each of its bytes once.  When a write's payload has
  completely landed in the pool, its byte range is sealed for (segment, the grant's put
  generation); a later write of that generation overlapping a sealed range, or one still being
  received, is refused.  So once a put's bytes are written, its own grant cannot change them:
  not after PutEnd, PutRevoke or Remove, and not in the moments before the master's next fence.
  Writes of one grant at disjoint ranges all work (a grant covering several blocks, a value
  written in pieces).  A write that fails part-way (the connection is lost mid-payload) seals
  nothing, so the client may send it again.
- **Fences (from the master).**  `WriteFence(floor, open)`: generations below `floor` and not
  in `open` are ended (their put was committed, revoked, timed out or removed).  The mount reply
  gives each DRAM segment its first fence (`mounted`), so a node the master mounts afresh
  (after it forgot the node, or after the master restarted) refuses every grant issued before
  that mount at once; the master's FenceWrites pushes later ones (`fenced`).  A write is
  admitted only when both the mount fence and the latest pushed fence admit it: a push computed
  before the mount and delivered after it can end generations, never reopen one, and a mount
  reply delivered after a later push keeps that push.  A segment
  the node is (re)mounting is `closed` (refuses every write) until the mount reply arrives,
  or, while a mount it keeps serving through (`mounting`) is under way, refuses every write.
Every fence change also goes to `watcher`: the node shows the fences to same-host clients in
shared memory, since their copies into the pool never reach the gate (common/shm_fence.py).

A fence also ends the writes of its ended generations that are still being received: the
master hands their extents to other puts as soon as the node has answered it, so the data paths
ask `ended` again before each piece of a payload goes into the pool and cut such a write off
(`CUT_OFF`: the rest is discarded, nothing is sealed).

Bounds: a generation's seals are dropped once a fence ends it, or once the latest expiry of
its grants has passed (an expired grant is refused anyway), so the node keeps seals only for
puts that may still write: in steady state the writes of about one master tick; with no fence
arriving at all, the writes of at most `put_timeout_s`.  Each completed write adds at most one
interval; a generation's intervals are kept sorted, disjoint and merged when adjacent, and
found by bisection (O(log n) search; inserting moves a list tail, which is memmove-cheap).
Writes being received are at most one per connection.

Same-host copies: a same-host client maps the pool read-write (client/shm.py, handed only to the
node's own uid, or its group with --shm-group), so its copies never reach this gate and are never
sealed.  The gate's fences reach them anyway: `watcher` mirrors every fence change into a page
of shared memory the client checks before (and while) it copies (common/shm_fence.py); an
honest client copies only under a grant the fences admit.
"""

from __future__ import annotations

import threading
from bisect import bisect_left, bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field

from mooncake_store.common.grant import WriteFence
from mooncake_store.node.master_clock import MasterClock

NEVER = (1 << 64) - 1
CLOSED = WriteFence(NEVER, frozenset())  # admits no generation: a segment being mounted
OPEN = WriteFence(0, frozenset())  # admits every generation (a mount reply without a fence)
_SWEEP_FIRST = 1024  # generations tracked before seal() first sweeps out expired ones

SEALED = "write grant already used for these bytes; start a new put"
RECEIVING = "these bytes are being written under this grant on another connection; start a new put"
ENDED = (
    "write grant ended: its put was committed, revoked or removed (or timed out, or the node "
    "was mounted again since); start a new put"
)
CUT_OFF = (
    "write grant ended while its payload was being received (its put was revoked, timed out or "
    "given up, or the node was mounted again): the rest was discarded; start a new put"
)


class SealedRanges:
    """Sorted, disjoint, non-adjacent [start, end) byte ranges (adjacent ones are merged)."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def overlaps(self, start: int, end: int) -> bool:
        """True when [start, end) shares a byte with a sealed range (touching is not sharing)."""
        if end <= start:
            return False
        i = bisect_right(self.starts, start)
        if i and self.ends[i - 1] > start:
            return True
        return i < len(self.starts) and self.starts[i] < end

    def add(self, start: int, end: int) -> None:
        """Seal [start, end), merging it with the ranges it overlaps or touches."""
        if end <= start:
            return
        lo = bisect_left(self.ends, start)  # first range ending at or after `start`
        hi = bisect_right(self.starts, end)  # ranges starting at or before `end`
        if lo < hi:
            start = min(start, self.starts[lo])
            end = max(end, self.ends[hi - 1])
        self.starts[lo:hi] = [start]
        self.ends[lo:hi] = [end]

    def __len__(self) -> int:
        return len(self.starts)


@dataclass(slots=True)
class _Generation:
    """One put generation's writes in one segment."""

    sealed: SealedRanges = field(default_factory=SealedRanges)
    receiving: list[tuple[int, int]] = field(default_factory=list)  # writes under way
    expires_ms: int = 0  # the latest expiry of its grants seen here


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """A write admitted and being received: `finish` seals it, `abandon` forgets it."""

    segment_id: int
    generation: int
    start: int
    end: int


class WriteGate:
    """Fences and seals of the node's DRAM segments (see the module docstring)."""

    def __init__(self) -> None:
        self._mount: dict[int, WriteFence] = {}  # segment -> the fence its mount reply gave
        self._pushed: dict[int, WriteFence] = {}  # segment -> the latest FenceWrites one
        self._seals: dict[int, dict[int, _Generation]] = {}  # segment -> generation -> writes
        self._tracked = 0  # generations in _seals, all segments
        self._sweep_at = _SWEEP_FIRST
        self._lock = threading.Lock()  # fence changes come from the mount thread and the loop
        self._mounting: set[int] = set()  # segments shown closed to `watcher` (`mounting`)
        # The highest put generation seen in a fence or an admitted write: reported when the
        # node mounts, so a master whose disk went back in time starts past it (generations.py).
        self.generation_seen = 0
        # Called with (segment, mount fence, pushed fence or None) after every fence change:
        # the node mirrors them into shared memory for same-host copies (common/shm_fence.py).
        self.watcher: Callable[[int, WriteFence, WriteFence | None], None] | None = None
        #: The master's wall clock, which grant expiries are in (node/master_clock.py).
        self.clock = MasterClock()

    # ---- fences -------------------------------------------------------------------------

    def close(self, segment_id: int) -> None:
        """Refuse every write to the segment until its mount reply (`mounted`) arrives.  Safe
        from the thread that mounts (node/master_link.py)."""
        with self._lock:
            self._mount[segment_id] = CLOSED
            self._changed(segment_id)

    def mounted(self, segment_id: int, fence: WriteFence) -> None:
        """The fence of a mount reply.  It replaces the segment's mount fence, and its pushed
        fence too unless that one is a later push of the same master (a floor at least the
        mount's: floors only grow, and a new master's start above every earlier one's), so a
        mount reply that arrives late never reopens a generation a push ended (its room may be
        another put's already).  Thread-safe like `close`; prune afterwards on the event loop
        (`prune`)."""
        with self._lock:
            self._mount[segment_id] = fence
            self._saw(fence)
            pushed = self._pushed.get(segment_id)
            if pushed is not None and pushed.floor < fence.floor:
                del self._pushed[segment_id]
            self._changed(segment_id)

    def fenced(self, segment_id: int, fence: WriteFence, now_ms: int) -> None:
        """A fence the master pushed (FenceWrites): replaces the previous pushed one, unless
        that one is later.  Floors only grow (see `mounted`), and between two pushes of one
        floor no put started, so the later one's open generations are a subset of the earlier
        one's: a push with a lower floor came late (the master may have two in flight: a
        node's first fence goes out on its own) and ends nothing the later one did not, and
        of two with one floor the generations open in both are the later one's."""
        with self._lock:
            pushed = self._pushed.get(segment_id)
            if pushed is not None and fence.floor <= pushed.floor:
                if fence.floor < pushed.floor:
                    fence = pushed
                else:
                    fence = WriteFence(fence.floor, fence.open & pushed.open)
            self._pushed[segment_id] = fence
            self._saw(fence)
            self._changed(segment_id)
        self.prune(segment_id, now_ms)

    def mounting(self, segment_id: int, on: bool) -> None:
        """While the node mounts again (`on`), refuse every write to the segment and show
        `watcher` it closed; the mount's end (`on` False: its reply applied, or the mount
        failed) restores the fences.  The master may hand the segment's room out 0.5 s after
        it applied a mount new to it (master/membership.py `REMOUNT_HOLD_S`); a write under a
        grant of an earlier mount that arrived while the reply was still on its way took room
        the master had given away (review, issue 14: the gate kept admitting by its old fences
        during remounts the heartbeat port started).  Refusing writes for the length of the
        mount call costs a put retried; the fences decide again as soon as the reply is in.
        Thread-safe like `close`."""
        with self._lock:
            if on:
                self._mounting.add(segment_id)
            else:
                self._mounting.discard(segment_id)
            self._changed(segment_id)

    def saw(self, fence: WriteFence) -> None:
        """A fence the node does not take (a push of another master run: node/control.py):
        its generations count as seen all the same.  That run may have mounted the node (its
        reply lost) and granted puts here; should its floor file be lost, the next run must
        start past them (master/generations.py), and only the node can tell it so."""
        with self._lock:
            self._saw(fence)

    def _saw(self, fence: WriteFence) -> None:
        seen = max(fence.floor, max(fence.open, default=0))
        if seen > self.generation_seen:
            self.generation_seen = seen

    def _changed(self, segment_id: int) -> None:
        if self.watcher is not None:
            mount = self._mount.get(segment_id, CLOSED)
            if segment_id in self._mounting:
                mount = CLOSED
            self.watcher(segment_id, mount, self._pushed.get(segment_id))

    def ended(self, segment_id: int, generation: int) -> bool:
        """True when a fence ends `generation`'s grants in the segment, or it is mounting."""
        if segment_id in self._mounting:
            return True
        mount = self._mount.get(segment_id)
        if mount is not None and not mount.admits(generation):
            return True
        pushed = self._pushed.get(segment_id)
        return pushed is not None and not pushed.admits(generation)

    def takes_master_copies(self, segment_id: int) -> bool:
        """False while the segment is being mounted again, or its mount reply is owed or gave
        no fence it could take: the master that mounted the node may then be another (the
        reply on its way or lost), so a copy the master asked for earlier (Fetch, a Move up
        into DRAM) must not land in room that one may hand out (node/control.py)."""
        with self._lock:
            if segment_id in self._mounting:
                return False
            return self._mount.get(segment_id, CLOSED) is not CLOSED

    # ---- seals --------------------------------------------------------------------------

    def refusal(self, segment_id: int, generation: int, start: int, end: int) -> str | None:
        """Why a write of [start, end) under a grant of `generation` is refused, or None."""
        if self.ended(segment_id, generation):
            return ENDED
        gen = self._seals.get(segment_id, {}).get(generation)
        if gen is None:
            return None
        if gen.sealed.overlaps(start, end):
            return SEALED
        if any(s < end and start < e for s, e in gen.receiving):
            return RECEIVING
        return None

    def begin(
        self, segment_id: int, generation: int, start: int, end: int, expires_ms: int
    ) -> PendingWrite:
        """Note an admitted write (checked with `refusal` just before) as being received."""
        gens = self._seals.setdefault(segment_id, {})
        gen = gens.get(generation)
        if gen is None:
            gen = gens[generation] = _Generation()
            self._tracked += 1
        gen.receiving.append((start, end))
        gen.expires_ms = max(gen.expires_ms, expires_ms)
        if generation > self.generation_seen:
            self.generation_seen = generation
        return PendingWrite(segment_id, generation, start, end)

    def finish(self, write: PendingWrite, now_ms: int) -> None:
        """The write's payload landed completely: seal its bytes."""
        gen = self._take(write)
        if gen is not None:
            gen.sealed.add(write.start, write.end)
        if self._tracked > self._sweep_at:
            for segment_id in list(self._seals):
                self.prune(segment_id, now_ms)
            self._sweep_at = max(_SWEEP_FIRST, 2 * self._tracked)

    def abandon(self, write: PendingWrite) -> None:
        """The write failed part-way: nothing of it is sealed."""
        gen = self._take(write)
        if gen is not None and not gen.sealed and not gen.receiving:
            del self._seals[write.segment_id][write.generation]
            self._tracked -= 1

    def _take(self, write: PendingWrite) -> _Generation | None:
        gen = self._seals.get(write.segment_id, {}).get(write.generation)
        if gen is None:  # pruned meanwhile (its generation ended)
            return None
        try:
            gen.receiving.remove((write.start, write.end))
        except ValueError:
            pass
        return gen

    def prune(self, segment_id: int, now_ms: int) -> None:
        """Drop the seals of generations a fence ended or whose grants all expired.  A write
        still being received keeps its generation (its grant was admitted: it finishes)."""
        gens = self._seals.get(segment_id)
        if not gens:
            return
        for generation, gen in list(gens.items()):
            if gen.receiving:
                continue
            if gen.expires_ms < now_ms or self.ended(segment_id, generation):
                del gens[generation]
                self._tracked -= 1

    def sealed(self, segment_id: int, generation: int) -> list[tuple[int, int]]:
        """The sealed ranges of a generation (for tests and debugging)."""
        gen = self._seals.get(segment_id, {}).get(generation)
        return [] if gen is None else list(zip(gen.sealed.starts, gen.sealed.ends, strict=True))

    def generations(self) -> int:
        """Generations whose seals are kept, all segments together."""
        return self._tracked
