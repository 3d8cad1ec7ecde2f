"""TLS on a real cluster: gRPC, the framed endpoint, the node data path and node control calls.

A throwaway CA issues the daemons' and the client's certificates at test time.  The master and
the nodes require client certificates (mutual TLS), so every connection between them is
verified both ways.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import ssl
import time

import pytest

from mooncake_store import AsyncClient, Client, TlsConfig
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import AccessDeniedError, MasterUnavailableError, TlsError
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER, wait_until
from tests.tls_certs import TestCA

VALUE = os.urandom(1024 * 1024 + 17)


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("ca"))


@pytest.fixture(scope="module")
def client_tls(ca: TestCA) -> TlsConfig:
    return ca.config("client")


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory, ca: TestCA, client_tls: TlsConfig):
    root = tmp_path_factory.mktemp("tls-cluster")
    # Hot blocks gain a replica by a node-to-node Fetch that the master orders over the nodes'
    # control service: both go over TLS too.
    master = [*FAST_MASTER, *ca.daemon_args("master"), "--hot-reads", "3", "--hot-window", "5s",
              "--max-replicas", "2"]  # fmt: skip
    with InProcessCluster(
        root,
        nodes=2,
        dram="32MiB",
        master_args=master,
        node_args=ca.daemon_args("node"),
        client_options={"tls": client_tls},
    ) as cluster:
        yield cluster


def test_put_and_get_over_tls_with_the_sync_client(tls_cluster, client_tls):
    with Client(tls_cluster.master_address, tls=client_tls, local_shm=False) as store:
        store.put("tls/sync", VALUE)
        assert store.get("tls/sync") == VALUE
        counters = store.counters
        assert counters["tcp_writes"] >= 1 and counters["tcp_reads"] >= 1
        assert counters["shm_writes"] == 0 and counters["shm_reads"] == 0
        assert counters["framed_calls"] > 0  # the framed endpoint over TCP + TLS


def test_put_and_get_over_tls_with_the_async_client(tls_cluster, ca: TestCA):
    issued = ca.issue("async-client")

    async def run() -> dict[str, int]:
        async with AsyncClient(
            tls_cluster.master_address,
            tls_ca=str(ca.path),
            tls_cert=str(issued.cert),
            tls_key=str(issued.key),
            local_shm=False,
        ) as store:
            await store.put("tls/async", VALUE)
            assert await store.get("tls/async") == VALUE
            return dict(store.counters)

    counters = asyncio.run(run())
    assert counters["tcp_writes"] >= 1 and counters["tcp_reads"] >= 1


def test_settings_from_the_environment(tls_cluster, client_tls, monkeypatch):
    monkeypatch.setenv("MOONCAKE_TLS_CA", client_tls.ca)
    monkeypatch.setenv("MOONCAKE_TLS_CERT", client_tls.cert)
    monkeypatch.setenv("MOONCAKE_TLS_KEY", client_tls.key)
    with Client(tls_cluster.master_address, local_shm=False) as store:
        store.put("tls/env", b"x" * 4096)
        assert store.get("tls/env") == b"x" * 4096


def test_node_to_node_fetch_runs_over_tls(tls_cluster, client_tls):
    with Client(tls_cluster.master_address, tls=client_tls, local_shm=False) as store:
        store.put("tls/hot", VALUE)
        for _ in range(5):
            assert store.get("tls/hot") == VALUE
        wait_until(lambda: store.stats().counters["hot_replicas_added"] >= 1,
                   what="a hot replica copied node to node over TLS")  # fmt: skip
        assert sum(n.objects for n in store.list_nodes()) >= 3  # tls/hot now on both nodes


def test_plaintext_client_is_refused_with_a_hint(tls_cluster):
    with pytest.raises(MasterUnavailableError, match="MOONCAKE_TLS_CA"):
        Client(tls_cluster.master_address, timeout_s=1.5, tls=TlsConfig()).connect()


def test_client_without_certificate_is_refused_with_a_hint(tls_cluster, ca: TestCA):
    with pytest.raises(MasterUnavailableError, match="tls_cert"):
        Client(tls_cluster.master_address, timeout_s=1.5, tls_ca=str(ca.path)).connect()


def test_client_trusting_another_ca_fails_clearly(tls_cluster, tmp_path):
    other = TestCA(tmp_path, "impostor CA").config("client")
    with pytest.raises(TlsError, match="not trusted"):
        Client(tls_cluster.master_address, timeout_s=5, tls=other).connect()


def test_node_data_port_refuses_plaintext_and_untrusted_clients(tls_cluster, client_tls, tmp_path):
    host, port = tls_cluster.node_endpoint(0).rsplit(":", 1)
    ping = pack_request(Op.PING, b"", 0, 0)
    with socket.create_connection((host, int(port)), timeout=5) as sock:  # plaintext
        sock.sendall(ping)
        try:
            reply = sock.recv(RESPONSE.size)
        except ConnectionResetError:
            reply = b""
        assert reply == b""  # hung up: no frame was parsed
    # A client whose certificate another CA signed is refused by the node.
    impostor = TestCA(tmp_path, "impostor CA").config("client")
    context = impostor.client_context()
    context.load_verify_locations(client_tls.ca)  # it trusts the node, the node not it
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            with context.wrap_socket(raw, server_hostname=host) as sock:
                sock.sendall(ping)
                if not sock.recv(RESPONSE.size):
                    raise ConnectionResetError("closed")
    # A trusted client gets its PING parsed and answered: refused, since a PING needs one of
    # the node's grants too (issue 12), which this one does not carry.
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with client_tls.client_context().wrap_socket(raw, server_hostname=host) as sock:
            sock.sendall(ping)
            status, _, size = RESPONSE.unpack(sock.recv(RESPONSE.size))
            assert status == AccessDeniedError.code
            assert b"PING needs a grant" in sock.recv(size)


def test_tls_settings_are_checked_at_start(tmp_path, client_tls):
    from mooncake_store.common.errors import InvalidArgumentError
    from mooncake_store.node.config import NodeConfig

    with pytest.raises(InvalidArgumentError, match="--tls-key"):
        NodeConfig(tls_cert=client_tls.cert)
    with pytest.raises(InvalidArgumentError, match="--tls-cert"):
        NodeConfig(tls_ca=client_tls.ca)
    with pytest.raises(InvalidArgumentError, match="does not exist"):
        TlsConfig(ca=str(tmp_path / "missing.pem"))


def test_mutual_tls_master_offers_no_unix_endpoint(tls_cluster, client_tls):
    with Client(tls_cluster.master_address, tls=client_tls) as store:
        store.put("tls/probe", b"p")
        endpoint = store._master().framed_endpoint
        assert endpoint is not None and endpoint.unix_name == ""  # TCP + TLS even on this host


def test_client_certificates_can_be_optional(tmp_path, ca: TestCA):
    """--no-tls-require-client-cert: daemons still verify each other, clients need only the CA."""
    optional = ["--no-tls-require-client-cert"]
    with InProcessCluster(
        tmp_path,
        nodes=1,
        dram="16MiB",
        master_args=[*FAST_MASTER, *ca.daemon_args("master-2"), *optional],
        node_args=[*ca.daemon_args("node-2"), *optional],
        client_options={"tls_ca": str(ca.path)},
    ) as cluster:
        with Client(cluster.master_address, tls_ca=str(ca.path), local_shm=False) as store:
            store.put("tls/no-client-cert", VALUE)
            assert store.get("tls/no-client-cert") == VALUE
            assert store.counters["tcp_reads"] == 1


def test_tls_settings_come_from_files_and_environment(tmp_path, ca: TestCA):
    from mooncake_store.common.config import load_config
    from mooncake_store.master.config import MasterConfig
    from mooncake_store.node.config import NodeConfig

    issued = ca.issue("configured")
    toml = tmp_path / "node.toml"
    toml.write_text(f'tls_cert = "{issued.cert}"\ntls_key = "{issued.key}"\ntls_ca = "{ca.path}"\n'
                    'tls_require_client_cert = false\n')  # fmt: skip
    node = load_config(NodeConfig, env_prefix="MOONCAKE_NODE_", config_file=toml, environ={})
    assert node.tls == TlsConfig(str(issued.cert), str(issued.key), str(ca.path), False)
    env = {"MOONCAKE_MASTER_TLS_CERT": str(issued.cert), "MOONCAKE_MASTER_TLS_KEY": str(issued.key)}
    master = load_config(MasterConfig, env_prefix="MOONCAKE_MASTER_", environ=env)
    assert master.tls.serves and not master.tls.ca


def test_admin_cli_reaches_a_tls_master_with_the_environment(tls_cluster, client_tls):
    import subprocess
    import sys
    from pathlib import Path

    env = {**os.environ, "MOONCAKE_TLS_CA": client_tls.ca, "MOONCAKE_TLS_CERT": client_tls.cert,
           "MOONCAKE_TLS_KEY": client_tls.key}  # fmt: skip
    admin = str(Path(sys.executable).parent / "mooncake-admin")
    out = subprocess.run([admin, "nodes", "--master", tls_cluster.master_address, "--json"],
                         capture_output=True, text=True, env=env, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert {"node-0", "node-1"} <= {n["node_id"] for n in json.loads(out.stdout)}


def test_a_tls_connection_the_master_closed_while_idle_is_replaced_not_failed(tmp_path, ca):
    """As over plain TCP (test_client_retries): after the master's --idle-timeout closed the
    sync client's framed TLS connection, a remove (not safe to repeat) goes out on a new one."""
    client_tls = ca.config("idle-client")
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", client_options={"tls": client_tls},
                      master_args=[*ca.daemon_args("idle-master"), "--idle-timeout", "1s"],
                      node_args=ca.daemon_args("idle-node")) as cluster:  # fmt: skip
        with Client(cluster.master_address, tls=client_tls) as store:
            store.put("idle-1", b"x" * 100)
            store.put("idle-2", b"y" * 100)
            calls = store.counters["framed_calls"]
            time.sleep(2.5)  # the master closes the idle connection meanwhile
            assert store.remove("idle-1") is True
            assert store.remove("idle-2") is True
            assert store.counters["framed_calls"] == calls + 2  # both on the framed endpoint
