"""A leaked token revoked on its own (`mooncake-admin token revoke`): refused from then on on
every entry point (its open framed connection, a new connection, gRPC) and after a master
restart, while the other tokens of its tenant keep working; listed until it would have expired.
Tokens are made and revoked the way an operator does, with the CLI."""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import threading
import time
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.cli import main as admin
from mooncake_store.client.sync_client import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.auth import (
    SIGNATURE_METADATA,
    bearer,
    node_proof_key,
    parse_claims,
    sign_request,
)
from mooncake_store.common.credentials import local_token_path
from mooncake_store.common.errors import OK, AccessDeniedError, MooncakeError
from mooncake_store.common.framed import HEADER
from mooncake_store.master import service_nodes
from tests.conftest import FAST_MASTER, wait_until
from tests.integration.test_generation_rollback import node_secret_of
from tests.integration.test_security import _frame, bearer_md, create_token, stub


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


def test_a_revoked_node_token_drops_its_nodes_at_once(tmp_path: Path) -> None:
    """The nodes run with the master's local node token: revoked, they are dropped at the
    master's next tick (not a heartbeat TTL later: 60 s here), so no put goes to them; their
    heartbeats are refused from then on, so they cannot come back with it."""
    slow_to_suspect = [*FAST_MASTER, "--heartbeat-ttl", "60s"]
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=slow_to_suspect) as cluster:
        node_token = json.loads(local_token_path(cluster.master_port).read_text())["node"]
        kept = create_token(cluster, "--role", "client")
        with Client(cluster.master_address, token=kept) as client:
            client.put("before", b"x" * 4096)
            assert [n.state for n in client.list_nodes()] == ["valid"]
            said = cli("token", "revoke", node_token, "--master", cluster.master_address)
            assert "nodes dropped: node-0" in said
            wait_until(lambda: not client.list_nodes(), timeout_s=5, what="the node dropped")
            assert not client.exists("before")  # only that node held it
            with pytest.raises(MooncakeError):
                client.put("after", b"y" * 4096)
            time.sleep(1.0)  # heartbeats keep coming: refused, the node stays dropped
            assert not client.list_nodes()


def works(address: str, token: str) -> bool:
    try:
        with Client(address, token=token) as client:
            client.exists("probe")
        return True
    except AccessDeniedError:
        return False


def test_a_revocation_whose_record_failed_is_written_by_its_retry(tmp_path: Path) -> None:
    """The write fails: refused here at once, and said to be not durable; the retry the error
    asks for writes it, so that a restarted master still refuses the token."""
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        leaked = create_token(cluster, "--role", "client", "--ttl", "1d")
        address = cluster.master_address
        store = cluster.master.server._servicer.store
        real_write, failures = store.write, [OSError("disk full (injected)")]

        async def flaky_write(*args, **kwargs):  # type: ignore[no-untyped-def]
            if kwargs.get("revoked") and failures:
                raise failures.pop()
            return await real_write(*args, **kwargs)

        store.write = flaky_write
        first = CliRunner().invoke(admin, ["token", "revoke", leaked, "--master", address])
        assert first.exit_code != 0 and "could not be recorded" in first.output
        assert not works(address, leaked)
        assert "revoked;" in cli("token", "revoke", leaked, "--master", address)
        store.write = real_write
        cluster.master.stop()
        cluster.start_master()
        cluster.wait_for_nodes(1)
        assert not works(address, leaked)


def test_an_admin_revoking_its_own_leaked_token_is_told_it_worked(tmp_path: Path) -> None:
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        mine = create_token(cluster, "--role", "admin", "--ttl", "1d")
        address = cluster.master_address
        said = CliRunner().invoke(admin, ["token", "revoke", mine, "--master", address],
                                  env={"MOONCAKE_TOKEN": mine})  # fmt: skip
        assert said.exit_code == 0 and "revoked" in said.output, said.output
        assert not works(address, mine)


def test_a_tampered_copy_revokes_nothing_and_an_id_is_kept_whatever_expiry_is_claimed(
    tmp_path: Path,
) -> None:
    """The master verifies a token it is given and takes its expiry from it: a copy of a
    leaked token whose payload claims it expires in 2 s (the mac no longer matches) is refused
    ("nothing revoked"), rather than revoked for 2 s.  By id, the record is kept for good."""
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        leaked = create_token(cluster, "--role", "client", "--ttl", "365d")
        head, body, mac = leaked.split(".")
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        payload["x"] = int(time.time()) + 2
        claimed = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        tampered = f"{head}.{base64.urlsafe_b64encode(claimed).rstrip(b'=').decode()}.{mac}"
        address = cluster.master_address
        said = CliRunner().invoke(admin, ["token", "revoke", tampered, "--master", address])
        assert said.exit_code != 0 and "nothing revoked" in said.output, said.output
        assert works(address, leaked)  # and the operator was told so
        cli("token", "revoke", parse_claims(leaked).token_id, "--master", address)
        time.sleep(3)  # past the claimed expiry: several ticks
        assert not works(address, leaked)
        [listed] = json.loads(cli("token", "revoked", "--master", address, "--json"))
        assert listed["expires_s"] == 0


def test_the_pending_puts_of_a_revoked_framed_connection_end_with_it(tmp_path: Path) -> None:
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        leaked = create_token(cluster, "--role", "client", "--ttl", "1d")
        channel, master = stub(cluster)
        with channel:
            hello = master.Hello(pb.HelloRequest(), timeout=5, metadata=bearer_md(leaked))
        table = cluster.master.server.table
        with socket.create_connection(("127.0.0.1", hello.framed_port), timeout=5) as sock:
            auth = pb.AuthenticateRequest(token=bearer(leaked)).SerializeToString()
            sock.sendall(_frame("Authenticate", auth, 1))
            length, _, status = HEADER.unpack(sock.recv(HEADER.size, socket.MSG_WAITALL))
            sock.recv(length, socket.MSG_WAITALL)
            assert status == 0
            item = pb.PutStartItem(key="pending-framed", size_bytes=4096)
            start = pb.BatchPutStartRequest(items=[item]).SerializeToString()
            sock.sendall(_frame("BatchPutStart", start, 2))
            length, _, status = HEADER.unpack(sock.recv(HEADER.size, socket.MSG_WAITALL))
            reply = pb.BatchPutStartResponse.FromString(sock.recv(length, socket.MSG_WAITALL))
            assert status == 0 and reply.results[0].status.code == 0
            assert "pending-framed" in table._pending
            said = cli("token", "revoke", leaked, "--master", cluster.master_address)
            assert "1 connections closed" in said
            wait_until(lambda: "pending-framed" not in table._pending, timeout_s=5,
                       what="the connection's pending put revoked")  # fmt: skip


def _signed(token: str, node_id: str, incarnation: int, method: str, request) -> list:
    key = node_proof_key(node_secret_of(token), node_id, incarnation)
    body = request.SerializeToString(deterministic=True)
    return [("authorization", f"Bearer {bearer(token)}"),
            (SIGNATURE_METADATA, sign_request(key, method, body, time.time()))]  # fmt: skip


def _mount(stub, token: str, node_id: str, incarnation: int, endpoint: str, segments=()):
    request = pb.MountSegmentRequest(
        node_id=node_id, incarnation=incarnation, endpoint=endpoint,
        control_endpoint=endpoint, segments=list(segments),
    )  # fmt: skip
    metadata = _signed(token, node_id, incarnation, "MountSegment", request)
    return stub.MountSegment(request, timeout=10, metadata=metadata)


def test_a_revocation_names_only_mounted_nodes_and_catches_a_mount_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node that unmounted is not named (nor dropped again); a mount whose token is revoked
    while the mount waits (here its probe of the old incarnation's endpoint) is refused, not
    mounted for a heartbeat TTL: the incarnation it would have replaced stays."""
    args = [*FAST_MASTER, "--heartbeat-ttl", "60s"]
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as cluster:
        address = cluster.master_address
        kept = create_token(cluster, "--role", "client")
        with grpc.insecure_channel(address) as channel, Client(address, token=kept) as client:
            master = pb_grpc.MasterServiceStub(channel)
            gone = create_token(cluster, "--role", "node", "--node-id", "gone")
            assert _mount(master, gone, "gone", 5, "127.0.0.1:1").status.code == OK
            request = pb.UnmountSegmentRequest(node_id="gone", incarnation=5)
            signed = _signed(gone, "gone", 5, "UnmountSegment", request)
            master.UnmountSegment(request, timeout=5, metadata=signed)
            assert "nodes dropped: none" in cli("token", "revoke", gone, "--master", address)

            segments = [pb.SegmentSpec(segment_id=0xBEEF, tier="DRAM", size_bytes=1 << 20)]
            first = create_token(cluster, "--role", "node", "--node-id", "racer")
            second = create_token(cluster, "--role", "node", "--node-id", "racer")
            assert _mount(master, first, "racer", 1, "127.0.0.1:1", segments).status.code == OK

            async def slow_probe(endpoint: str, timeout_s: float = 1.0) -> bool:
                await asyncio.sleep(0.5)  # the old incarnation's endpoint is slow to refuse
                return False

            monkeypatch.setattr(service_nodes, "_listening", slow_probe)
            replies: list = []
            mounting = threading.Thread(target=lambda: replies.append(
                _mount(master, second, "racer", 2, "127.0.0.1:2", segments)))  # fmt: skip
            mounting.start()
            time.sleep(0.2)
            cli("token", "revoke", second, "--master", address)
            mounting.join()
            [reply] = replies
            assert reply.status.code == AccessDeniedError.code
            assert "revoked" in reply.status.message
            time.sleep(0.5)  # two ticks
            racers = [n.endpoint for n in client.list_nodes() if n.node_id == "racer"]
            assert racers == ["127.0.0.1:1"]  # the first incarnation, its token not revoked
