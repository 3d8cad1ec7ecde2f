"""A leaked token revoked on its own (`mooncake-admin token revoke`): refused from then on on
every entry point (its open framed connection, a new connection, gRPC) and after a master
restart, while the other tokens of its tenant keep working; listed until it would have expired.
Tokens are made and revoked the way an operator does, with the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.admin.cli import main as admin
from mooncake_store.client.sync_client import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.auth import parse_claims
from mooncake_store.common.credentials import local_token_path
from mooncake_store.common.errors import AccessDeniedError
from tests.conftest import FAST_MASTER, wait_until
from tests.integration.test_security import bearer_md, create_token, stub


def cli(*args: str) -> str:
    result = CliRunner().invoke(admin, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_a_revoked_token_is_refused_everywhere_and_the_tenants_others_keep_working(
    tmp_path: Path,
) -> None:
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        leaked = create_token(cluster, "--role", "client", "--tenant", "alpha", "--ttl", "1d")
        kept = create_token(cluster, "--role", "client", "--tenant", "alpha")
        leaked_id = parse_claims(leaked).token_id
        address = cluster.master_address
        with Client(address, token=leaked) as thief, Client(address, token=kept) as owner:
            owner.put("block", b"tenant alpha's bytes")
            assert thief.get("block") == b"tenant alpha's bytes"  # before: same tenant
            said = cli("token", "revoke", leaked, "--master", address)
            assert f"token {leaked_id} revoked" in said and "0 connections" not in said
            for call in (lambda: thief.get("block"), lambda: thief.put("new", b"x"),
                         lambda: thief.remove("block")):  # fmt: skip
                with pytest.raises(AccessDeniedError, match="revoked"):
                    call()
            assert owner.get("block") == b"tenant alpha's bytes"
            assert not owner.exists("new")
        with pytest.raises(AccessDeniedError, match="revoked"):  # a new connection
            with Client(address, token=leaked) as again:
                again.exists("block")
        channel, master = stub(cluster)
        with channel:
            with pytest.raises(grpc.RpcError) as info:
                master.BatchExists(pb.KeysRequest(keys=["block"]), timeout=5,
                                   metadata=bearer_md(leaked))  # fmt: skip
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "revoked" in info.value.details()
        assert "was revoked already" in cli("token", "revoke", leaked_id, "--master", address)
        [listed] = json.loads(cli("token", "revoked", "--master", address, "--json"))
        # By the token itself first: kept until the token's own expiry, not forever.
        assert listed["token_id"] == leaked_id
        assert listed["expires_s"] == parse_claims(leaked).expires_s

        cluster.master.stop()
        cluster.start_master()
        cluster.wait_for_nodes(1)
        with pytest.raises(AccessDeniedError, match="revoked"):
            with Client(address, token=leaked) as after:
                after.exists("block")
        with Client(address, token=kept) as owner:
            assert owner.get("block") == b"tenant alpha's bytes"


def test_only_an_admin_revokes_and_a_token_revoked_by_id_is_kept(tmp_path: Path) -> None:
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        client_token = create_token(cluster, "--role", "client")
        victim = create_token(cluster, "--role", "client", "--tenant", "beta")
        victim_id = parse_claims(victim).token_id
        channel, master = stub(cluster)
        with channel:
            request = pb.RevokeTokenRequest(token_id=victim_id)
            with pytest.raises(grpc.RpcError) as info:
                master.RevokeToken(request, timeout=5, metadata=bearer_md(client_token))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(grpc.RpcError):
                master.ListRevokedTokens(pb.ListRevokedTokensRequest(), timeout=5,
                                         metadata=bearer_md(client_token))  # fmt: skip
        with Client(cluster.master_address, token=victim) as beta:
            beta.put("b", b"still mine")  # the refused revoke did nothing
        print(cli("token", "inspect", victim))
        assert victim_id in cli("token", "inspect", victim)
        cli("token", "revoke", victim_id, "--master", cluster.master_address)
        [listed] = json.loads(cli("token", "revoked", "--master", cluster.master_address, "--json"))
        assert listed == {**listed, "token_id": victim_id, "expires_s": 0}  # id only: kept
        bad = CliRunner().invoke(admin, ["token", "revoke", "not an id!", "--master",
                                         cluster.master_address])  # fmt: skip
        assert bad.exit_code != 0 and "token id" in bad.output


def test_a_revoked_node_token_stops_its_nodes_heartbeats(tmp_path: Path) -> None:
    """The nodes run with the master's local node token: revoked, their heartbeats are refused
    and they are dropped as any node that stops heartbeating is."""
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        node_token = json.loads(local_token_path(cluster.master_port).read_text())["node"]
        kept = create_token(cluster, "--role", "client")
        with Client(cluster.master_address, token=kept) as client:
            assert [n.state for n in client.list_nodes()] == ["valid"]
            cli("token", "revoke", node_token, "--master", cluster.master_address)
            wait_until(lambda: not client.list_nodes(), timeout_s=30, what="the node dropped")
