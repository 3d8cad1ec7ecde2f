"""Plain data the client passes around (protobuf stays in master_client.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ReplicaLocation:
    node_id: str
    segment_id: int
    endpoint: str
    shm_socket: str
    offset: int
    size_bytes: int
    grant: bytes
    tier: str = "DRAM"


@dataclass(frozen=True, slots=True)
class PutPlan:
    already_exists: bool
    replicas: list[ReplicaLocation]


@dataclass(frozen=True, slots=True)
class ReplicaList:
    size_bytes: int
    checksum: int
    replicas: list[ReplicaLocation]
    tag: bytes = b""
    parent_key: str = ""


@dataclass(frozen=True, slots=True)
class PutSpec:
    """One object of a BatchPutStart."""

    key: str
    size_bytes: int
    replicas: int = 0
    fingerprint: bytes = b""
    parent_key: str = ""
    tag: bytes = b""
    pin: bool = False
    pin_ttl_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PrefixRead:
    """What `get_prefix_into` read: the first `matched` keys, their sizes and tags."""

    matched: int
    sizes: list[int]
    tags: list[bytes]


@dataclass(frozen=True, slots=True)
class PutResult:
    """What a put did: `replicas` written (0 when `deduplicated`: the key was already stored)."""

    key: str
    replicas: int
    deduplicated: bool


@dataclass(frozen=True, slots=True)
class Retry:
    """Retry policy for master calls that fail because the master is unreachable.

    `attempts` counts the first try; the wait doubles from `backoff_s` up to `max_backoff_s`.
    """

    attempts: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0

    def delays(self) -> list[float]:
        out, delay = [], self.backoff_s
        for _ in range(max(0, self.attempts - 1)):
            out.append(delay)
            delay = min(delay * 2, self.max_backoff_s)
        return out


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: str
    segment_id: int
    endpoint: str
    tier: str
    size_bytes: int
    used_bytes: int
    objects: int
    last_heartbeat_age_s: float


@dataclass(frozen=True, slots=True)
class ClusterStats:
    objects: int
    processing: int
    bytes_stored: int
    nodes: int
    capacity_bytes: int
    used_bytes: int
    max_object_bytes: int
    counters: dict[str, int]
