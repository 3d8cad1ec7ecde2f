"""Nodes and their mounted segments, as the master sees them (pure data)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from mooncake_store.master.allocator import ExtentAllocator


class Tier(StrEnum):
    """Storage tiers, fastest first.  NVME survives a node restart; the others do not."""

    GPU = "GPU"
    DRAM = "DRAM"
    NVME = "NVME"

    @property
    def persistent(self) -> bool:
        return self is Tier.NVME


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What a node tells the master when it mounts."""

    node_id: str
    incarnation: int
    endpoint: str
    shm_socket: str
    control_endpoint: str
    secret: bytes


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    node: NodeInfo
    segment_id: int  # 1 .. 2**64 - 1 (0 is "unset" on the wire)
    tier: Tier
    size_bytes: int

    def __post_init__(self) -> None:
        if not 0 < self.segment_id < 1 << 64:
            raise ValueError(f"segment_id must be in 1..2**64-1, got {self.segment_id}")


class Segment:
    """A mounted segment: its info, allocator and how many objects have a replica in it.

    `generation` names this mount of the segment (unique in the master's lifetime): a segment
    id mounted again (a node dropped and back, a restart) is a new generation with a new
    allocator, and a deferred free or a copy planned against an older one is stale.
    """

    __slots__ = (
        "allocator", "generation", "info", "leased_bytes", "leases", "objects", "pending_bytes",
        "persistent", "writable_after",
    )  # fmt: skip

    def __init__(self, info: SegmentInfo, allocator: ExtentAllocator, generation: int = 0) -> None:
        self.info = info
        self.allocator = allocator
        self.generation = generation
        self.objects = 0
        self.pending_bytes = 0  # extents of puts started and not yet committed
        # Of those, unused allocation leases (master/leases.py): extents and their bytes,
        # which `objects` and `pending_bytes` include and reports leave out of objects.
        self.leases = 0
        self.leased_bytes = 0
        self.persistent = info.tier.persistent  # read on every lookup
        # No room of this mount is handed out before then (master clock): see
        # membership.py `REMOUNT_HOLD_S`.
        self.writable_after = 0.0

    @property
    def node_id(self) -> str:
        return self.info.node.node_id

    @property
    def segment_id(self) -> int:
        return self.info.segment_id

    @property
    def tier(self) -> Tier:
        return self.info.tier

    @property
    def free_bytes(self) -> int:
        return self.allocator.free_bytes

    @property
    def largest_free(self) -> int:
        return self.allocator.largest_free()

    @property
    def fill(self) -> float:
        cap = self.allocator.capacity_bytes
        return self.allocator.used_bytes / cap if cap else 1.0


class NodeCondition(StrEnum):
    """The `state` ListNodes reports for a mounted node (issue 11)."""

    VALID = "valid"  # heartbeating: offered to readers and writers
    SUSPECT = "suspect"  # silent past its TTL: not offered, replicas kept until dropped
    DRAINING = "draining"  # stopping: offered to readers, no new puts or copies onto it
    # Mounted a moment ago: offered to readers, no puts until it took this master's first
    # write fence (membership.py `awaiting_first_fence`; normally within milliseconds).
    MOUNTING = "mounting"


class NodeState:
    """A mounted node: its mount info, its segments, and whether it is suspect (silent past
    its heartbeat TTL: its segments are not offered).  Its heartbeats are kept apart, in
    `liveness.Heartbeats`."""

    __slots__ = ("info", "segment_ids", "suspect")

    def __init__(self, info: NodeInfo) -> None:
        self.info = info
        self.segment_ids: list[int] = []
        self.suspect = False
