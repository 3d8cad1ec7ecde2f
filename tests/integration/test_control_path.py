"""The master's control endpoints: the framed one (unix and TCP) next to gRPC, through real
daemons.  Both must give the same answers; the framed one must survive bad frames."""

from __future__ import annotations

import asyncio
import os
import socket
import threading

import grpc
import pytest

from mooncake_store import AsyncClient, Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.client.framed_channel import BlockingFramedChannel, FramedEndpoint
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.auth import Role, bearer
from mooncake_store.common.credentials import discover_token
from mooncake_store.common.framed import HEADER, METHOD_IDS, FrameStatus
from tests.conftest import FAST_MASTER


def client_token(master: str) -> str:
    """The token a same-host process of the master's uid finds (its bearer part)."""
    return bearer(discover_token(master, Role.CLIENT))


def hello(master: str) -> pb.HelloResponse:
    """Hello over plain gRPC, with the token a same-host process of this uid finds."""
    token = client_token(master)
    with grpc.insecure_channel(master) as channel:
        return pb_grpc.MasterServiceStub(channel).Hello(
            pb.HelloRequest(), timeout=5, metadata=[("authorization", f"Bearer {token}")]
        )


def roundtrip(store: Client, prefix: str) -> None:
    values = {f"{prefix}/{i}": os.urandom(1000 + i * 4099) for i in range(8)}
    store.put(f"{prefix}/one", b"single")
    store.put_many(values)
    assert store.get(f"{prefix}/one") == b"single"
    assert store.get_many(list(values)) == list(values.values())
    assert store.exists_many([*values, f"{prefix}/absent"]) == [True] * 8 + [False]
    assert store.remove(f"{prefix}/one") and not store.exists(f"{prefix}/one")


def test_hello_advertises_tcp_and_unix_endpoints(cluster):
    reply = hello(cluster.master_address)
    assert reply.framed_port > 0 and reply.framed_socket and reply.version


def test_sync_client_uses_a_blocking_framed_socket_per_thread(cluster):
    with Client(cluster.master_address) as store:
        roundtrip(store, "ctl/sync")
        assert store.counters["framed_calls"] >= 8 and store.counters["grpc_calls"] == 0
        assert store._local.channel.unix  # the master shares this host
        seen: list[BlockingFramedChannel] = []
        errors: list[BaseException] = []

        def worker(n: int) -> None:
            try:
                roundtrip(store, f"ctl/thread{n}")
                seen.append(store._local.channel)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert len({id(c) for c in seen}) == 4  # one socket per thread, none shared


def test_grpc_only_client_gives_the_same_answers(cluster):
    with Client(cluster.master_address, framed=False) as store:
        roundtrip(store, "ctl/grpc")
        assert store.counters["grpc_calls"] >= 8 and store.counters["framed_calls"] == 0


def test_async_client_pipelines_calls_on_one_connection(cluster):
    async def run() -> dict[str, int]:
        async with AsyncClient(cluster.master_address) as store:
            keys = [f"ctl/async/{i}" for i in range(64)]
            await asyncio.gather(*(store.put(k, k.encode() * 100) for k in keys))
            got = await asyncio.gather(*(store.get(k) for k in keys))
            assert got == [k.encode() * 100 for k in keys]
            master = store.flows.master_client()
            assert master._framed is not None and not master._framed.closed
            return dict(store.counters)

    counters = asyncio.run(run())
    assert counters["framed_calls"] >= 64 * 3 and counters["grpc_calls"] == 0


def test_framed_tcp_endpoint_serves_like_the_unix_one(cluster):
    reply = hello(cluster.master_address)
    endpoint = FramedEndpoint("127.0.0.1", reply.framed_port)  # no unix name: TCP
    channel = BlockingFramedChannel.connect(
        endpoint, timeout_s=5, max_frame_bytes=1 << 20, token=client_token(cluster.master_address)
    )
    try:
        assert not channel.unix
        with Client(cluster.master_address) as store:
            store.put("ctl/tcp-endpoint", b"x")
        answer = channel.call(
            "BatchExists",
            pb.KeysRequest(keys=["ctl/tcp-endpoint", "ctl/none"]),
        )
        assert list(answer.exists) == [True, False]  # type: ignore[attr-defined]
    finally:
        channel.close()


def raw_call(sock: socket.socket, call_id: int, method: int, payload: bytes) -> tuple[int, bytes]:
    sock.sendall(HEADER.pack(len(payload), call_id, method) + payload)
    header = b""
    while len(header) < HEADER.size:
        chunk = sock.recv(HEADER.size - len(header))
        assert chunk, "connection closed"
        header += chunk
    length, reply_id, status = HEADER.unpack(header)
    assert reply_id == call_id
    body = b""
    while len(body) < length:
        body += sock.recv(length - len(body))
    return status, body


def test_bad_frames_get_errors_and_leave_the_master_serving(cluster):
    port = hello(cluster.master_address).framed_port
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        auth = pb.AuthenticateRequest(token=client_token(cluster.master_address))
        status, _ = raw_call(sock, 0, METHOD_IDS["Authenticate"], auth.SerializeToString())
        assert status == FrameStatus.OK
        status, body = raw_call(sock, 1, 999, b"")
        assert status == FrameStatus.UNKNOWN_METHOD and b"999" in body
        status, body = raw_call(sock, 2, METHOD_IDS["BatchExists"], b"\xff\xff\xff")
        assert status == FrameStatus.BAD_REQUEST
        good = pb.KeysRequest(keys=["ctl/none"]).SerializeToString()
        status, body = raw_call(sock, 3, METHOD_IDS["BatchExists"], good)
        assert status == FrameStatus.OK
        assert list(pb.BatchExistsResponse.FromString(body).exists) == [False]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(HEADER.pack(0xFFFFFFF0, 4, 0))  # longer than any frame may be
        assert sock.recv(16) == b""  # the master hangs up on it
    with Client(cluster.master_address) as store:  # and keeps serving everyone else
        store.put("ctl/after-bad-frames", b"ok")
        assert store.get("ctl/after-bad-frames") == b"ok"


def test_blocking_channel_refuses_a_reply_to_another_call(cluster):
    endpoint = FramedEndpoint("127.0.0.1", hello(cluster.master_address).framed_port)
    channel = BlockingFramedChannel.connect(
        endpoint, timeout_s=5, max_frame_bytes=1 << 20, token=client_token(cluster.master_address)
    )
    try:
        channel.sock.sendall(HEADER.pack(1, 77, METHOD_IDS["Stats"]) + b"\xff")
        with pytest.raises(ConnectionError):  # the reply answers call 77, not ours
            channel.call("Stats", pb.StatsRequest())
    finally:
        channel.close()


def test_master_without_framed_endpoint_serves_grpc(tmp_path):
    args = [*FAST_MASTER, "--framed-port", "-1"]
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as c:
        assert hello(c.master_address).framed_port == 0
        with Client(c.master_address) as store:
            roundtrip(store, "ctl/nofast")
            assert store.counters["framed_calls"] == 0 and store.counters["grpc_calls"] >= 8
