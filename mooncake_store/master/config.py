"""Settings of the master daemon (`mooncake-master`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_store.common.addresses import advertised_host
from mooncake_store.common.config import duration_field, size_field
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.tls import TlsConfig

DEFAULT_MASTER_PORT = 50051


@dataclass(frozen=True)
class MasterConfig:
    host: str = "127.0.0.1"
    port: int = DEFAULT_MASTER_PORT
    # Framed control endpoint for Python clients (common/framed.py): 0 picks a free port, which
    # clients learn from Hello; -1 serves gRPC only.
    framed_port: int = 0
    data_dir: str = "mooncake-data/master"
    # Durability of a commit (PutEnd, remove) when the call returns (master/persistence.py):
    # True: its RocksDB group commit is fsync'd (survives a host crash; ~0.2-0.3 ms a commit).
    # False (default): it is in RocksDB's write-ahead log (survives a master crash, kill -9
    # included) and a background fsync runs at least every `sync_interval_s` (a host crash
    # loses at most that window; 0: no background fsync, the OS writes the log back).
    sync_commits: bool = False
    sync_interval_s: float = duration_field(0.1)
    lease_ttl_s: float = duration_field(5.0)
    put_timeout_s: float = duration_field(30.0)
    heartbeat_interval_s: float = duration_field(1.0)
    heartbeat_ttl_s: float = duration_field(10.0)
    restore_grace_s: float = duration_field(30.0)
    tick_interval_s: float = duration_field(0.25)
    default_replicas: int = 1
    alignment_bytes: int = size_field(4096)
    max_message_bytes: int = size_field(64 * 1024 * 1024)
    eviction_policy: str = "weighted"
    eviction_depth_cost: float = 0.02
    eviction_ghost_entries: int = 1_000_000
    dram_high_watermark: float = 0.90
    dram_low_watermark: float = 0.75
    nvme_high_watermark: float = 0.95
    nvme_low_watermark: float = 0.90
    promote_after_reads: int = 2
    max_moves_per_tick: int = 64
    hot_reads: int = 64
    hot_window_s: float = duration_field(10.0)
    max_replicas: int = 3
    max_copies_per_tick: int = 128
    # Puts started and not yet committed may hold at most this share of a node's pool (and
    # evict committed blocks only for that much); a pool holding none takes any one put.
    max_pending_share: float = 0.5
    # TLS (common/tls.py): PEM paths; cert + key serve TLS on gRPC and the framed endpoint, and
    # ca verifies the nodes' control endpoints and (with require_client_cert) every client.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_require_client_cert: bool = True
    # The host clients dial the framed endpoint at (sent in Hello); empty: the host they dialed
    # for gRPC.  Never a wildcard address.
    advertise_host: str = ""

    @property
    def tls(self) -> TlsConfig:
        return TlsConfig(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)

    def __post_init__(self) -> None:
        self.tls.check_daemon()
        if self.advertise_host:
            advertised_host(self.host, self.advertise_host)  # refuses a wildcard
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(
                f"port must be 0-65535 (0 picks a free one), got {self.port}"
            )
        if not -1 <= self.framed_port <= 65535:
            raise InvalidArgumentError(
                f"framed_port must be 0-65535 (0 picks a free one) or -1 (off), "
                f"got {self.framed_port}"
            )
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise InvalidArgumentError(
                f"heartbeat_ttl_s ({self.heartbeat_ttl_s}) must exceed heartbeat_interval_s "
                f"({self.heartbeat_interval_s}), or live nodes would be declared dead"
            )
        for name in ("lease_ttl_s", "put_timeout_s", "heartbeat_interval_s", "tick_interval_s"):
            if getattr(self, name) <= 0:
                raise InvalidArgumentError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.sync_interval_s < 0:
            raise InvalidArgumentError(
                f"sync_interval_s must be >= 0 (0: no background fsync), got {self.sync_interval_s}"
            )
        if self.default_replicas < 1:
            raise InvalidArgumentError(
                f"default_replicas must be >= 1, got {self.default_replicas}"
            )
        a = self.alignment_bytes
        if a < 64 or a & (a - 1):
            raise InvalidArgumentError(f"alignment_bytes must be a power of two >= 64, got {a}")
        if self.eviction_policy not in ("weighted", "lru"):
            raise InvalidArgumentError(
                f"eviction_policy must be 'weighted' or 'lru', got {self.eviction_policy!r}"
            )
        if self.eviction_depth_cost < 0 or self.eviction_ghost_entries < 0:
            raise InvalidArgumentError("eviction_depth_cost and eviction_ghost_entries are >= 0")
        for tier in ("dram", "nvme"):
            low = getattr(self, f"{tier}_low_watermark")
            high = getattr(self, f"{tier}_high_watermark")
            if not 0 < low <= high <= 1:
                raise InvalidArgumentError(
                    f"{tier} watermarks must satisfy 0 < low <= high <= 1, got {low} and {high}"
                )
        if self.hot_reads < 0 or self.max_replicas < 1:
            raise InvalidArgumentError("hot_reads must be >= 0 (0: off) and max_replicas >= 1")
        if self.promote_after_reads < 1 or self.max_moves_per_tick < 1:
            raise InvalidArgumentError("promote_after_reads and max_moves_per_tick must be >= 1")
        if not 0 < self.max_pending_share <= 1:
            raise InvalidArgumentError(
                f"max_pending_share must be in (0, 1], got {self.max_pending_share}"
            )
        if self.max_message_bytes < 4 * 1024 * 1024:
            raise InvalidArgumentError("max_message_bytes must be at least 4MiB")
