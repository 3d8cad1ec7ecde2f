"""`mooncake-master`: the metadata and routing daemon."""

from __future__ import annotations

import click

from mooncake_store.common.daemon import run_daemon, tls_options
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.server import serve


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--host", default=None, help="Address to bind [127.0.0.1].")
@click.option(
    "--advertise-host", default=None,
    help="Host clients dial the framed endpoint at [the host they dialed for gRPC].",
)  # fmt: skip
@click.option("--port", type=int, default=None, help="Port to bind; 0 picks a free one [50051].")
@click.option(
    "--framed-port",
    type=int,
    default=None,
    help="Port of the framed control endpoint Python clients use; 0 picks a free one, "
    "-1 serves gRPC only [0].",
)
@click.option(
    "--sync-commits/--no-sync-commits",
    default=None,
    help="fsync each group commit before answering, or (default) answer once it is in "
    "RocksDB's log and fsync the log in the background every --sync-interval.",
)
@click.option(
    "--sync-interval",
    "sync_interval_s",
    default=None,
    help="Without --sync-commits: fsync RocksDB's log at least this often while commits are "
    "unsynced; a host crash loses at most this window (0: never, the OS decides) [100ms].",
)
@click.option("--data-dir", default=None, help="RocksDB directory [./mooncake-data/master].")
@click.option("--lease-ttl", "lease_ttl_s", default=None, help="Read lease, e.g. 5s.")
@click.option(
    "--put-timeout",
    "put_timeout_s",
    default=None,
    help="A put not ended within this is reclaimed [30s].",
)
@click.option(
    "--heartbeat-interval",
    "heartbeat_interval_s",
    default=None,
    help="How often nodes heartbeat [1s].",
)
@click.option(
    "--heartbeat-ttl",
    "heartbeat_ttl_s",
    default=None,
    help="A node silent this long is declared dead [10s].",
)
@click.option("--default-replicas", type=int, default=None, help="Replicas per put [1].")
@click.option(
    "--eviction-policy",
    type=click.Choice(["weighted", "lru"]),
    default=None,
    help="Which blocks go first when a tier is full [weighted].",
)
@click.option(
    "--eviction-depth-cost",
    type=float,
    default=None,
    help="Weighted policy: extra value per block of prefix depth [0.02].",
)
@click.option(
    "--dram-high-watermark",
    type=float,
    default=None,
    help="DRAM fill that starts demotion to NVMe [0.9].",
)
@click.option(
    "--dram-low-watermark", type=float, default=None, help="DRAM fill demotion stops at [0.75]."
)
@click.option(
    "--nvme-high-watermark",
    type=float,
    default=None,
    help="NVMe fill that starts dropping blocks [0.95].",
)
@click.option(
    "--nvme-low-watermark", type=float, default=None, help="NVMe fill dropping stops at [0.9]."
)
@click.option(
    "--promote-after-reads",
    type=int,
    default=None,
    help="Reads from NVMe that bring a block back to DRAM [2].",
)
@click.option(
    "--hot-reads",
    type=int,
    default=None,
    help="Reads within --hot-window that earn a block an extra replica [64; 0: off].",
)
@click.option(
    "--hot-window", "hot_window_s", default=None, help="Window of the hot-block read count [10s]."
)
@click.option("--max-replicas", type=int, default=None, help="Most replicas a hot block gets [3].")
@click.option("--max-copies-per-tick", type=int, default=None,
              help="Node-to-node copies started per 250 ms tick [128].")  # fmt: skip
@click.option(
    "--max-pending-share",
    type=float,
    default=None,
    help="Share of a node's pool that puts started and not yet ended may hold (and evict "
    "committed blocks for) [0.5].",
)
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings (overridden by MOONCAKE_MASTER_* env and flags).",
)
@tls_options
@click.option("--log-level", default="INFO", show_default=True)
def main(config_file: str | None, log_level: str, **flags: object) -> None:
    """Run the mooncake-store master (metadata and routing, persisted in RocksDB)."""
    run_daemon(
        "mooncake-master",
        MasterConfig,
        serve,
        env_prefix="MOONCAKE_MASTER_",
        config_file=config_file,
        flags=flags,
        log_level=log_level,
    )


if __name__ == "__main__":
    main()
