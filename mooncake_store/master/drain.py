"""Draining a node before it stops (pure: no I/O; the server carries out the copies).

A node asked to stop (SIGTERM) calls `DrainNode` until nothing is left to save, or its
`--drain-timeout` ends, and then unmounts.  While a node drains:

- no new put is placed on it, and no replica copy is made onto it (`draining`, which the
  object table's placement and `Replication` consult); the unused allocation leases on it are
  given back as the drain starts (a client holding one would put its next value there:
  review found one, leases.py `release_on`);
- every committed object whose replicas are all on it ("at risk": they would be lost with the
  node) is copied to another node with the replication machinery: the destination pulls the
  bytes from the draining node's data path, checks them, and the master adds the replica.
  The draining node keeps serving reads and is the copy source meanwhile.

A drain ends when the node unmounts, re-mounts under a new incarnation, or is dropped.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from mooncake_store.common.errors import SegmentNotFoundError
from mooncake_store.master.leases import release_on
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import ObjectState
from mooncake_store.master.replication import CopyTask, Replication


@dataclass(frozen=True, slots=True)
class DrainProgress:
    remaining: int  # committed objects whose every replica is still on the node
    copying: int  # of those, copies in flight
    saved: int  # objects copied off the node since its drain started


class Drains:
    """The nodes being drained (see the module docstring)."""

    def __init__(self, table: ObjectTable, replication: Replication) -> None:
        self.table = table
        self.replication = replication
        #: node id -> incarnation of every node being drained; placement skips these nodes.
        self.draining: dict[str, int] = {}
        self._saved_before: dict[str, int] = {}  # Replication.drained_from at the drain's start
        self.counters = {"drains_started": 0}

    def drain(self, node_id: str, incarnation: int) -> DrainProgress:
        """Start draining the node (idempotent) and say how far its drain is.  Incarnation 0
        names whichever process is mounted under `node_id` (an operator's drain,
        `mooncake-admin drain`); the node itself names its own.

        Raises:
            SegmentNotFoundError: no node of that id (and incarnation) is mounted.
        """
        state = self.table.node(node_id)
        if state is not None and incarnation == 0:
            incarnation = state.info.incarnation
        if state is None or state.info.incarnation != incarnation:
            self.forget(node_id)
            raise SegmentNotFoundError(
                f"node {node_id} (incarnation {incarnation:x}) is not mounted; nothing to drain"
            )
        drained_from = self.replication.drained_from
        if self.draining.get(node_id) != incarnation:
            self.draining[node_id] = incarnation
            self._saved_before[node_id] = drained_from.get(node_id, 0)
            self.counters["drains_started"] += 1
            release_on(self.table, state.segment_ids)
        at_risk = self.at_risk(node_id)
        copying = sum(1 for key in at_risk if self._moving(key))
        saved = drained_from.get(node_id, 0) - self._saved_before[node_id]
        return DrainProgress(len(at_risk), copying, saved)

    def forget(self, node_id: str) -> None:
        """The node unmounted, restarted or was dropped: its drain is over."""
        self.draining.pop(node_id, None)
        self._saved_before.pop(node_id, None)

    def at_risk(self, node_id: str) -> list[str]:
        """Committed objects with a replica on `node_id` and none on any other live node."""
        state = self.table.node(node_id)
        if state is None:
            return []
        mine = set(state.segment_ids)
        keys: set[str] = set()
        for segment_id in mine:
            keys.update(self.table.keys_in(segment_id))
        out = []
        for key in sorted(keys):
            meta = self.table.get(key)
            if meta is None or meta.state is not ObjectState.COMPLETE:
                continue
            live = [r for r in meta.replicas if self.table.segment(r.segment_id) is not None]
            if live and all(r.segment_id in mine for r in live):
                out.append(key)
        return out

    def plan(self, busy: Collection[str] = (), budget: int = 32) -> list[CopyTask]:
        """Copies to start now for objects at risk on draining nodes (destinations in `busy`,
        copies still in flight, and draining nodes receive none)."""
        tasks: list[CopyTask] = []
        for node_id, incarnation in list(self.draining.items()):
            state = self.table.node(node_id)
            if state is None or state.info.incarnation != incarnation:
                self.forget(node_id)  # gone, or back as a new process that did not ask
                continue
            for key in self.at_risk(node_id):
                if len(tasks) >= budget:
                    return tasks
                meta = self.table.get(key)
                if meta is None or meta.moving:
                    continue
                task = self.replication.start_copy(meta, "drain", busy)
                if task is not None:
                    tasks.append(task)
        return tasks

    def _moving(self, key: str) -> bool:
        meta = self.table.get(key)
        return meta is not None and meta.moving
