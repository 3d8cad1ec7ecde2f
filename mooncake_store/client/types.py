"""Plain data the client passes around (protobuf stays in master_client.py)."""

from __future__ import annotations

import random
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
    existing_checksum: int | None = None  # already_exists: the stored value's checksum


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
    soft_pin_ttl_s: float = 0.0
    preferred_nodes: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class KeyInfo:
    """A committed key as the master's key listing reports it."""

    key: str
    size_bytes: int
    replicas: int


@dataclass(frozen=True, slots=True)
class ReplicaInfo:
    """Where one replica lives, from the master's metadata (no lease, no grant)."""

    node_id: str
    segment_id: int
    endpoint: str
    tier: str
    offset: int


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """An object's size and placement, from the master's metadata alone."""

    size_bytes: int
    replicas: list[ReplicaInfo]


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
    """Retry policy for master calls.

    A call is retried only where that is safe: when it provably never reached the master (the
    connection was refused or lost before the request went out), or when repeating it cannot
    change the outcome (lookups, exists, stats, and PutEnd, which the master answers the same
    way twice).  Anything else that fails after it was sent raises at once:
    `MasterTimeoutError` without a reply, `MasterUnavailableError` when the connection died.

    `attempts` counts the first try.  The waits between tries are jittered ("decorrelated
    jitter": each is drawn between `backoff_s` and three times the previous one, capped at
    `max_backoff_s`), so clients that lost a master together do not come back in lockstep;
    `jitter=False` gives the plain doubling schedule.
    """

    attempts: int = 3
    backoff_s: float = 0.05
    max_backoff_s: float = 1.0
    jitter: bool = True

    def delays(self, rng: random.Random | None = None) -> list[float]:
        """The waits before each retry (one fewer than `attempts`)."""
        draw = rng or random
        out: list[float] = []
        delay = self.backoff_s
        for _ in range(max(0, self.attempts - 1)):
            if self.jitter:
                delay = min(self.max_backoff_s, draw.uniform(self.backoff_s, delay * 3))
                out.append(delay)
            else:
                out.append(delay)
                delay = min(delay * 2, self.max_backoff_s)
        return out


@dataclass(frozen=True, slots=True)
class NodeStatus:
    """One mounted segment of a node (`list_nodes`).  `state`: "valid" (offered to readers and
    writers), "suspect" (silent past its heartbeat TTL: not offered, its replicas kept; dropped
    in `drop_in_s` seconds unless heard from), "draining" (stopping: no new puts onto it) or
    "mounting" (mounted a moment ago: readable, no puts until it took the master's first write
    fence)."""

    node_id: str
    segment_id: int
    endpoint: str
    tier: str
    size_bytes: int
    used_bytes: int
    objects: int
    last_heartbeat_age_s: float
    state: str = "valid"
    drop_in_s: float = 0.0
    #: Unused allocation leases (space granted to clients ahead of their puts), left out of
    #: `objects` and `used_bytes`: a put that needs their room gets it.
    leases: int = 0
    leased_bytes: int = 0


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
    #: Unused allocation leases, all nodes, left out of `processing` (puts in flight) and
    #: `used_bytes`: a put that needs their room gets it.
    leases: int = 0
    leased_bytes: int = 0
