"""`mooncake-admin token ...`: issue signed tokens from the master's cluster key."""

from __future__ import annotations

import click

from mooncake_store.common.auth import Role, TokenAuthority, read_cluster_key
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.units import parse_duration
from mooncake_store.master.config import MasterConfig


@click.group()
def token() -> None:
    """Issue credentials for clients, nodes and admins."""


@token.command("create")
@click.option(
    "--role",
    type=click.Choice([r.value for r in Role]),
    required=True,
    help="client: data calls in its tenant; node: mount/heartbeat as --node-id; admin: all.",
)
@click.option(
    "--tenant",
    default="default",
    show_default=True,
    help="Key namespace of the holder (clients of other tenants never see its keys).",
)
@click.option(
    "--ttl", default="30d", show_default=True, help="Lifetime, e.g. 12h, 30d; 0 never expires."
)
@click.option("--node-id", default="", help="Node tokens: the --node-id the node runs with.")
@click.option(
    "--data-dir",
    default=MasterConfig.data_dir,
    show_default=True,
    help="The master's data directory, which holds the cluster key (run on the master's host).",
)
def create(role: str, tenant: str, ttl: str, node_id: str, data_dir: str) -> None:
    """Print a new signed token (keep it secret: it is the holder's credential).

    Example: mooncake-admin token create --role client --tenant team-a --ttl 30d
    """
    try:
        ttl_s = parse_duration(ttl)
        authority = TokenAuthority(read_cluster_key(data_dir))
        click.echo(authority.issue(Role(role), tenant, ttl_s=ttl_s, node_id=node_id))
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
