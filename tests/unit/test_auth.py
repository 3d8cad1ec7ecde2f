"""Tokens and key derivation (common/auth.py) and `mooncake-admin token create`."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from mooncake_store.admin.cli import main as admin
from mooncake_store.common.auth import (
    ANY_NODE,
    CLUSTER_KEY_FILE,
    Role,
    TokenAuthority,
    bearer,
    grant_key,
    load_or_create_cluster_key,
    node_secret_of,
    parse_claims,
    read_cluster_key,
)
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_cluster_key_is_created_once_with_mode_0600(tmp_path: Path) -> None:
    key = load_or_create_cluster_key(tmp_path)
    assert len(key) == 32
    assert os.stat(tmp_path / CLUSTER_KEY_FILE).st_mode & 0o777 == 0o600
    assert load_or_create_cluster_key(tmp_path) == key  # the second start reads the same key
    os.chmod(tmp_path / CLUSTER_KEY_FILE, 0o644)
    with pytest.raises(InvalidArgumentError, match="chmod 600"):
        read_cluster_key(tmp_path)
    with pytest.raises(InvalidArgumentError, match="no cluster key"):
        read_cluster_key(tmp_path / "elsewhere")


def test_token_round_trip_expiry_and_forgery() -> None:
    clock = Clock()
    authority = TokenAuthority(b"k" * 32, clock=clock)
    token = authority.issue(Role.CLIENT, "team-a", ttl_s=60)
    claims = authority.verify(token)
    assert (claims.role, claims.tenant, claims.node_id) == (Role.CLIENT, "team-a", "")
    assert claims.expires_s == int(clock.now + 60)
    # Another cluster's key, a changed payload, a truncated mac: all refused, saying what to do.
    with pytest.raises(AccessDeniedError, match="mooncake-admin token create"):
        TokenAuthority(b"x" * 32).verify(token)
    version, body, mac = token.split(".")
    other = authority.issue(Role.ADMIN, "team-a").split(".")[1]
    with pytest.raises(AccessDeniedError, match="not signed"):
        authority.verify(f"{version}.{other}.{mac}")
    with pytest.raises(AccessDeniedError):
        authority.verify(f"{version}.{body}.{mac[:-4]}")
    for junk in ("", "mc1", "mc2.a.b", "mc1.!!.??", "x" * 5000):
        with pytest.raises(AccessDeniedError):
            authority.verify(junk)
    clock.now += 61
    with pytest.raises(AccessDeniedError, match="expired"):
        authority.verify(token)


def test_node_token_carries_a_secret_that_the_bearer_part_does_not() -> None:
    authority = TokenAuthority(b"k" * 32)
    token = authority.issue(Role.NODE, "default", node_id="node-1")
    claims = authority.verify(bearer(token))
    assert claims.may_act_as_node("node-1") and not claims.may_act_as_node("node-2")
    secret = node_secret_of(token)
    assert secret == authority.node_secret("node-1", claims.token_id)
    assert secret.hex() not in bearer(token) and bearer(token).count(".") == 2
    with pytest.raises(AccessDeniedError, match="node token"):
        node_secret_of(bearer(token))
    # Grant keys differ per node id and per incarnation.
    assert grant_key(secret, "node-1", 1) != grant_key(secret, "node-1", 2)
    assert grant_key(secret, "node-1", 1) != grant_key(secret, "node-2", 1)
    wildcard = parse_claims(authority.issue(Role.NODE, "default", node_id=ANY_NODE))
    assert wildcard.may_act_as_node("anything")
    with pytest.raises(InvalidArgumentError, match="node-id"):
        authority.issue(Role.NODE, "default")
    with pytest.raises(InvalidArgumentError, match="tenant"):
        authority.issue(Role.CLIENT, "no spaces")


def test_admin_token_create_prints_a_token_the_master_key_verifies(tmp_path: Path) -> None:
    key = load_or_create_cluster_key(tmp_path)
    runner = CliRunner()
    result = runner.invoke(
        admin,
        ["token", "create", "--role", "client", "--tenant", "t1", "--ttl", "30d",
         "--data-dir", str(tmp_path)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    claims = TokenAuthority(key).verify(result.output.strip())
    assert (claims.role, claims.tenant) == (Role.CLIENT, "t1")
    # Without --ttl: clients 30 days; nodes never expire (an expired node token gets the node
    # dropped with every block only it held: x1's probe, a clock 31 days on emptied the cluster)
    for role, extra, lives in (("client", [], 30 * 86400), ("node", ["--node-id", "n"], 0)):
        made = runner.invoke(admin, ["token", "create", "--role", role, *extra,
                                     "--data-dir", str(tmp_path)])  # fmt: skip
        assert made.exit_code == 0, made.output
        expires = TokenAuthority(key).verify(made.output.strip()).expires_s
        assert (expires - int(time.time()) if lives else expires) == pytest.approx(lives, abs=5)
    missing = runner.invoke(admin, ["token", "create", "--role", "client",
                                    "--data-dir", str(tmp_path / "none")])  # fmt: skip
    assert missing.exit_code == 2 and "no cluster key" in missing.output


def test_every_master_method_says_how_it_names_keys() -> None:
    """A method added to MasterService must join tenancy's REQUEST_KEYS or KEYLESS, so no
    key-addressed call can bypass the tenant namespaces."""
    from mooncake_store._proto import mooncake_store_pb2 as pb
    from mooncake_store.master.tenancy import KEYLESS, REQUEST_KEYS

    methods = set(pb.DESCRIPTOR.services_by_name["MasterService"].methods_by_name)
    assert methods == set(REQUEST_KEYS) | KEYLESS, methods ^ (set(REQUEST_KEYS) | KEYLESS)
    assert not set(REQUEST_KEYS) & KEYLESS


def test_callers_of_a_tenant_name_only_their_own_stored_keys() -> None:
    from mooncake_store.common.errors import InvalidKeyError
    from mooncake_store.master.access import DEFAULT_TENANT, Caller

    team = Caller(Role.CLIENT, "team-a")
    default = Caller(Role.CLIENT, DEFAULT_TENANT)
    assert team.internal("k") == "team-a\0k" and default.internal("k") == "k"
    assert team.external("team-a\0k") == "k" and team.external("other\0k") == ""
    assert default.owns("k") and not default.owns("team-a\0k") and not team.owns("k")
    for caller in (team, default):
        with pytest.raises(InvalidKeyError, match="NUL"):
            caller.internal("team-b\0k")


def test_control_requests_need_a_fresh_unreplayed_master_signature() -> None:
    from mooncake_store.common.auth import RequestVerifier, sign_request

    clock = Clock()
    key, body = b"c" * 32, b"release 1 [0]"
    verifier = RequestVerifier(key, clock=clock)
    first = sign_request(key, "Release", body, clock.now)
    verifier.verify("Release", body, first)
    verifier.verify("Release", body, sign_request(key, "Release", body, clock.now))  # same ms
    with pytest.raises(AccessDeniedError, match="replayed"):
        verifier.verify("Release", body, first)
    for method, data, signature in (
        ("Move", body, sign_request(key, "Release", body, clock.now)),  # another method
        ("Release", body + b"!", sign_request(key, "Release", body, clock.now)),  # changed
        ("Release", body, sign_request(b"x" * 32, "Release", body, clock.now)),  # another key
        ("Release", body, ""),
    ):
        with pytest.raises(AccessDeniedError, match="signed by this node's master"):
            verifier.verify(method, data, signature)
    with pytest.raises(AccessDeniedError, match="off the master's clock"):
        verifier.verify("Release", body, sign_request(key, "Release", body, clock.now - 120))


def test_auth_off_is_refused_with_a_non_loopback_bind(tmp_path: Path, monkeypatch) -> None:
    from mooncake_store.master.config import MasterConfig
    from mooncake_store.node.config import NodeConfig, resolve_node_token

    assert MasterConfig(host="127.0.0.1", auth="off").auth == "off"
    with pytest.raises(InvalidArgumentError, match="--auth off"):
        MasterConfig(host="0.0.0.0", auth="off")
    assert MasterConfig(host="0.0.0.0").auth == "on"  # the default
    # A node on a non-loopback address without a token is refused at start, with what to do.
    for var in ("MOONCAKE_TOKEN", "MOONCAKE_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("MOONCAKE_TOKEN_DIR", str(tmp_path))  # no local token file there
    with pytest.raises(InvalidArgumentError, match="needs a node token"):
        resolve_node_token(NodeConfig(host="10.1.2.3", advertise_host="10.1.2.3"))
    assert resolve_node_token(NodeConfig()) == ""  # loopback: a lab with --auth off
