"""Issue 12's attacks, each refused with the documented error while a legitimate client of the
same tenant keeps working.  Tokens are obtained the way users get them: `mooncake-admin token
create` against the master's data directory, and the master's local token file."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from click.testing import CliRunner

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.cli import main as admin
from mooncake_store.client.sync_client import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.auth import bearer, grant_key, node_secret_of, parse_claims
from mooncake_store.common.credentials import local_token_path
from mooncake_store.common.errors import AccessDeniedError, ObjectConflictError
from mooncake_store.common.framed import HEADER, METHOD_IDS, FrameStatus
from mooncake_store.common.grant import GrantMode, sign
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER, wait_until


def create_token(cluster: InProcessCluster, *args: str) -> str:
    result = CliRunner().invoke(
        admin, ["token", "create", *args, "--data-dir", str(cluster.data_dir)]
    )
    assert result.exit_code == 0, result.output
    return result.output.strip()


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    root = tmp_path_factory.mktemp("secure")
    with InProcessCluster(root, nodes=2, dram="32MiB", master_args=FAST_MASTER) as c:
        yield c


@pytest.fixture(scope="module")
def victim(secure: InProcessCluster) -> Iterator[Client]:
    """A legitimate client of tenant `alpha`."""
    token = create_token(secure, "--role", "client", "--tenant", "alpha")
    with Client(secure.master_address, token=token) as client:
        yield client


def stub(cluster: InProcessCluster) -> tuple[grpc.Channel, pb_grpc.MasterServiceStub]:
    channel = grpc.insecure_channel(cluster.master_address)
    return channel, pb_grpc.MasterServiceStub(channel)


def bearer_md(token: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {bearer(token)}")]


def still_works(client: Client, key: str, value: bytes) -> None:
    assert client.get(key) == value
    client.put(f"{key}-again", value)
    assert client.get(f"{key}-again") == value


def test_no_token_is_refused_on_grpc_and_framed_with_how_to_get_one(
    secure: InProcessCluster, victim: Client
) -> None:
    victim.put("k-anon", b"victim bytes")
    channel, master = stub(secure)
    with channel:
        for call in (
            lambda: master.BatchRemove(pb.KeysRequest(keys=["k-anon"]), timeout=5),
            lambda: master.Hello(pb.HelloRequest(), timeout=5),
        ):
            with pytest.raises(grpc.RpcError) as info:
                call()
            assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "mooncake-admin token create" in info.value.details()
        forged = "mc1.eyJyIjoiYWRtaW4ifQ.AAAA"
        with pytest.raises(grpc.RpcError) as info:
            master.BatchRemove(pb.KeysRequest(keys=["k-anon"]), timeout=5,
                               metadata=[("authorization", f"Bearer {forged}")])  # fmt: skip
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        hello = master.Hello(pb.HelloRequest(), timeout=5, metadata=bearer_md(
            create_token(secure, "--role", "client")))  # fmt: skip
    # The framed endpoint: a call before Authenticate is refused and the connection closed.
    with socket.create_connection(("127.0.0.1", hello.framed_port), timeout=5) as sock:
        body = pb.KeysRequest(keys=["k-anon"]).SerializeToString()
        sock.sendall(HEADER.pack(len(body), 1, METHOD_IDS["BatchRemove"]) + body)
        reply = sock.recv(4096)
        _, call_id, status = HEADER.unpack_from(reply)
        assert (call_id, status) == (1, FrameStatus.UNAUTHENTICATED)
        assert b"mooncake-admin token create" in reply[HEADER.size :]
        assert wait_until(lambda: sock.recv(1) == b"", what="the master to close it")
    # A client without a token (none in the environment, none found for this address).
    with pytest.raises(AccessDeniedError, match="mooncake-admin token create"):
        with Client(secure.master_address, token="") as anonymous:
            anonymous.remove("k-anon")
    still_works(victim, "k-anon", b"victim bytes")


def test_another_tenant_can_neither_read_overwrite_remove_nor_prefix_match(
    secure: InProcessCluster, victim: Client
) -> None:
    victim.put_many([("chain-0", b"a0"), ("chain-1", b"a1")])
    token = create_token(secure, "--role", "client", "--tenant", "beta")
    with Client(secure.master_address, token=token) as attacker:
        assert not attacker.exists("chain-0")
        assert attacker.prefix_match(["chain-0", "chain-1"]) == 0
        with pytest.raises(KeyError):
            attacker.get("chain-0")
        assert attacker.remove("chain-0") is False
        # Its own put of the same key lands in its own namespace: not "deduplicated" against
        # alpha's block, and alpha's block is untouched.
        result = attacker.put("chain-1", b"poison")
        assert not result.deduplicated
        assert attacker.get("chain-1") == b"poison"
    # One-round-trip puts into allocation leases are confined the same way.
    with Client(secure.master_address, token=token, leases=True) as leased:
        leased.put("lease-warm", b"b" * 100)
        leased.put("chain-0", b"c" * 100)  # the size put before: it goes into a lease
        assert leased.get("chain-0") == b"c" * 100
    assert victim.get("chain-0") == b"a0" and victim.get("chain-1") == b"a1"
    assert victim.prefix_match(["chain-0", "chain-1"]) == 2
    still_works(victim, "chain-0", b"a0")


def test_cache_poisoning_within_a_tenant_is_reported_not_deduplicated(
    secure: InProcessCluster, victim: Client
) -> None:
    token = create_token(secure, "--role", "client", "--tenant", "alpha")
    with Client(secure.master_address, token=token) as attacker:
        attacker.put("predictable-hash", b"attacker bytes")
    with pytest.raises(ObjectConflictError, match="different value"):
        victim.put("predictable-hash", b"victim bytes")
    assert victim.counters["put_conflicts"] >= 1
    assert victim.put("predictable-hash", b"attacker bytes").deduplicated  # a true duplicate
    still_works(victim, "predictable-hash", b"attacker bytes")


def test_fake_nodes_and_mounts_under_another_id_are_refused(
    secure: InProcessCluster, victim: Client
) -> None:
    victim.put("on-node", b"x" * 1000)
    node_id = secure.nodes[0].node_id
    fake = pb.MountSegmentRequest(
        node_id=node_id, incarnation=7, endpoint="127.0.0.1:1", control_endpoint="127.0.0.1:1",
        secret=b"s" * 32,
        segments=[pb.SegmentSpec(segment_id=99, tier="DRAM", size_bytes=1 << 40)],
    )  # fmt: skip
    client_token = create_token(secure, "--role", "client", "--tenant", "alpha")
    other_node = create_token(secure, "--role", "node", "--node-id", "intruder")
    channel, master = stub(secure)
    with channel:
        with pytest.raises(grpc.RpcError) as info:  # no token at all
            master.MountSegment(fake, timeout=5)
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as info:  # a client token may not mount
            master.MountSegment(fake, timeout=5, metadata=bearer_md(client_token))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # A node token bound to another id: mount, heartbeat and unmount as node-0 refused.
        reply = master.MountSegment(fake, timeout=5, metadata=bearer_md(other_node))
        assert reply.status.code == AccessDeniedError.code
        assert "node token bound to that id" in reply.status.message
        beat = master.Heartbeat(pb.HeartbeatRequest(node_id=node_id, incarnation=7),
                                timeout=5, metadata=bearer_md(other_node))  # fmt: skip
        assert beat.status.code == AccessDeniedError.code
        gone = master.UnmountSegment(pb.UnmountSegmentRequest(node_id=node_id, incarnation=1),
                                     timeout=5, metadata=bearer_md(other_node))  # fmt: skip
        assert gone.code == AccessDeniedError.code
        # A fake 1 TiB node under its own (valid) id still gets no secret from the master:
        # it mounts, but the grants the master signs for it are keyed by its token's secret.
    assert {n.node_id for n in victim.list_nodes()} == {n.node_id for n in secure.nodes}
    still_works(victim, "on-node", b"x" * 1000)


def test_node_control_calls_need_a_master_signature(
    secure: InProcessCluster, victim: Client
) -> None:
    victim.put("moved", b"m" * 4096)
    control = f"127.0.0.1:{secure.nodes[0].control_port}"
    with grpc.insecure_channel(control) as channel:
        node = pb_grpc.NodeServiceStub(channel)
        calls = {
            "Fetch": lambda md: node.Fetch(pb.FetchRequest(tasks=[pb.FetchTask(
                key="x", src_endpoint="127.0.0.1:1", src_offset=0, size_bytes=4096,
                dst_segment=1, dst_offset=0)]), timeout=5, metadata=md),
            "Move": lambda md: node.Move(pb.MoveRequest(tasks=[pb.MoveTask(
                key="x", src_segment=1, dst_segment=2, size_bytes=4096)]), timeout=5,
                metadata=md),
            "Release": lambda md: node.Release(pb.ReleaseRequest(segment_id=1, offsets=[0]),
                                               timeout=5, metadata=md),
            # floor 0 would make every ended write grant of the segment work again
            "FenceWrites": lambda md: node.FenceWrites(pb.FenceWritesRequest(fences=[
                pb.WriteFence(segment_id=1, floor=0)]), timeout=5, metadata=md),
            # a checksum oracle over any extent of the pool
            "Verify": lambda md: node.Verify(pb.VerifyRequest(extents=[pb.VerifyExtent(
                segment_id=1, offset=0, size_bytes=4096, checksum=0)]), timeout=5, metadata=md),
        }  # fmt: skip
        for name, call in calls.items():
            for md in ([], [("x-mooncake-signature", "1700000000000." + "00" * 16)]):
                with pytest.raises(grpc.RpcError) as info:
                    call(md)
                assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert "signed by this node's master" in info.value.details()
    still_works(victim, "moved", b"m" * 4096)


def test_node_data_path_refuses_forged_grants_and_unauthenticated_pings(
    secure: InProcessCluster, victim: Client
) -> None:
    victim.put("data", b"d" * 4096)
    host, port = secure.node_endpoint(0).rsplit(":", 1)
    forged = sign(b"\0" * 32, 1, 0, 4096, 2**62, GrantMode.READ | GrantMode.WRITE)
    for op in (Op.PING, Op.READ):
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(pack_request(op, forged, 0, 4096))
            status, _, _ = RESPONSE.unpack(sock.recv(RESPONSE.size, socket.MSG_WAITALL))
            assert status == AccessDeniedError.code, op
    still_works(victim, "data", b"d" * 4096)


def test_a_fake_master_learns_no_grant_key_from_a_mounting_node(tmp_path: Path) -> None:
    """While the master is down, a process on its port receives the node's mount: it gets the
    bearer part of the node token and no secret, so it cannot sign grants the node accepts."""
    from mooncake_store.common.auth import Role, TokenAuthority, load_or_create_cluster_key
    from mooncake_store.node.config import NodeConfig
    from mooncake_store.node.server import StoreNode

    authority = TokenAuthority(load_or_create_cluster_key(tmp_path / "master"))
    token = authority.issue(Role.NODE, "default", node_id="n-1")
    (tmp_path / "node.token").write_text(token)
    captured: list[tuple[pb.MountSegmentRequest, str]] = []

    class FakeMaster(pb_grpc.MasterServiceServicer):
        async def MountSegment(self, request, context):  # type: ignore[no-untyped-def]
            md = dict(context.invocation_metadata())
            captured.append((request, md.get("authorization", "")))
            return pb.MountSegmentResponse(status=pb.Status(code=0), heartbeat_interval_s=5)

    async def scenario() -> None:
        server = grpc.aio.server()
        pb_grpc.add_MasterServiceServicer_to_server(FakeMaster(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        config = NodeConfig(master=f"127.0.0.1:{port}", dram_bytes=1 << 20, node_id="n-1",
                            token_file=str(tmp_path / "node.token"))  # fmt: skip
        node = StoreNode(config)
        try:
            await node.start()
            request, auth = captured[0]
            assert request.secret == b""
            presented = auth.removeprefix("Bearer ")
            assert presented.count(".") == 2 and presented == bearer(token)
            secret = node_secret_of(token)
            wire = request.SerializeToString() + auth.encode()
            assert secret not in wire and secret.hex().encode() not in wire
            assert parse_claims(presented).node_id == "n-1"
            # The node's grant key comes from the secret it kept: a grant signed with anything
            # the fake master saw is refused.
            key = grant_key(secret, "n-1", node.incarnation)
            assert node.secret == key
            assert node.access is not None
            for guess in (b"", presented.encode(), bytes(request.secret)):
                blob = sign(guess or b"\0", node.segment_id, 0, 64, 2**62, GrantMode.READ)
                with pytest.raises(AccessDeniedError):
                    node.access.check(blob, 0, 64, GrantMode.READ)
        finally:
            await node.stop(unmount=False)
            await server.stop(0)

    asyncio.run(scenario())


def test_local_token_file_is_private_and_cluster_key_0600(secure: InProcessCluster) -> None:
    path = local_token_path(secure.master_port)
    assert path.stat().st_mode & 0o777 == 0o600
    assert (secure.data_dir / "cluster.key").stat().st_mode & 0o777 == 0o600
    # Its node token never expires: an expired one gets every local node dropped with its blocks.
    import json

    assert parse_claims(json.loads(path.read_text())["node"]).expires_s == 0


def test_admin_creates_tokens_remotely_and_clients_cannot(secure: InProcessCluster) -> None:
    admin_token = create_token(secure, "--role", "admin")
    client_token = create_token(secure, "--role", "client")
    channel, master = stub(secure)
    with channel:
        request = pb.CreateTokenRequest(role="client", tenant="gamma", ttl_s=60)
        reply = master.CreateToken(request, timeout=5, metadata=bearer_md(admin_token))
        assert reply.status.code == 0 and parse_claims(reply.token).tenant == "gamma"
        with pytest.raises(grpc.RpcError) as info:
            master.CreateToken(request, timeout=5, metadata=bearer_md(client_token))
        assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with Client(secure.master_address, token=reply.token) as gamma:
        gamma.put("g", b"gamma")
        assert gamma.get("g") == b"gamma"
    # The CLI asks the running master, with the admin token of the master's local token file.
    remote = CliRunner().invoke(admin, ["token", "create", "--role", "client", "--tenant",
                                        "delta", "--master", secure.master_address])  # fmt: skip
    assert remote.exit_code == 0, remote.output
    assert parse_claims(remote.output.strip()).tenant == "delta"


def test_expired_token_is_refused(secure: InProcessCluster) -> None:
    token = create_token(secure, "--role", "client", "--ttl", "1s")
    wait_until(lambda: parse_claims(token).expired(__import__("time").time()), timeout_s=5)
    with pytest.raises(AccessDeniedError, match="expired"):
        with Client(secure.master_address, token=token) as late:
            late.exists("k")


def _frame(method: str, body: bytes, call_id: int = 1) -> bytes:
    return HEADER.pack(len(body), call_id, METHOD_IDS[method]) + body


def test_framed_node_token_may_not_make_data_calls(secure: InProcessCluster) -> None:
    channel, master = stub(secure)
    token = create_token(secure, "--role", "node", "--node-id", "n-x")
    with channel:
        hello = master.Hello(pb.HelloRequest(), timeout=5, metadata=bearer_md(token))
    with socket.create_connection(("127.0.0.1", hello.framed_port), timeout=5) as sock:
        auth = pb.AuthenticateRequest(token=bearer(token)).SerializeToString()
        sock.sendall(_frame("Authenticate", auth, 1))
        header = sock.recv(HEADER.size, socket.MSG_WAITALL)
        length, _, status = HEADER.unpack(header)
        reply = pb.AuthenticateResponse.FromString(sock.recv(length, socket.MSG_WAITALL))
        assert status == FrameStatus.OK and reply.role == "node"
        sock.sendall(_frame("BatchRemove", pb.KeysRequest(keys=["k"]).SerializeToString(), 2))
        length, call_id, status = struct.unpack("<IIH", sock.recv(HEADER.size, socket.MSG_WAITALL))
        assert (call_id, status) == (2, FrameStatus.PERMISSION_DENIED)


def test_a_captured_node_bearer_mounts_unmounts_and_drains_nothing(
    secure: InProcessCluster, victim: Client
) -> None:
    """A process on the master's port while it is down receives a node's bearer (x1's probe:
    with it alone it mounted as the node with a 1 TiB fake pool, received the victims' puts and
    locked the real node out).  Mount, heartbeat, unmount and drain must be signed with the node
    secret."""
    import time

    from mooncake_store.common.auth import SIGNATURE_METADATA, node_proof_key, sign_request

    victim.put("before-hijack", b"h" * 4096)
    token = create_token(secure, "--role", "node", "--node-id", "hijack")
    mount = pb.MountSegmentRequest(
        node_id="hijack", incarnation=11, endpoint="127.0.0.1:1", control_endpoint="127.0.0.1:1",
        segments=[pb.SegmentSpec(segment_id=0xB0B, tier="DRAM", size_bytes=1 << 40)],
    )  # fmt: skip
    key = node_proof_key(node_secret_of(token), "hijack", 11)

    def signed(
        method: str, request: object, body: object = None, skew_s: float = 0.0
    ) -> list[tuple[str, str]]:
        data = (body or request).SerializeToString(deterministic=True)  # type: ignore[attr-defined]
        stamp = sign_request(key, method, data, time.time() + skew_s)
        return [*bearer_md(token), (SIGNATURE_METADATA, stamp)]

    unmount = pb.UnmountSegmentRequest(node_id="hijack", incarnation=11)
    drain = pb.DrainNodeRequest(node_id="hijack", incarnation=11)
    channel, master = stub(secure)
    with channel:
        reply = master.MountSegment(mount, timeout=5, metadata=bearer_md(token))
        assert reply.status.code == AccessDeniedError.code
        assert "signed with the node token's secret" in reply.status.message
        # A signature of another request (the node's real endpoint) does not cover this one.
        honest = pb.MountSegmentRequest(node_id="hijack", incarnation=11, endpoint="127.0.0.1:2")
        reply = master.MountSegment(
            mount, timeout=5, metadata=signed("MountSegment", mount, honest)
        )
        assert reply.status.code == AccessDeniedError.code
        assert "hijack" not in {n.node_id for n in victim.list_nodes()}
        # The holder of the secret mounts; its signature cannot be replayed.
        md = signed("MountSegment", mount)
        assert master.MountSegment(mount, timeout=5, metadata=md).status.code == 0
        assert (
            master.MountSegment(mount, timeout=5, metadata=md).status.code == AccessDeniedError.code
        )
        # Heartbeats too: a captured bearer kept a killed node offered to writers for ever.
        beat = pb.HeartbeatRequest(node_id="hijack", incarnation=11)
        status = master.Heartbeat(beat, timeout=5, metadata=bearer_md(token)).status
        assert status.code == AccessDeniedError.code
        md = signed("Heartbeat", beat)
        assert master.Heartbeat(beat, timeout=5, metadata=md).status.code == 0
        assert master.Heartbeat(beat, timeout=5, metadata=md).status.code == AccessDeniedError.code
        # The node's clock a day ahead (a step): its heartbeats still count (x1's probe: a
        # master clock step past a signature window dropped every node and deleted every object).
        md = signed("Heartbeat", beat, skew_s=86400)
        assert master.Heartbeat(beat, timeout=5, metadata=md).status.code == 0
        status = master.DrainNode(drain, timeout=5, metadata=bearer_md(token)).status
        assert status.code == AccessDeniedError.code
        assert master.UnmountSegment(unmount, timeout=5, metadata=bearer_md(token)).code != 0
        assert "hijack" in {n.node_id for n in victim.list_nodes()}
        md = signed("UnmountSegment", unmount)
        assert master.UnmountSegment(unmount, timeout=5, metadata=md).code == 0
    assert "hijack" not in {n.node_id for n in victim.list_nodes()}
    still_works(victim, "before-hijack", b"h" * 4096)


def test_unauthenticated_framed_connections_cannot_hold_the_connection_cap(
    tmp_path: Path,
) -> None:
    """x1's probe: 25 raw connections that never authenticate took all 20 framed connections
    (--max-connections) and every legitimate client was refused.  At the cap, a new connection
    now takes the place of the oldest unauthenticated one."""
    args = [*FAST_MASTER, "--max-connections", "4"]
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as cluster:
        token = create_token(cluster, "--role", "client", "--tenant", "alpha")
        channel, master = stub(cluster)
        with channel:
            port = master.Hello(pb.HelloRequest(), timeout=5, metadata=bearer_md(token)).framed_port
        strangers = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(6)]
        try:
            with Client(cluster.master_address, token=token) as client:
                client.put("after-flood", b"f" * 1000)
                assert client.get("after-flood") == b"f" * 1000
            assert strangers[0].recv(1) == b""  # the oldest stranger was closed to make room
        finally:
            for sock in strangers:
                sock.close()
