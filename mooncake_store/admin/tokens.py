"""`mooncake-admin token ...`: issue signed tokens from the master's cluster key."""

from __future__ import annotations

import click

from mooncake_store.common.auth import Role, TokenAuthority, bearer, read_cluster_key
from mooncake_store.common.credentials import discover_token
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError
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
    "--ttl",
    default=None,
    help="Lifetime, e.g. 12h, 30d; 0 never expires  [default: 30d; node tokens: 0, since a "
    "node whose token expired is dropped with the blocks only it holds].",
)
@click.option(
    "--node-id",
    default="",
    help="Node tokens: the --node-id the node runs with ('*': any id) [default: none].",
)
@click.option(
    "--data-dir",
    default=MasterConfig.data_dir,
    show_default=True,
    help="The master's data directory, which holds the cluster key (run on the master's host).",
)
@click.option(
    "--master",
    default=None,
    help="Ask this running master (host:port) instead, with an admin token from "
    "MOONCAKE_TOKEN(_FILE) or, on its host, its local token file [default: none: use "
    "--data-dir].",
)
def create(
    role: str, tenant: str, ttl: str | None, node_id: str, data_dir: str, master: str | None
) -> None:
    """Print a new signed token (keep it secret: it is the holder's credential).

    Example: mooncake-admin token create --role client --tenant team-a --ttl 30d
    """
    try:
        ttl_s = parse_duration(ttl if ttl is not None else "0" if role == "node" else "30d")
        if master:
            click.echo(_remote(master, role, tenant, ttl_s, node_id))
            return
        authority = TokenAuthority(read_cluster_key(data_dir))
        click.echo(authority.issue(Role(role), tenant, ttl_s=ttl_s, node_id=node_id))
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    except AccessDeniedError as exc:
        raise click.ClickException(str(exc)) from exc


def _remote(master: str, role: str, tenant: str, ttl_s: float, node_id: str) -> str:
    import grpc

    from mooncake_store._proto import mooncake_store_pb2 as pb
    from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
    from mooncake_store.common.tls import TlsConfig

    token = discover_token(master, Role.ADMIN)
    if not token:
        raise AccessDeniedError(
            f"no admin token for {master}: set MOONCAKE_TOKEN to one, or run this on the "
            "master's host with --data-dir instead of --master"
        )
    request = pb.CreateTokenRequest(role=role, tenant=tenant, ttl_s=ttl_s, node_id=node_id)
    tls = TlsConfig.from_env()  # MOONCAKE_TLS_CA / _CERT / _KEY, as clients
    channel = (
        grpc.secure_channel(master, tls.grpc_channel_credentials())
        if tls.enabled
        else grpc.insecure_channel(master)
    )
    with channel:
        try:
            reply = pb_grpc.MasterServiceStub(channel).CreateToken(
                request, timeout=10, metadata=[("authorization", f"Bearer {bearer(token)}")]
            )
        except grpc.RpcError as exc:
            raise AccessDeniedError(f"master {master}: {exc.details()}") from None  # type: ignore[attr-defined]
    if reply.status.code != 0:
        raise InvalidArgumentError(reply.status.message)
    return reply.token
