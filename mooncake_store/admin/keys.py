"""`mooncake-admin keys`: the committed keys, paged through the master's ListKeys RPC."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import click

from mooncake_store.admin.ops import connect, emit, json_option, master_option, table
from mooncake_store.common.units import format_size

PAGE = 1000


class ListingUnsupported(click.ClickException):
    """The client SDK or the master has no ListKeys."""


def iter_pages(client: Any, prefix: str, page: int = PAGE) -> Iterator[list[Any]]:
    """Pages of KeyInfo(key, size_bytes, replicas) whose key starts with `prefix`."""
    if not hasattr(client, "list_keys"):
        raise ListingUnsupported(
            "listing keys needs the master's ListKeys RPC, which this build does not have"
        )
    cursor = ""
    while True:
        keys, cursor = client.list_keys(prefix, cursor=cursor, limit=page)
        yield keys
        if not cursor:
            return


def iter_keys(client: Any, prefix: str, *, limit: int | None) -> Iterator[str]:
    """Up to `limit` (None: all) keys that start with `prefix`, page by page."""
    for info in iter_infos(client, prefix, limit=limit):
        yield info.key


def iter_infos(client: Any, prefix: str, *, limit: int | None) -> Iterator[Any]:
    count = 0
    for keys in iter_pages(client, prefix):
        for info in keys:
            if limit is not None and count >= limit:
                return
            count += 1
            yield info


@click.command()
@master_option
@click.option("--prefix", default="", help="Only keys that start with this.  [default: all keys]")
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True,
              help="Most keys to print.")  # fmt: skip
@json_option
def keys(master: str, prefix: str, limit: int, as_json: bool) -> None:
    """The committed keys (with size and replica count), fetched page by page."""
    with connect(master) as client:
        infos = list(iter_infos(client, prefix, limit=limit))
    data = [{"key": i.key, "size_bytes": i.size_bytes, "replicas": i.replicas} for i in infos]
    rows = [(i.key, format_size(i.size_bytes), i.replicas) for i in infos]
    text = table(["KEY", "SIZE", "REPLICAS"], rows) if rows else "no keys"
    emit(as_json, data, text)
