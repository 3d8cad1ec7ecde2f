"""Tier movement (pure): watermarks, demotion DRAM -> NVMe, promotion NVMe -> DRAM.

Each tick, per node:
- a persistent tier (NVMe) above its high watermark drops its lowest-value blocks (by the
  eviction policy) down to its low watermark;
- a DRAM tier above its high watermark demotes its lowest-value blocks to the node's NVMe tier
  until the projected fill is at the low watermark (making room on NVMe by dropping its own
  lowest-value blocks; a block that still does not fit is dropped from DRAM instead);
- blocks read `promote_after_reads` times while only on NVMe are copied back to DRAM when it is
  below its high watermark;
- on a node with a GPU tier, blocks read `gpu_promote_after_reads` times move up from DRAM to
  the GPU while it is below its high watermark, and the GPU tier demotes its lowest-value
  blocks back to DRAM above that watermark.
Planning reserves the destination extent and marks the object `moving` (not evictable, still
readable from its source); the shell has the node copy the bytes, then calls `complete`.
A node without an NVMe tier never demotes: its DRAM is freed only by synchronous eviction.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from mooncake_store.master.config import MasterConfig
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import ObjectMeta, Replica
from mooncake_store.master.segments import Segment, Tier

# Tiering reads its settings from the master's one config object (master/config.py).
TierConfig = MasterConfig


@dataclass(slots=True)
class MoveTask:
    key: str
    node_id: str
    source: Replica
    src: Segment
    dst: Segment
    dst_offset: int
    size_bytes: int
    checksum: int
    fingerprint: bytes
    parent_key: str
    tag: bytes

    @property
    def promotion(self) -> bool:
        """Towards a faster tier (NVMe -> DRAM, DRAM -> GPU)."""
        order = {Tier.GPU: 0, Tier.DRAM: 1, Tier.NVME: 2}
        return order[self.dst.tier] < order[self.src.tier]


class Tiering:
    def __init__(self, table: ObjectTable, config: TierConfig) -> None:
        self.table = table
        self.config = config
        self.counters = {"demotions": 0, "promotions": 0, "moves_failed": 0, "nvme_drops": 0}
        self._busy: Collection[str] = ()

    def plan(self, busy: Collection[str] = ()) -> list[MoveTask]:
        """Moves to start now; nodes in `busy` (a batch still in flight) get none."""
        tasks: list[MoveTask] = []
        budget = self.config.max_moves_per_tick
        self._busy = busy
        for seg in self.table.segments():
            if seg.tier is Tier.NVME and seg.fill > self.config.nvme_high_watermark:
                self._drop_to(seg, self.config.nvme_low_watermark)
        for seg in self.table.segments():
            if seg.tier is not Tier.DRAM or budget <= len(tasks) or seg.node_id in busy:
                continue
            nvme = self.table.node_segment(seg.node_id, Tier.NVME)
            if nvme is not None and seg.fill > self.config.dram_high_watermark:
                low = self.config.dram_low_watermark
                tasks += self._demote(seg, nvme, low, budget - len(tasks))
        for seg in self.table.segments():
            if seg.tier is not Tier.GPU or budget <= len(tasks) or seg.node_id in busy:
                continue
            dram = self.table.node_segment(seg.node_id, Tier.DRAM)
            if dram is not None and seg.fill > self.config.gpu_high_watermark:
                low = self.config.gpu_low_watermark
                tasks += self._demote(seg, dram, low, budget - len(tasks))
        if len(tasks) < budget:
            tasks += self._promote(budget - len(tasks))
        if len(tasks) < budget:
            tasks += self._promote_to_gpu(budget - len(tasks))
        self.table.read_keys.clear()
        return tasks

    def _promote_to_gpu(self, budget: int) -> list[MoveTask]:
        """Copy the most-read DRAM blocks up to their node's GPU tier while it has room."""
        tasks: list[MoveTask] = []
        wanted = self.config.gpu_promote_after_reads
        for key in list(self.table.read_keys):
            meta = self.table.get(key)
            if len(tasks) >= budget or meta is None or meta.moving:
                continue
            if meta.access_count < wanted:
                continue
            task = self._move_up(
                key, meta, lambda tier: tier is Tier.DRAM, Tier.GPU, self.config.gpu_high_watermark
            )
            if task is not None:
                tasks.append(task)
        return tasks

    def _drop_to(self, seg: Segment, target: float) -> None:
        """Evict from `seg` down to `target` fill, counting the room its node's answers to the
        Releases in flight give back (frees.py `releasing_bytes`) as free."""
        cap = seg.allocator.capacity_bytes
        while seg.allocator.used_bytes - self.table.releasing_bytes(seg) > target * cap:
            victim = self.table.victim(seg)
            if victim is None:
                return
            self.table.evict(victim, seg)
            self.counters["nvme_drops"] += 1

    def _demote(self, src: Segment, dst: Segment, low: float, budget: int) -> list[MoveTask]:
        """Move `src`'s lowest-value blocks to the slower `dst` until `src` is at `low` fill.

        `dst` makes room by evicting its own lowest-value blocks; a block that still does not
        fit is evicted from `src` instead.  A `dst` that does not hand out room yet (mounted
        again a moment ago) gets nothing this tick, and nothing is evicted on either side.
        """
        tasks: list[MoveTask] = []
        if self.table.room_held(dst):  # mounted again a moment ago: demote at a later tick,
            return tasks  # and evict nothing on either side for it meanwhile
        target = low * src.allocator.capacity_bytes
        projected = src.allocator.used_bytes
        while projected > target and len(tasks) < budget:
            key = self.table.victim(src)
            if key is None:
                break
            meta = self.table.get(key)
            assert meta is not None
            extent = src.allocator.aligned(meta.size_bytes)
            if dst.largest_free < extent:
                if dst.persistent and self.table.releasing_bytes(dst) >= extent:
                    break  # room comes back with the Releases' answers: demote next tick
                if not self.table.make_room(dst, extent) and (
                    dst.persistent and self.table.releasing_bytes(dst) >= extent
                ):
                    break  # the room it made comes back with the answers: next tick
            started = self.table.begin_move(key, src, dst)
            now = self.table.get(key)  # make_room may have changed it
            if started is not None:
                tasks.append(self._task(key, src, dst, *started))
            elif now is not None and any(r.segment_id == dst.segment_id for r in now.replicas):
                self.table.evict(key, src)  # a replica of it stays on this node's slower tier
            elif dst.largest_free < extent:
                self.table.evict(key, src)  # no room below: evicted instead
            else:  # refused for another reason: nothing is evicted for it
                break
            projected -= extent
        return tasks

    def _promote(self, budget: int) -> list[MoveTask]:
        tasks: list[MoveTask] = []
        wanted = self.config.promote_after_reads
        for key in list(self.table.slow_keys):
            meta = self.table.get(key)
            if meta is None:
                self.table.slow_keys.discard(key)
                continue
            if len(tasks) >= budget or meta.slow_reads < wanted or meta.moving:
                continue
            self.table.slow_keys.discard(key)
            task = self._move_up(
                key, meta, lambda tier: tier.persistent, Tier.DRAM,
                self.config.dram_high_watermark,
            )  # fmt: skip
            if task is not None:
                tasks.append(task)
        return tasks

    def _move_up(
        self,
        key: str,
        meta: ObjectMeta,
        from_tier: Callable[[Tier], bool],
        to: Tier,
        high_watermark: float,
    ) -> MoveTask | None:
        """Start moving `key` from its first replica on a `from_tier` segment of an idle node
        to that node's `to` segment, if the node has one below `high_watermark`."""
        for replica in meta.replicas:
            src = self.table.segment(replica.segment_id)
            if src is None or not from_tier(src.tier) or src.node_id in self._busy:
                continue
            dst = self.table.node_segment(src.node_id, to)
            if dst is None or dst.fill >= high_watermark:
                continue
            started = self.table.begin_move(key, src, dst)
            return self._task(key, src, dst, *started) if started is not None else None
        return None

    def _task(self, key: str, src: Segment, dst: Segment, source: Replica,
              offset: int) -> MoveTask:  # fmt: skip
        meta = self.table.get(key)
        assert meta is not None
        return MoveTask(key, src.node_id, source, src, dst, offset, meta.size_bytes,
                        meta.checksum, meta.fingerprint, meta.parent_key, meta.tag)  # fmt: skip

    def complete(self, task: MoveTask, ok: bool, *, corrupt: bool = False) -> bool:
        """Record a move's outcome; a source found corrupt by the node is dropped."""
        moved = self.table.finish_move(task.key, task.source, task.dst, task.dst_offset, ok)
        if corrupt:
            meta = self.table.get(task.key)
            if meta is not None and meta.checksum == task.checksum and task.source in meta.replicas:
                self.table.evict(task.key, task.src)  # not a key put again since
        if moved:
            self.counters["promotions" if task.promotion else "demotions"] += 1
        else:
            self.counters["moves_failed"] += 1
        return moved
