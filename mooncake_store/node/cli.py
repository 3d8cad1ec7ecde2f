"""`mooncake-store`: the store node daemon."""

from __future__ import annotations

import click

from mooncake_store.common.daemon import run_daemon, tls_options
from mooncake_store.node.config import NodeConfig
from mooncake_store.node.server import serve


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--master", default=None, help="Master address host:port [127.0.0.1:50051].")
@click.option("--host", default=None, help="Address to bind [127.0.0.1].")
@click.option(
    "--advertise-host", default=None,
    help="Address clients and other nodes dial this node at [--host; required with 0.0.0.0].",
)  # fmt: skip
@click.option("--port", type=int, default=None, help="TCP data port; 0 picks a free one [0].")
@click.option(
    "--control-port", type=int, default=None,
    help="gRPC port of the health and control services [0].",
)  # fmt: skip
@click.option("--dram", "dram_bytes", default=None, help="DRAM pool size, e.g. 1GiB [1GiB].")
@click.option("--nvme-dir", default=None, help="Directory of the NVMe tier (off when unset).")
@click.option("--nvme", "nvme_bytes", default=None, help="NVMe tier size, e.g. 64GiB.")
@click.option("--io-threads", type=int, default=None, help="NVMe I/O queue depth [2].")
@click.option(
    "--gpu-bytes", default=None,
    help="GPU tier size (needs a CUDA GPU and the [gpu] extra) [0: off].",
)  # fmt: skip
@click.option("--node-id", default=None, help="Stable node name [hostname:port].")
@click.option(
    "--shm-group", default=None,
    help="Group (name or gid) whose members, besides this uid, may map the pool [none].",
)  # fmt: skip
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings (overridden by MOONCAKE_NODE_* env and flags).",
)
@tls_options
@click.option("--log-level", default="INFO", show_default=True)
def main(config_file: str | None, log_level: str, **flags: object) -> None:
    """Run a mooncake-store node: a shared-memory DRAM pool served to clients."""
    run_daemon(
        "mooncake-store",
        NodeConfig,
        serve,
        env_prefix="MOONCAKE_NODE_",
        config_file=config_file,
        flags=flags,
        log_level=log_level,
    )


if __name__ == "__main__":
    main()
