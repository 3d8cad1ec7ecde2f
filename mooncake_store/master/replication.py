"""Replica maintenance (pure): re-replication after losses, hot-block replicas and cooling.

- An object that has fewer replicas than its put asked for (a node died, or too few nodes had
  room at the time) gets copies on other nodes from a surviving replica.
- A block read `hot_reads` times within `hot_window_s` gets an extra replica on another node,
  up to `max_replicas`, so many readers spread over more nodes; when a window passes with fewer
  reads than that, the extra replicas are dropped again, one per tick.
Copies go node to node: the destination node pulls the bytes from the source node's data path
with a read grant from the master, checks the checksum, and only then does the master add the
replica.  The source is leased for the copy, so it is not evicted or freed meanwhile.

Repairs are scheduled, not rescanned: an under-replicated object is tried when it becomes one;
when no node can take a copy (or the copy failed) it is tried again after a back-off that
doubles from `REPAIR_BACKOFF_S` up to `REPAIR_BACKOFF_MAX_S`, and at once when the set of DRAM
segments changes (a node came or went).  So 40k objects that cannot be repaired cost nothing
per tick.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection
from dataclasses import dataclass

from mooncake_store.master.config import MasterConfig
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.segments import Segment, Tier

# Replication reads its settings from the master's one config object (master/config.py).
ReplicationConfig = MasterConfig

REPAIR_BACKOFF_S = 1.0
REPAIR_BACKOFF_MAX_S = 30.0


@dataclass(slots=True)
class CopyTask:
    key: str
    reason: str  # "repair" or "hot"
    source: Replica
    src: Segment
    dst: Segment
    dst_offset: int
    size_bytes: int
    checksum: int
    lease_until_s: float


class Replication:
    def __init__(
        self, table: ObjectTable, config: ReplicationConfig, *, clock: Callable[[], float]
    ) -> None:
        self.table = table
        self.config = config
        self._clock = clock
        self.hot: set[str] = set()  # objects holding extra (hot) replicas
        self._busy: Collection[str] = ()
        self._due: list[tuple[float, str]] = []  # (next repair try, key)
        self._backoff: dict[str, float] = {}  # key scheduled in _due -> its current back-off
        self._dram_segments: frozenset[tuple[int, int]] = frozenset()
        #: Nodes no copy may go to (draining nodes, see drain.py).
        self.avoid: Collection[str] = ()
        #: Objects copied off each node by its drain (source node id -> count).
        self.drained_from: dict[str, int] = {}
        self.counters = {"repairs": 0, "hot_replicas_added": 0, "hot_replicas_dropped": 0,
                         "copies_failed": 0, "drain_copies": 0}  # fmt: skip

    def plan(self, busy: Collection[str] = ()) -> list[CopyTask]:
        """Copies to start now; nodes in `busy` (copies still in flight) receive none."""
        self._busy = busy
        tasks: list[CopyTask] = []
        budget = self.config.max_copies_per_tick
        self._repairs(tasks, budget)
        for key in list(self.table.hot_keys):
            self.table.hot_keys.discard(key)
            meta = self.table.get(key)
            if len(tasks) >= budget or meta is None or meta.state is not ObjectState.COMPLETE:
                continue
            if len(meta.replicas) < self.config.max_replicas:
                task = self._copy(meta, "hot")
                if task is not None:
                    tasks.append(task)
        self._cool()
        return tasks

    def _schedule(self, key: str, now: float, backoff: float = 0.0) -> None:
        self._backoff[key] = backoff
        heapq.heappush(self._due, (now + backoff, key))

    def _repairs(self, tasks: list[CopyTask], budget: int) -> None:
        """Plan repair copies of the under-replicated objects that are due."""
        now = self._clock()
        wanting = self.table.under_replicated
        for key in wanting.take_added():
            if key not in self._backoff:
                self._schedule(key, now)
        dram = frozenset(
            (s.segment_id, s.generation) for s in self.table.segments() if s.tier is Tier.DRAM
        )
        if dram != self._dram_segments:  # a node came or went: everyone may fit now
            self._dram_segments = dram
            self._due = [(now, key) for _, key in self._due]
            heapq.heapify(self._due)
        tries = 0
        while self._due and self._due[0][0] <= now and len(tasks) < budget and tries < 4 * budget:
            _, key = heapq.heappop(self._due)
            tries += 1
            backoff = self._backoff.pop(key, 0.0)
            meta = self.table.get(key) if key in wanting else None
            if (
                meta is None
                or meta.state is not ObjectState.COMPLETE
                or self._offered(meta) >= meta.wanted_replicas
            ):
                wanting.discard(key)
                continue
            task = self._copy(meta, "repair")
            if task is not None:
                tasks.append(task)  # `complete` schedules it again if still short
            else:
                self._schedule(
                    key, now, min(max(2 * backoff, REPAIR_BACKOFF_S), REPAIR_BACKOFF_MAX_S)
                )

    def repairs_waiting(self) -> int:
        """Under-replicated objects scheduled for a repair try."""
        return len(self._backoff)

    def _cool(self) -> None:
        now = self._clock()
        window = self.table.config.hot_window_s
        for key in list(self.hot):
            meta = self.table.get(key)
            if meta is None or len(meta.replicas) <= meta.wanted_replicas:
                self.hot.discard(key)
                continue
            window_over = now - meta.window_start_s > window
            cooled = (window_over and meta.window_reads < self.table.config.hot_reads) or (
                now - meta.last_access_s > window
            )
            if meta.moving or not cooled or meta.protected_until_s > now:
                continue
            live = [s for r in meta.replicas if (s := self.table.segment(r.segment_id))]
            extra = min(live, key=lambda s: s.free_bytes, default=None)
            if extra is not None:
                self.table.drop_replica(key, extra)
                self.counters["hot_replicas_dropped"] += 1

    def _offered(self, meta: ObjectMeta) -> int:
        """Replicas on offered segments: those of a suspect node do not count (it may not come
        back), so repairs start during its grace window (membership.py)."""
        return sum(1 for r in meta.replicas if self.table.segment(r.segment_id) is not None)

    def start_copy(self, meta: ObjectMeta, reason: str, busy: Collection[str]) -> CopyTask | None:
        """Start one copy of `meta` onto another node (none of `busy`), or None if none can
        take it now."""
        self._busy = busy
        return self._copy(meta, reason)

    def _copy(self, meta: ObjectMeta, reason: str) -> CopyTask | None:
        if meta.moving:
            return None
        holders = set()
        sources = []
        for r in meta.replicas:
            seg = self.table.segment(r.segment_id)
            if seg is not None:
                holders.add(seg.node_id)
                sources.append(seg)
        if not sources:
            return None
        extent = sources[0].allocator.aligned(meta.size_bytes)
        targets = [s for s in self.table.segments()
                   if s.tier is Tier.DRAM and s.node_id not in holders
                   and s.node_id not in self._busy and s.node_id not in self.avoid
                   and s.largest_free >= extent]  # fmt: skip
        if not targets:
            return None
        dst = max(targets, key=lambda s: s.free_bytes)
        src = min(sources, key=lambda s: {Tier.DRAM: 0, Tier.GPU: 1, Tier.NVME: 2}[s.tier])
        started = self.table.begin_move(meta.key, src, dst)
        if started is None:
            return None
        source, offset = started
        until = self._clock() + self.config.copy_timeout_s
        self.table.hold(meta.key, until)
        return CopyTask(meta.key, reason, source, src, dst, offset, meta.size_bytes,
                        meta.checksum, until)  # fmt: skip

    def complete(self, task: CopyTask, ok: bool) -> bool:
        added = self.table.finish_copy(task.key, task.source, task.dst, task.dst_offset, ok)
        if task.reason == "repair" and task.key not in self._backoff:
            if task.key in self.table.under_replicated and not added:  # try again, later
                self._schedule(task.key, self._clock(), REPAIR_BACKOFF_S)
            elif task.key in self.table.under_replicated:  # short of more copies: at once
                self._schedule(task.key, self._clock())
        if not added:
            self.counters["copies_failed"] += 1
            return False
        if task.reason == "drain":  # saved from a node about to stop (drain.py)
            self.counters["drain_copies"] += 1
            node_id = task.src.node_id
            self.drained_from[node_id] = self.drained_from.get(node_id, 0) + 1
        elif task.reason == "repair":
            self.counters["repairs"] += 1
            meta = self.table.get(task.key)
            if meta is not None and self._offered(meta) >= meta.wanted_replicas:
                self.table.under_replicated.discard(task.key)
        else:
            self.counters["hot_replicas_added"] += 1
            self.hot.add(task.key)
        return True
