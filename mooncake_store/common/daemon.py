"""What the daemons' command lines share: one-line start-up errors, logging, config, the loop.

A daemon that cannot start exits non-zero with ONE line on stderr that names the cause and the
fix (`mooncake-store: error: --dram 10TiB is more than the 7.6 GiB of memory available: ...`),
never a traceback: bad flags and values exit 2, failures to start (a locked data dir, a port in
use, too little memory) exit 1.  `--log-level DEBUG` adds the traceback of an unexpected one.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import click

from mooncake_store.common.config import load_config
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.loop import loop_factory

C = TypeVar("C")
F = TypeVar("F", bound=Callable[..., Any])


log = logging.getLogger("mooncake.daemon")

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class StartupError(Exception):
    """A daemon cannot start; the message names the cause and the fix, in one line."""


def fail(name: str, message: str, code: int) -> None:
    """Print `name: error: message` as one line on stderr and exit with `code`."""
    one_line = " ".join(str(message).split())
    click.echo(f"{name}: error: {one_line}", err=True)
    sys.exit(code)


class OneLineErrors(click.Command):
    """A click command whose usage errors are one line (`prog: error: ...`), not a usage block."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        name = prog_name or self.name or "mooncake"
        try:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            fail(name, f"{exc.format_message()} (see {name} --help)", exc.exit_code)
        except click.Abort:
            fail(name, "aborted", 1)
        return None


def log_level_option() -> Callable[[Any], Any]:
    return click.option(
        "--log-level",
        default="INFO",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        help="How much the daemon logs (to stderr). [default: INFO]",
    )


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
    """Load the config (a bad value exits 2 with one line) and run `serve` until it ends."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(
            config_cls, env_prefix=env_prefix, config_file=config_file, overrides=flags
        )
    except InvalidArgumentError as exc:
        fail(name, str(exc), 2)
    try:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(config))
    except InvalidArgumentError as exc:
        fail(name, str(exc), 2)
    except StartupError as exc:
        fail(name, str(exc), 1)
    except OSError as exc:
        fail(name, str(exc), 1)
    except Exception as exc:  # an unexpected failure: still one line; DEBUG adds the traceback
        log.debug("start-up failed", exc_info=True)
        fail(name, f"{type(exc).__name__}: {exc} (rerun with --log-level DEBUG for details)", 1)
