"""`mooncake-master`: the metadata and routing daemon.

Its flags are generated from `MasterConfig` (one option per setting, with help and default).
"""

from __future__ import annotations

import click

from mooncake_store.common.config import config_options
from mooncake_store.common.daemon import OneLineErrors, log_level_option, run_daemon
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.server import serve

ENV_PREFIX = "MOONCAKE_MASTER_"


@click.command(
    "mooncake-master", cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]}
)
@config_options(MasterConfig, ENV_PREFIX)
@click.option(
    "--config",
    "config_file",
    default=None,
    type=click.Path(dir_okay=False),
    help="TOML file of settings, named as the flags (overridden by MOONCAKE_MASTER_* env and "
    "flags). [default: none]",
)
@log_level_option()
def main(config_file: str | None, log_level: str, **flags: object) -> None:
    """Run the mooncake-store master (metadata and routing, persisted in RocksDB)."""
    run_daemon(
        "mooncake-master",
        MasterConfig,
        serve,
        env_prefix=ENV_PREFIX,
        config_file=config_file,
        flags=flags,
        log_level=log_level,
    )


if __name__ == "__main__":
    main()
