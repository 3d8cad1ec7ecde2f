"""Settings of the master daemon (`mooncake-master`): the one config object, passed down whole.

Every field is a setting with one name as flag, TOML key and env variable (see
`common/config.py`); the master's parts (object table, tiering, replication, mover, servers)
read their settings from this object, never from copies of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_store.common.addresses import advertised_host
from mooncake_store.common.batching import DEFAULT_MAX_BATCH_ITEMS
from mooncake_store.common.config import TlsSettings, duration_field, setting, size_field
from mooncake_store.common.credentials import is_loopback
from mooncake_store.common.errors import InvalidArgumentError

DEFAULT_MASTER_PORT = 50051


@dataclass(frozen=True)
class MasterConfig(TlsSettings):
    host: str = setting("127.0.0.1", "Address to bind.")
    port: int = setting(DEFAULT_MASTER_PORT, "gRPC port; 0 picks a free one (printed at start).")
    framed_port: int = setting(
        0,
        "Port of the framed control endpoint Python clients use (advertised by Hello); "
        "0 picks a free one, -1 serves gRPC only.",
    )
    metrics_port: int = setting(
        0,
        "Port of the Prometheus /metrics endpoint; 0 picks a free one (printed at start), -1: off.",
    )
    data_dir: str = setting("mooncake-data/master", "RocksDB directory (relative to the cwd).")
    sync_commits: bool = setting(
        False,
        "fsync each group commit before answering; off (default): answer once it is in "
        "RocksDB's log and fsync the log in the background every --sync-interval.",
    )
    sync_interval_s: float = duration_field(
        0.1,
        "Without --sync-commits: fsync RocksDB's log at least this often while commits are "
        "unsynced; a host crash loses at most this window (0: never, the OS decides).",
    )
    lease_ttl_s: float = duration_field(
        5.0, "Read lease: a block being read is not freed or reused for this long."
    )
    put_timeout_s: float = duration_field(30.0, "A put not ended within this is reclaimed.")
    heartbeat_interval_s: float = duration_field(1.0, "How often nodes heartbeat.")
    heartbeat_ttl_s: float = duration_field(
        10.0,
        "A node silent this long is suspect: no longer offered to readers and writers, its "
        "replicas kept (see --suspect-grace).",
    )
    suspect_grace_s: float = duration_field(
        20.0,
        "A suspect node's replicas are kept this much longer: heard from again within it, the "
        "node is offered again; silent past it, it is dropped with the replicas.",
    )
    max_batch_items: int = setting(
        DEFAULT_MAX_BATCH_ITEMS,
        "Most keys or items one batch call may carry; a bigger batch is refused as a whole "
        "(InvalidArgumentError naming this cap); clients learn it (Hello) and split bigger "
        "batches. Batches are served in slices of 1024 items that yield to other calls.",
    )
    max_calls_per_connection: int = setting(
        256,
        "Calls in flight per client connection: at the cap the framed endpoint stops reading "
        "the connection until calls finish (gRPC: max concurrent streams).",
    )
    idle_timeout_s: float = duration_field(
        600.0,
        "A client connection with nothing in flight and nothing received for this long is "
        "closed (framed endpoint and gRPC); 0: never.",
    )
    busy_poll_s: float = duration_field(
        0.0,
        "After a framed request that came within this long of the one before, keep the event "
        "loop polling instead of sleeping for this long, so the next one finds it awake "
        "(e.g. 400us; common/loop_spin.py).  Takes a core while it spins: for a master with "
        "cores of its own.  0: off.",
    )
    max_connections: int = setting(
        4096,
        "Most client connections at once, on the framed endpoint and on gRPC each: one more "
        "framed connection is refused (a BAD_REQUEST frame naming the cap, then closed); the "
        "calls of one more gRPC connection are refused (RESOURCE_EXHAUSTED naming the cap), "
        "and gRPC closes connections past cap + max(16, cap/16) at accept. Node calls are "
        "never refused. Refusals are logged.",
    )
    liveness_port: int = setting(
        0,
        "Port of the heartbeat endpoint (its own threads: client load cannot delay it), learnt "
        "by nodes at mount; 0: the port of the last run on this --data-dir when it is free (nodes "
        "reach a restarted master there at once), else a free one; -1: heartbeats on --port only.",
    )
    restore_grace_s: float = duration_field(
        30.0, "After a restart, how long restored replicas wait for their node to mount again."
    )
    tick_interval_s: float = duration_field(
        0.25, "Period of the background work (liveness, reclaims, tiering, repairs)."
    )
    default_replicas: int = setting(1, "Copies per put when the client does not say.")
    alignment_bytes: int = size_field(4096, "Extent alignment in the pools (a power of two).")
    max_message_bytes: int = size_field(
        64 * 1024 * 1024, "Largest gRPC message or framed-endpoint frame accepted (at least 4MiB)."
    )
    eviction_policy: str = setting(
        "weighted",
        "Which blocks go first when a tier is full: weighted (chain-aware GreedyDual) or lru.",
        choices=("weighted", "lru"),
    )
    eviction_depth_cost: float = setting(0.02, "Weighted policy: extra value per prefix depth.")
    eviction_ghost_entries: int = setting(
        1_000_000, "Weighted policy: evicted keys remembered to recognise re-admissions."
    )
    dram_high_watermark: float = setting(0.90, "DRAM fill that starts demotion to NVMe.")
    dram_low_watermark: float = setting(0.75, "DRAM fill that demotion stops at.")
    nvme_high_watermark: float = setting(0.95, "NVMe fill that starts dropping blocks.")
    nvme_low_watermark: float = setting(0.90, "NVMe fill that dropping stops at.")
    gpu_high_watermark: float = setting(0.90, "GPU-tier fill that starts demotion to DRAM.")
    gpu_low_watermark: float = setting(0.75, "GPU-tier fill that demotion stops at.")
    promote_after_reads: int = setting(2, "Reads served from NVMe that bring a block to DRAM.")
    gpu_promote_after_reads: int = setting(
        3, "Reads served from DRAM that bring a block to a GPU tier."
    )
    max_moves_per_tick: int = setting(64, "Tier moves (demotions, promotions) started per tick.")
    hot_reads: int = setting(
        64, "Reads within --hot-window that earn a block an extra replica (0: off)."
    )
    hot_window_s: float = duration_field(10.0, "Window of the hot-block read count.")
    max_replicas: int = setting(3, "Most replicas a hot block gets.")
    max_copies_per_tick: int = setting(128, "Node-to-node copies started per tick.")
    copy_timeout_s: float = duration_field(
        30.0, "A node-to-node copy not finished within this is given up and retried."
    )
    node_call_timeout_s: float = duration_field(
        60.0, "Deadline of the master's calls to nodes (moves, copies, releases)."
    )
    stop_grace_s: float = duration_field(
        2.0, "On SIGTERM, how long in-flight calls get before the master stops."
    )
    advertise_host: str = setting(
        "",
        "Host clients dial the framed endpoint at (sent in Hello; never a wildcard); "
        "unset: the host they dialed for gRPC.",
    )
    max_pending_share: float = setting(
        0.75,
        "Share of a node's pool that puts started and not yet ended may hold (and evict "
        "committed blocks for); a pool holding none takes any one put.",
    )
    auth: str = setting(
        "on",
        "on: every call needs a token signed with the cluster key (<data-dir>/cluster.key; see "
        "`mooncake-admin token create`); off: none, for a trusted lab, only with a loopback "
        "--host.",
        choices=("on", "off"),
    )

    def __post_init__(self) -> None:
        self.tls.check_daemon()
        if self.auth == "off" and not is_loopback(self.host):
            raise InvalidArgumentError(
                f"--auth off serves everyone who can reach {self.host}: it is allowed only with a "
                "loopback --host (127.0.0.1); keep auth on to bind other addresses"
            )
        if self.advertise_host:
            advertised_host(self.host, self.advertise_host)  # refuses a wildcard
        if not 0 <= self.port <= 65535:
            raise InvalidArgumentError(
                f"--port must be 0-65535 (0 picks a free one), got {self.port}"
            )
        for name in ("framed_port", "metrics_port", "liveness_port"):
            value = getattr(self, name)
            if not -1 <= value <= 65535:
                raise InvalidArgumentError(
                    f"--{name.replace('_', '-')} must be 0-65535 (0 picks a free one) or -1 "
                    f"(off), got {value}"
                )
        for name in ("max_batch_items", "max_calls_per_connection", "max_connections"):
            if getattr(self, name) < 1:
                flag = "--" + name.replace("_", "-")
                raise InvalidArgumentError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.busy_poll_s <= 0.01:
            raise InvalidArgumentError(
                f"--busy-poll must be between 0 (off) and 10ms, got {self.busy_poll_s}"
            )
        if self.idle_timeout_s < 0:
            raise InvalidArgumentError(
                f"--idle-timeout must be >= 0 (0: never), got {self.idle_timeout_s}"
            )
        if self.suspect_grace_s < 0:
            raise InvalidArgumentError(
                f"--suspect-grace must be >= 0 (0: drop a node at its TTL), "
                f"got {self.suspect_grace_s}"
            )
        if self.heartbeat_ttl_s <= self.heartbeat_interval_s:
            raise InvalidArgumentError(
                f"--heartbeat-ttl ({self.heartbeat_ttl_s}s) must exceed --heartbeat-interval "
                f"({self.heartbeat_interval_s}s), or live nodes would be declared dead"
            )
        for name in ("lease_ttl_s", "put_timeout_s", "heartbeat_interval_s", "tick_interval_s",
                     "copy_timeout_s", "node_call_timeout_s"):  # fmt: skip
            if getattr(self, name) <= 0:
                flag = "--" + name[: -len("_s")].replace("_", "-")
                raise InvalidArgumentError(f"{flag} must be > 0, got {getattr(self, name)}")
        if self.sync_interval_s < 0:
            raise InvalidArgumentError(
                f"--sync-interval must be >= 0 (0: no background fsync), got {self.sync_interval_s}"
            )
        if self.default_replicas < 1:
            raise InvalidArgumentError(
                f"--default-replicas must be >= 1, got {self.default_replicas}"
            )
        a = self.alignment_bytes
        if a < 64 or a & (a - 1):
            raise InvalidArgumentError(f"--alignment-bytes must be a power of two >= 64, got {a}")
        if self.eviction_policy not in ("weighted", "lru"):
            raise InvalidArgumentError(
                f"--eviction-policy must be 'weighted' or 'lru', got {self.eviction_policy!r}"
            )
        if self.eviction_depth_cost < 0 or self.eviction_ghost_entries < 0:
            raise InvalidArgumentError(
                "--eviction-depth-cost and --eviction-ghost-entries must be >= 0"
            )
        for tier in ("dram", "nvme", "gpu"):
            low = getattr(self, f"{tier}_low_watermark")
            high = getattr(self, f"{tier}_high_watermark")
            if not 0 < low <= high <= 1:
                raise InvalidArgumentError(
                    f"--{tier}-low-watermark and --{tier}-high-watermark must satisfy "
                    f"0 < low <= high <= 1, got {low} and {high}"
                )
        if self.hot_reads < 0 or self.max_replicas < 1:
            raise InvalidArgumentError("--hot-reads must be >= 0 (0: off), --max-replicas >= 1")
        if (
            self.promote_after_reads < 1
            or self.gpu_promote_after_reads < 1
            or self.max_moves_per_tick < 1
            or self.max_copies_per_tick < 1
        ):
            raise InvalidArgumentError(
                "--promote-after-reads, --gpu-promote-after-reads, --max-moves-per-tick and "
                "--max-copies-per-tick must be >= 1"
            )
        if not 0 < self.max_pending_share <= 1:
            raise InvalidArgumentError(
                f"--max-pending-share must be in (0, 1], got {self.max_pending_share}"
            )
        if self.max_message_bytes < 4 * 1024 * 1024:
            raise InvalidArgumentError("--max-message-bytes must be at least 4MiB")
