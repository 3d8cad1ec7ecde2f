"""`mooncake-admin token ...`: issue signed tokens from the master's cluster key."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from mooncake_store.common.auth import (
    Role,
    TokenAuthority,
    bearer,
    parse_claims,
    read_cluster_key,
)
from mooncake_store.common.credentials import discover_token
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError
from mooncake_store.common.units import parse_duration
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.revocations import validate_token_id


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
    from mooncake_store._proto import mooncake_store_pb2 as pb

    request = pb.CreateTokenRequest(role=role, tenant=tenant, ttl_s=ttl_s, node_id=node_id)
    return str(_admin_call(master, "CreateToken", request).token)


def _admin_call(master: str, method: str, request: Any) -> Any:
    """An admin-only MasterService call on `master`, with this host's admin token."""
    import grpc

    from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
    from mooncake_store.common.tls import TlsConfig

    token = discover_token(master, Role.ADMIN)
    if not token:
        raise AccessDeniedError(
            f"no admin token for {master}: set MOONCAKE_TOKEN to one, or run this on the "
            "master's host (its local token file)"
        )
    tls = TlsConfig.from_env()  # MOONCAKE_TLS_CA / _CERT / _KEY, as clients
    channel = (
        grpc.secure_channel(master, tls.grpc_channel_credentials())
        if tls.enabled
        else grpc.insecure_channel(master)
    )
    with channel:
        try:
            reply = getattr(pb_grpc.MasterServiceStub(channel), method)(
                request, timeout=10, metadata=[("authorization", f"Bearer {bearer(token)}")]
            )
        except grpc.RpcError as exc:
            raise AccessDeniedError(f"master {master}: {exc.details()}") from None  # type: ignore[attr-defined]
    if reply.status.code != 0:
        raise InvalidArgumentError(reply.status.message)
    return reply


@token.command("revoke")
@click.argument("token_or_id")
@click.option(
    "--master",
    required=True,
    help="The running master (host:port); an admin token from MOONCAKE_TOKEN(_FILE) or, on "
    "its host, its local token file.",
)
def revoke(token_or_id: str, master: str) -> None:
    """Revoke one token: the master refuses it from now on, on every call, and closes the
    connections that use it.  Give the token itself (the master verifies it, and drops the
    record once the token has expired) or its id (`token inspect`; the record is then kept
    until the cluster key is rotated).

    Example: mooncake-admin token revoke mc1.eyJ...  --master 10.0.0.5:50051
    """
    from mooncake_store._proto import mooncake_store_pb2 as pb

    try:
        if "." in token_or_id:
            request = pb.RevokeTokenRequest(token=bearer(token_or_id))
            token_id = parse_claims(token_or_id).token_id
        else:
            token_id = validate_token_id(token_or_id.strip())
            request = pb.RevokeTokenRequest(token_id=token_id)
        reply = _admin_call(master, "RevokeToken", request)
    except InvalidArgumentError as exc:
        raise click.UsageError(str(exc)) from exc
    except AccessDeniedError as exc:
        raise click.ClickException(str(exc)) from exc
    said = "was revoked already" if reply.already_revoked else "revoked"
    dropped = ", ".join(reply.node_ids_dropped) or "none"
    click.echo(
        f"token {token_id} {said}; {reply.connections_closed} connections closed; "
        f"nodes dropped: {dropped}"
    )


@token.command("revoked")
@click.option("--master", required=True, help="The running master (host:port).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def revoked(master: str, as_json: bool) -> None:
    """List the revoked tokens the master refuses (until each would have expired)."""
    from mooncake_store._proto import mooncake_store_pb2 as pb

    try:
        reply = _admin_call(master, "ListRevokedTokens", pb.ListRevokedTokensRequest())
    except (InvalidArgumentError, AccessDeniedError) as exc:
        raise click.ClickException(str(exc)) from exc
    rows = [
        {"token_id": t.token_id, "expires_s": t.expires_s, "revoked_s": round(t.revoked_s, 3)}
        for t in reply.tokens
    ]
    if as_json:
        click.echo(json.dumps(rows))
        return
    for row in rows:
        expires = "never" if not row["expires_s"] else _when(row["expires_s"])
        click.echo(f"{row['token_id']}  revoked {_when(row['revoked_s'])}  expires {expires}")
    click.echo(f"{len(rows)} revoked tokens")


@token.command("inspect")
@click.argument("token_value")
def inspect(token_value: str) -> None:
    """Print what a token says (role, tenant, id, expiry), NOT verified: anyone can read
    a token's claims; only the master can tell a genuine one."""
    try:
        claims = parse_claims(token_value)
    except AccessDeniedError as exc:
        raise click.UsageError(str(exc)) from exc
    expires = "never" if not claims.expires_s else _when(claims.expires_s)
    node = f" node {claims.node_id}" if claims.node_id else ""
    click.echo(
        f"id {claims.token_id}  role {claims.role.value}  tenant {claims.tenant}{node}  "
        f"expires {expires}"
    )


def _when(unix_s: float) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(unix_s))
    except (OverflowError, OSError, ValueError):
        return f"{unix_s:.0f} (Unix seconds)"
