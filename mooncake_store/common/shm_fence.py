"""The write fence in shared memory: which grants a same-host client may still copy with.

A client on a node's host writes into the node's DRAM pool by a plain copy (client/shm.py),
which the node's write gate (node/write_gate.py) never sees: it governs TCP and gRPC writes.
Once the master has ended a put (committed, revoked, timed out, a lease taken back for room,
or a master that restarted and hands the room out afresh), a copy under its grant would land on
whatever block the extent holds next.

So the node mirrors its gate's fences into a page of shared memory it hands to same-host clients,
read-only, with the pool (common/shm_handoff.py): the fence of its current mount and the latest
one the master pushed, each a floor and the generations still open below it.  A client reads the
page right before each copy into the pool (`FenceView.admits`) and sends the write over TCP
instead when the fences end its grant's generation; there the node refuses it, and the put is
retried two-phase.

The node makes every fence wait out a copy already under way: it acknowledges a pushed fence to
the master only `FENCE_ACK_GRACE_S` after publishing it (the master frees an ended put's room
on that acknowledgement, master/fences.py), and once it learns its master forgot it, it closes
the page and waits `REMOUNT_GRACE_S` before mounting again (node/master_link.py).  A client
stalled between its check and the end of its copy for longer than that could still land late
(the victim's checksum then fails: lost, never misread), as any shared-memory writer could.

The page also shows the master's clock as the node follows it (node/master_clock.py), which
write grants' expiries are in: an offset from the monotonic clock, which a client on the node's
host shares.  A client copies only while a grant is live by both that clock and its own wall
clock (`master_now_ms` gives the later of the two): a host clock behind the master's no longer
lets a copy run under a grant the master counts as ended (it may hand the room out again without
the node's word), and a step back of the master's clock lengthens no grant for same-host copies.
The other way round (a host clock ahead of the master's) refuses grants early: their writes go
over TCP, where the node checks them.  A value that is wrong (another time namespace, an absurd
master time) can only make the later of the two later, so it never lets a copy through.

Layout, little-endian u64 words: `seq` (odd while the node writes), the mount fence's floor and
open count, the pushed fence's floor (0: none yet) and open count, then the mount fence's open
generations and the pushed fence's; the last word of the page is the master's clock (master
wall ms minus node monotonic ms; 0: unknown).
Open lists that do not fit are marked `OVERFLOW`: only generations at or above both floors are
admitted then.  A reader retries while `seq` is odd or changes under it (a seqlock); the lock
operations around the reads and writes order them on weakly ordered CPUs too.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from mooncake_store.common.grant import WriteFence

T = TypeVar("T")

NEVER = (1 << 64) - 1  # a floor nothing reaches: the mount fence of a closed segment
OVERFLOW = (1 << 64) - 1  # an open count: the lists did not fit
PAGE_BYTES = 64 * 1024
_HEADER = 5  # seq, mount floor, mount open count, pushed floor, pushed open count
_CLOCK = PAGE_BYTES // 8 - 1  # the master's clock (see above)
CAPACITY = _CLOCK - _HEADER  # open generations the page holds, both lists together
FENCE_ACK_GRACE_S = 0.05  # a pushed fence is acknowledged this long after it is published
REMOUNT_GRACE_S = 0.5  # closed this long before mounting again
_READ_TRIES = 10_000
F_SEAL_FUTURE_WRITE = getattr(fcntl, "F_SEAL_FUTURE_WRITE", 0x0010)  # Linux 5.1
PAGE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | F_SEAL_FUTURE_WRITE | fcntl.F_SEAL_SEAL

_order = threading.Lock()


def _barrier() -> None:
    """A lock released then taken: its release and acquire order the loads and stores around it
    (what a seqlock needs on ARM; x86 keeps their order anyway)."""
    _order.acquire()
    _order.release()


class FencePage:
    """The node's side: the page, created with its segment closed."""

    def __init__(self, name: str = "mooncake-fence") -> None:
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, PAGE_BYTES)
            self._map = mmap.mmap(self.fd, PAGE_BYTES, flags=mmap.MAP_SHARED)
            # Sealed once mapped here: nobody maps or writes it writable any more (a client
            # could reopen its read-only descriptor read-write through /proc), nor changes its
            # size (a truncated page would SIGBUS the node and every client).
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, PAGE_SEALS)
        except BaseException:
            os.close(self.fd)
            raise
        self._words = np.frombuffer(self._map, dtype=np.uint64)
        self._lock = threading.Lock()  # one writer at a time (the mount thread, the loop)
        self.publish(WriteFence(NEVER, frozenset()), None)

    def publish(self, mount: WriteFence, pushed: WriteFence | None) -> None:
        """Show the segment's fences (node/write_gate.py calls it on every change)."""
        mount_open = sorted(mount.open)
        pushed_open = sorted(pushed.open) if pushed is not None else []
        fits = len(mount_open) + len(pushed_open) <= CAPACITY

        def fill(w: np.ndarray) -> None:
            w[1] = mount.floor
            w[2] = len(mount_open) if fits else OVERFLOW
            w[3] = pushed.floor if pushed is not None else 0
            w[4] = len(pushed_open) if fits else OVERFLOW
            if fits:
                a = _HEADER + len(mount_open)
                w[_HEADER:a] = mount_open
                w[a : a + len(pushed_open)] = pushed_open

        self._write(fill)

    def publish_clock(self, master_offset_ms: float) -> None:
        """Show the master's clock as the node follows it: master wall ms minus this host's
        monotonic ms (node/master_clock.py).  A value no u64 word holds is not shown (the
        page keeps the last one): it is checked before the page is marked as being written."""
        value = int(master_offset_ms)
        if not 0 < value < 1 << 63:
            return

        def fill(w: np.ndarray) -> None:
            w[_CLOCK] = value

        self._write(fill)

    def _write(self, fill: Callable[[np.ndarray], None]) -> None:
        """One write of the seqlock: `fill` stores into the words while `seq` is odd (one that
        fails leaves it odd: readers refuse rather than take a half-written page)."""
        with self._lock:
            w = self._words
            w[0] += 1  # odd: being written
            _barrier()
            fill(w)
            _barrier()
            w[0] += 1

    def close(self) -> None:
        if self.fd >= 0:
            del self._words
            self._map.close()
            os.close(self.fd)
            self.fd = -1


class FenceView:
    """A client's read-only mapping of a node's page (takes ownership of `fd`).

    Raises OSError or ValueError when `fd` is not such a page."""

    def __init__(self, fd: int) -> None:
        try:
            self._map = mmap.mmap(fd, PAGE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        self._words = np.frombuffer(self._map, dtype=np.uint64)
        self._closed = False

    def admits(self, generation: int) -> bool:
        """True when both fences admit a write grant of put `generation`, exactly as the node's
        gate would (node/write_gate.py `ended`)."""
        if self._closed:
            return False
        # Never a steady read: refused (the write goes over TCP).
        return self._read(lambda w: _admits(w, generation, *[int(x) for x in w[1:_HEADER]]), False)

    def master_now_ms(self) -> int | None:
        """The master's wall clock now as the node follows it, in ms; None when the node shows
        none (an older node, no heartbeat reply yet).  Use the later of it and the wall clock
        (see the module docstring)."""
        if self._closed:
            return None
        master = self._read(lambda w: int(w[_CLOCK]), 0)
        return int(time.monotonic() * 1000 + master) if master else None

    def _read(self, read: Callable[[np.ndarray], T], refused: T) -> T:
        """`read` of the words, taken while the node wrote nothing (the seqlock), or `refused`
        when no such read comes in _READ_TRIES tries."""
        w = self._words
        for attempt in range(_READ_TRIES):
            seq = int(w[0])
            if not seq & 1:  # odd: being written
                _barrier()
                value = read(w)
                _barrier()
                if int(w[0]) == seq:
                    return value
            if attempt >= 8:
                time.sleep(0)  # the writer may be waiting for this thread (or for a CPU)
        return refused

    def close(self) -> None:
        """Unmap (idempotent); a reader still inside `admits` on another thread keeps the
        mapping alive until it is done (it is freed with the process at worst)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._map.close()
        except BufferError:
            pass


def _admits(
    w: np.ndarray, generation: int, m_floor: int, m_count: int, p_floor: int, p_count: int
) -> bool:
    if m_count == OVERFLOW or p_count == OVERFLOW:
        return generation >= m_floor and generation >= p_floor
    if m_count + p_count > CAPACITY:
        return False  # torn or garbled: the seqlock retries or refuses
    gen = np.uint64(generation)
    mount_ok = generation >= m_floor or bool(np.any(w[_HEADER : _HEADER + m_count] == gen))
    if not mount_ok:
        return False
    at = _HEADER + m_count
    return generation >= p_floor or bool(np.any(w[at : at + p_count] == gen))
