"""What both daemons' command lines share: logging set-up, config loading, running the loop."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import click

from mooncake_store.common.config import load_config
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.loop import loop_factory

C = TypeVar("C")
F = TypeVar("F", bound=Callable[..., Any])


def tls_options(command: F) -> F:
    """The --tls-* flags both daemons take (settings tls_cert, tls_key, tls_ca, ...)."""
    options = [
        click.option("--tls-cert", default=None,
                     help="PEM certificate chain: serve TLS on every TCP listener [off]."),
        click.option("--tls-key", default=None, help="PEM private key of --tls-cert."),
        click.option("--tls-ca", default=None,
                     help="PEM CA that signed the cluster's certificates: peers are verified "
                     "against it, and clients must present a certificate it signed."),
        click.option("--tls-require-client-cert/--no-tls-require-client-cert", default=None,
                     help="With --tls-ca: refuse clients without a certificate [on]."),
    ]  # fmt: skip
    for option in reversed(options):
        command = option(command)
    return command


def run_daemon(
    name: str,
    config_cls: type[C],
    serve: Callable[[C], Coroutine[Any, Any, None]],
    *,
    env_prefix: str,
    config_file: str | None,
    flags: Mapping[str, object],
    log_level: str,
) -> None:
    """Load the config (a bad value is a usage error, exit 2) and run `serve` until it ends."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(
            config_cls, env_prefix=env_prefix, config_file=config_file, overrides=flags
        )
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(config))
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    except OSError as exc:
        click.echo(f"{name}: {exc}", err=True)
        sys.exit(1)
