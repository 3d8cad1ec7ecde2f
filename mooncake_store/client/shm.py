"""The same-host data path: a node's DRAM pool mapped once (client/transport.py).

`ShmMapper` maps a node's pool after receiving its memfd over the node's abstract unix socket; a
put or get is then a single copy between the caller's buffer and the pool.  A node whose socket
cannot be reached is on another host, and that answer is remembered."""

from __future__ import annotations

import errno
import logging
import mmap
import os
import socket
import time
from collections.abc import Callable

from mooncake_store.client.cuda import forget_pool
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.grant import grant_expires_ms, grant_generation
from mooncake_store.common.shm_fence import FenceView
from mooncake_store.common.shm_handoff import HELLO, HandoffRefused, parse_hello

log = logging.getLogger("mooncake.client")

Guard = Callable[[], None]  # called before each 1 MiB of a copy into a pool; raises to stop it


class CopyStopped(Exception):
    """A guarded copy into a pool stopped part-way (its grant no longer admitted:
    `ShmMapper.copy_guard`); what it copied before is in the extent."""


COPY_EXPIRY_MARGIN_MS = 1000  # a write grant this close to its expiry is not copied with


class ShmMapper:
    """Same-host pool mappings, keyed by segment id."""

    def __init__(self) -> None:
        self._maps: dict[int, tuple[mmap.mmap, memoryview]] = {}
        self._fences: dict[int, FenceView] = {}  # segment id -> its node's write fence page
        self._node_segment: dict[str, int] = {}
        self._remote: set[str] = set()

    def cached(self, loc: ReplicaLocation) -> memoryview | None:
        """The mapped pool of `loc`'s segment, if it is mapped already."""
        return self.segment(loc.segment_id)

    def segment(self, segment_id: int) -> memoryview | None:
        """The mapped pool of `segment_id`, if it is mapped already."""
        entry = self._maps.get(segment_id)
        return entry[1] if entry is not None else None

    def admits(self, segment_id: int, generation: int) -> bool | None:
        """Whether the write fences a mapped pool's node shows now admit a grant of put
        `generation` (common/shm_fence.py); None when it handed over no page."""
        page = self._fences.get(segment_id)
        return None if page is None else page.admits(generation)

    def master_now_ms(self, segment_id: int) -> float:
        """The time write grants' expiries are checked against: the later of this host's wall
        clock and the master's as the node of a mapped pool shows it (common/shm_fence.py), so
        a copy runs only while its grant is live by both."""
        page = self._fences.get(segment_id)
        shown = None if page is None else page.master_now_ms()
        own = time.time() * 1000
        return own if shown is None else max(own, shown)

    def copy_guard(self, loc: ReplicaLocation, *, leased: bool) -> Guard | None:
        """A guard for copies into `loc`'s mapped pool under its write grant (client/steps.py
        runs it before every 1 MiB of a copy), or None when the grant may not be copied with
        now.  A grant may be copied with while the write fences its node shows in shared
        memory admit its put generation (common/shm_fence.py) and it is more than
        `COPY_EXPIRY_MARGIN_MS` from its expiry by both this host's clock and the master's as
        the node shows it (`master_now_ms`; the master may free an expired put's room
        without its node's word: master/frees.py); a node that shows no fences takes no copies
        into leases (they go over TCP, where it checks them).  A copy under a grant ended
        meanwhile stops within a chunk: the node acknowledges a fence only 50 ms after showing
        it, and only then does the master hand the room out."""
        generation = grant_generation(loc.grant)
        expires_ms = grant_expires_ms(loc.grant)
        segment_id = loc.segment_id

        def allowed() -> bool:
            if expires_ms is not None and self.master_now_ms(segment_id) > (
                expires_ms - COPY_EXPIRY_MARGIN_MS
            ):
                return False
            admitted = self.admits(segment_id, generation)
            return not leased if admitted is None else admitted

        if not allowed():
            return None

        def guard() -> None:
            if not allowed():
                raise CopyStopped(f"the write grant of segment {segment_id:x} ended mid-copy")

        return guard

    def worth_probing(self, loc: ReplicaLocation) -> bool:
        """False when `loc`'s node is known to be on another host, or refused us its pool."""
        return bool(loc.shm_socket) and loc.shm_socket not in self._remote

    def map(self, loc: ReplicaLocation) -> memoryview | None:
        """Map the pool of `loc`'s node if it is on this host and hands it to this process
        (blocking; run in an executor).  None: use TCP."""
        view = self.cached(loc)
        if view is not None or not self.worth_probing(loc):
            return view
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(2.0)
        try:
            sock.connect("\0" + loc.shm_socket)
            msg, fds, _, _ = socket.recv_fds(sock, HELLO.size, 2)
        except OSError as exc:
            if exc.errno in (errno.ECONNREFUSED, errno.ENOENT):
                self._remote.add(loc.shm_socket)
            return None
        finally:
            sock.close()
        try:
            segment_id, size, fd, fence_fd = parse_hello(msg, fds)
        except HandoffRefused:
            log.info("node %s keeps its pool to its own uid (and group): using TCP", loc.node_id)
            self._remote.add(loc.shm_socket)  # it will refuse again: do not ask every time
            return None
        except ValueError as exc:
            log.warning("node %s: %s; using TCP", loc.node_id, exc)
            return None
        fence: FenceView | None = None
        if fence_fd is not None:
            try:
                fence = FenceView(fence_fd)  # closes the descriptor
            except (OSError, ValueError, OverflowError) as exc:
                log.warning("node %s: its write fences cannot be mapped (%s)", loc.node_id, exc)
        try:
            if segment_id != loc.segment_id:
                if fence is not None:
                    fence.close()
                return None
            mapping = mmap.mmap(
                fd,
                size,
                flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        except (OSError, ValueError, OverflowError) as exc:
            log.warning("cannot map the pool of node %s (%s); using TCP", loc.node_id, exc)
            if fence is not None:
                fence.close()
            return None
        finally:
            os.close(fd)
        view = memoryview(mapping)
        self._maps[segment_id] = (mapping, view)
        if fence is not None:
            self._fences[segment_id] = fence
        # A node seen with a new segment restarted: its old pool is dead, and holding the
        # mapping would keep the whole pool's memory alive.
        previous = self._node_segment.get(loc.node_id)
        self._node_segment[loc.node_id] = segment_id
        if previous is not None and previous != segment_id:
            self._unmap(previous)
        return view

    def mapped_segments(self) -> list[int]:
        return list(self._maps)

    def _unmap(self, segment_id: int) -> None:
        fence = self._fences.pop(segment_id, None)
        if fence is not None:
            fence.close()
        entry = self._maps.pop(segment_id, None)
        if entry is None:
            return
        mapping, view = entry
        forget_pool(segment_id)  # a pool registered with CUDA is unregistered first
        try:
            view.release()
            mapping.close()
        except BufferError:  # a copy still holds a slice; freed when the process exits
            pass

    def close(self) -> None:
        for segment_id in list(self._maps):
            self._unmap(segment_id)
        self._node_segment.clear()
