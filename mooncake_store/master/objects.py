"""Object records of the master: ObjectMeta (a standalone record of one object, as the object
table hands it out, RocksDB stores it and a restart restores it), its Replica and its state."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any


class ObjectState(Enum):
    PROCESSING = 1
    COMMITTING = 2
    COMPLETE = 3


@dataclass(frozen=True, slots=True)
class Replica:
    """Where one copy of an object lives.  A value: the table hands out new ones from its
    columns, so replicas are compared by equality, never by identity."""

    segment_id: int
    offset: int


class ColdFields:
    """The fields of ObjectMeta that almost every block leaves at their defaults."""

    __slots__ = (
        "hold_until_s", "moving", "pin_until_s", "slow_reads", "soft_pin_until_s", "tag",
        "wanted_replicas",
    )  # fmt: skip

    hold_until_s: float
    moving: bool
    pin_until_s: float
    slow_reads: int
    soft_pin_until_s: float
    tag: bytes
    wanted_replicas: int

    def __init__(self) -> None:
        for name, default in COLD_DEFAULTS.items():
            setattr(self, name, default)


COLD_DEFAULTS: dict[str, object] = {
    "tag": b"",
    "pin_until_s": 0.0,
    "moving": False,
    "slow_reads": 0,
    "wanted_replicas": 1,
    "hold_until_s": 0.0,
    "soft_pin_until_s": 0.0,  # issue 13: evicted only when nothing unpinned is left
}


class _ColdField:
    """An ObjectMeta attribute kept in its `_cold` sidecar, created on the first write of a
    value other than the default: 48 bytes less per block for the blocks that never need it."""

    def __init__(self, default: object) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, meta: ObjectMeta | None, owner: type | None = None) -> Any:
        if meta is None:
            return self
        cold = meta._cold
        return self.default if cold is None else getattr(cold, self.name)

    def __set__(self, meta: ObjectMeta, value: object) -> None:
        cold = meta._cold
        if cold is None:
            if value == self.default:
                return
            cold = meta._cold = ColdFields()
        setattr(cold, self.name, value)


class ObjectMeta:
    """One object's metadata as a standalone record: a snapshot of a table entry, a record
    loaded from RocksDB, or one to restore.  The table itself keeps its objects in columns
    (see ObjectTable); the fields most records leave at their defaults live in a sidecar
    object made on demand."""

    __slots__ = (
        "_cold", "_replicas", "access_count", "checksum", "created_s", "fingerprint", "key",
        "last_access_s", "lease_until_s", "parent_key", "size_bytes", "state",
        "window_reads", "window_start_s",
    )  # fmt: skip

    _replicas: Replica | tuple[Replica, ...]
    tag = _ColdField(b"")
    pin_until_s = _ColdField(0.0)
    moving = _ColdField(False)
    slow_reads = _ColdField(0)  # reads served only from a persistent tier since it got there
    wanted_replicas = _ColdField(1)  # what the put asked for: re-replication restores it
    hold_until_s = _ColdField(0.0)  # a node-to-node copy reads the source until then
    soft_pin_until_s = _ColdField(0.0)  # kept while anything else can be evicted (not persisted)

    def __init__(
        self,
        key: str,
        size_bytes: int,
        state: ObjectState,
        replicas: tuple[Replica, ...],
        *,
        checksum: int = 0,
        created_s: float = 0.0,
        lease_until_s: float = 0.0,
        access_count: int = 0,
        last_access_s: float = 0.0,
        fingerprint: bytes = b"",
        parent_key: str = "",
        tag: bytes = b"",
        pin_until_s: float = 0.0,
        moving: bool = False,
        slow_reads: int = 0,
        wanted_replicas: int = 1,
        window_start_s: float = 0.0,  # hot-block detection: reads since window_start_s
        window_reads: int = 0,
        hold_until_s: float = 0.0,
        soft_pin_until_s: float = 0.0,
    ) -> None:
        self.key = key
        self.size_bytes = size_bytes
        self.state = state
        self.replicas = replicas
        self.checksum = checksum
        self.created_s = created_s
        self.lease_until_s = lease_until_s
        self.access_count = access_count
        self.last_access_s = last_access_s
        self.fingerprint = fingerprint
        self.parent_key = parent_key
        self.window_start_s = window_start_s
        self.window_reads = window_reads
        self._cold: ColdFields | None = None
        self.tag = tag
        self.pin_until_s = pin_until_s
        self.moving = moving
        self.slow_reads = slow_reads
        self.wanted_replicas = wanted_replicas
        self.hold_until_s = hold_until_s
        self.soft_pin_until_s = soft_pin_until_s

    @property
    def replicas(self) -> tuple[Replica, ...]:
        r = self._replicas
        return (r,) if type(r) is Replica else r  # type: ignore[return-value]

    @replicas.setter
    def replicas(self, replicas: tuple[Replica, ...]) -> None:
        # Almost every block has one replica: keep it without a tuple (48 bytes a block).
        self._replicas = replicas[0] if len(replicas) == 1 else tuple(replicas)

    def _fields(self) -> tuple[object, ...]:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ObjectMeta):
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        body = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"ObjectMeta({body})"

    @property
    def protected_until_s(self) -> float:
        """Readers' leases and copies in flight keep the extents until then."""
        return max(self.lease_until_s, self.hold_until_s)


_FIELDS = (
    "key", "size_bytes", "state", "replicas", "checksum", "created_s", "lease_until_s",
    "access_count", "last_access_s", "fingerprint", "parent_key", *COLD_DEFAULTS,
    "window_start_s", "window_reads",
)  # fmt: skip
