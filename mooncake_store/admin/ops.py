"""`mooncake-admin nodes | stats | keys | remove | drain`: inspect and manage a running cluster.

Each command talks to the master (`--master`, default 127.0.0.1:50051, or $MOONCAKE_ADMIN_MASTER)
through the client SDK's control calls, prints a readable table, or with `--json` one JSON
document for scripts.  A failure is one line on stderr and exit code 1.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import click

from mooncake_store.common.errors import MooncakeError
from mooncake_store.common.units import format_size

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_MASTER = "127.0.0.1:50051"


def master_option(func: F) -> F:
    """`--master` (passed to the command) and `--connect-timeout` (kept for `connect`)."""
    func = click.option(
        "--connect-timeout",
        type=click.FloatRange(min=0.1),
        default=10.0,
        show_default=True,
        expose_value=False,
        callback=lambda ctx, _param, value: ctx.meta.__setitem__("connect_timeout_s", value),
        help="Seconds a call waits for the master.",
    )(func)
    return click.option(
        "--master",
        default=DEFAULT_MASTER,
        envvar="MOONCAKE_ADMIN_MASTER",
        show_default=True,
        help="Master address host:port (env MOONCAKE_ADMIN_MASTER).",
    )(func)


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")(
        func
    )


@contextmanager
def connect(master: str) -> Iterator[Any]:
    """A client of `master`; an error becomes one line on stderr and exit code 1."""
    from mooncake_store.client.sync_client import Client

    try:
        ctx = click.get_current_context(silent=True)
        timeout_s = ctx.meta.get("connect_timeout_s", 10.0) if ctx is not None else 10.0
        with Client(master, timeout_s=timeout_s) as client:
            yield client
    except MooncakeError as exc:
        click.echo(f"mooncake-admin: error: {exc}", err=True)
        sys.exit(1)


def master_metadata(master: str) -> tuple[tuple[str, str], ...] | None:
    """gRPC metadata with an admin token for raw calls to `master` (None: no token, or a build
    without auth): MOONCAKE_TOKEN(_FILE), else the admin token of the master's local token file
    (on its host, as its user).  DrainNode needs an admin (or the node's own) token."""
    try:
        from mooncake_store.common.auth import Role, bearer  # type: ignore[attr-defined]
        from mooncake_store.common.credentials import (  # type: ignore[import-not-found]
            discover_token,
        )
    except ImportError:
        return None
    token = discover_token(master, Role.ADMIN)
    return (("authorization", f"Bearer {bearer(token)}"),) if token else None


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Columns padded to their widest cell; numbers right-aligned."""
    cells = [[str(c) for c in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    numeric = [all(_is_number(r[i]) for r in cells[1:]) and len(cells) > 1
               for i in range(len(headers))]  # fmt: skip
    lines = []
    for row in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric,
                                                                         strict=True)]  # fmt: skip
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _is_number(text: str) -> bool:
    return text.replace(".", "", 1).replace("%", "").replace(" ", "").isdigit() or text in ("-",)


def emit(as_json: bool, data: object, text: str) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=True) if as_json else text)


@click.command()
@master_option
@json_option
def nodes(master: str, as_json: bool) -> None:
    """The mounted store nodes: one row per node and tier, with its state (valid, suspect:
    not offered and dropped after the grace window unless heard from, draining), fill and
    object counts."""
    with connect(master) as client:
        segments = client.list_nodes()
    data = [
        {"node_id": s.node_id, "tier": s.tier, "endpoint": s.endpoint, "state": s.state,
         "drop_in_s": round(s.drop_in_s, 3),
         "size_bytes": s.size_bytes, "used_bytes": s.used_bytes, "objects": s.objects,
         "fill": s.used_bytes / s.size_bytes if s.size_bytes else 0.0,
         "last_heartbeat_age_s": round(s.last_heartbeat_age_s, 3),
         "segment_id": str(s.segment_id)}
        for s in sorted(segments, key=lambda s: (s.node_id, s.tier))
    ]  # fmt: skip
    rows = [
        (d["node_id"], d["tier"], d["endpoint"], _state_text(d["state"], d["drop_in_s"]),
         format_size(d["size_bytes"]), format_size(d["used_bytes"]), f"{100 * d['fill']:.1f}%",
         d["objects"], f"{d['last_heartbeat_age_s']:.1f}s")
        for d in data
    ]  # fmt: skip
    text = table(["NODE", "TIER", "ENDPOINT", "STATE", "SIZE", "USED", "FILL", "OBJECTS",
                  "HEARTBEAT"], rows) if rows else "no nodes mounted"  # fmt: skip
    emit(as_json, data, text)


def _state_text(state: str, drop_in_s: float) -> str:
    """A node's state for the table: a suspect one says when it is dropped."""
    return f"suspect (dropped in {drop_in_s:.1f}s)" if state == "suspect" else state


def hit_rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


@click.command()
@master_option
@json_option
def stats(master: str, as_json: bool) -> None:
    """Cluster totals: objects, hit rates of gets and prefix matches, fill per tier, events."""
    with connect(master) as client:
        s = client.stats()
        segments = client.list_nodes()
    c = s.counters
    tiers: dict[str, dict[str, int]] = {}
    for seg in segments:
        t = tiers.setdefault(seg.tier, {"size_bytes": 0, "used_bytes": 0, "objects": 0})
        t["size_bytes"] += seg.size_bytes
        t["used_bytes"] += seg.used_bytes
        t["objects"] += seg.objects
    data = {
        "objects": s.objects,
        "pending_puts": s.processing,
        "stored_bytes": s.bytes_stored,
        "nodes": s.nodes,
        "get_hit_rate": hit_rate(c.get("get_hits", 0), c.get("get_misses", 0)),
        "prefix_hit_rate": hit_rate(c.get("prefix_hit_blocks", 0), c.get("prefix_miss_blocks", 0)),
        "tiers": {
            name: {**t, "fill": t["used_bytes"] / t["size_bytes"] if t["size_bytes"] else 0.0}
            for name, t in sorted(tiers.items())
        },
        "counters": dict(sorted(c.items())),
    }

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{100 * value:.1f}%"

    lines = [
        f"objects {s.objects} ({format_size(s.bytes_stored)}), pending puts {s.processing}, "
        f"nodes {s.nodes}",
        f"get hit rate {rate(data['get_hit_rate'])} ({c.get('get_hits', 0)} hits, "  # type: ignore[arg-type]
        f"{c.get('get_misses', 0)} misses); prefix hit rate {rate(data['prefix_hit_rate'])} "  # type: ignore[arg-type]
        f"({c.get('prefix_hit_blocks', 0)} of "
        f"{c.get('prefix_hit_blocks', 0) + c.get('prefix_miss_blocks', 0)} blocks)",
        "",
        table(["TIER", "SIZE", "USED", "FILL", "OBJECTS"], [
            (name, format_size(t["size_bytes"]), format_size(t["used_bytes"]),
             f"{100 * t['fill']:.1f}%", t["objects"])
            for name, t in data["tiers"].items()  # type: ignore[attr-defined]
        ]) if tiers else "no tiers mounted",
        "",
        table(["EVENT", "COUNT"], [(k, v) for k, v in sorted(c.items()) if v]),
    ]  # fmt: skip
    emit(as_json, data, "\n".join(lines))


@click.command()
@master_option
@click.option("--prefix", required=True, help="Remove every key that starts with this.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@json_option
def remove(master: str, prefix: str, yes: bool, as_json: bool) -> None:
    """Remove every object whose key starts with --prefix (pages through the keys)."""
    from mooncake_store.admin.keys import iter_keys

    if not prefix:
        raise click.UsageError("--prefix must not be empty (it would remove every key)")
    with connect(master) as client:
        keys = list(iter_keys(client, prefix, limit=None))
        if not keys:
            emit(as_json, {"prefix": prefix, "removed": 0}, f"no keys start with {prefix!r}")
            return
        if not yes and not as_json:
            click.confirm(f"remove {len(keys)} keys starting with {prefix!r}?", abort=True)
        removed = 0
        for start in range(0, len(keys), 512):
            removed += sum(client.remove_many(keys[start : start + 512]))
    emit(as_json, {"prefix": prefix, "removed": removed},
         f"removed {removed} keys starting with {prefix!r}")  # fmt: skip


@click.command()
@master_option
@click.argument("node_id")
@click.option("--timeout", "timeout_s", default=300.0, show_default=True,
              help="Seconds to wait for the drain.")  # fmt: skip
@json_option
def drain(master: str, node_id: str, timeout_s: float, as_json: bool) -> None:
    """Move NODE_ID's single-copy blocks to other nodes before it is taken down."""
    from mooncake_store.admin.drain import drain_node

    with connect(master) as client:
        result = drain_node(client, node_id, timeout_s)
    emit(as_json, result, f"drained {node_id}: {result}")
