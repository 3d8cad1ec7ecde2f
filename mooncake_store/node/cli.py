"""`mooncake-store`: the store node daemon.

Its flags are generated from `NodeConfig` (one option per setting, with help and default).
"""

from __future__ import annotations

import click

from mooncake_store.common.config import config_options
from mooncake_store.common.daemon import OneLineErrors, log_level_option, run_daemon
from mooncake_store.node.config import NodeConfig
from mooncake_store.node.server import serve

ENV_PREFIX = "MOONCAKE_NODE_"


@click.command(
    "mooncake-store", cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]}
)
@config_options(NodeConfig, ENV_PREFIX)
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings, named as the flags (overridden by MOONCAKE_NODE_* env and "
    "flags). [default: none]",
)
@log_level_option()
def main(config_file: str | None, log_level: str, **flags: object) -> None:
    """Run a mooncake-store node: a shared-memory DRAM pool served to clients."""
    run_daemon(
        "mooncake-store",
        NodeConfig,
        serve,
        env_prefix=ENV_PREFIX,
        config_file=config_file,
        flags=flags,
        log_level=log_level,
    )


if __name__ == "__main__":
    main()
