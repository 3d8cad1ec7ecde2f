"""Advertised addresses: never a wildcard, --advertise-host in replica locations and in Hello."""

from __future__ import annotations

import subprocess
import sys

import pytest

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.addresses import (
    advertised_host,
    is_wildcard,
    join_host_port,
    split_host_port,
)
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.master.config import MasterConfig
from mooncake_store.node.config import NodeConfig
from tests.conftest import FAST_MASTER


def test_the_advertising_rule():
    assert advertised_host("127.0.0.1", "") == "127.0.0.1"
    assert advertised_host("0.0.0.0", "10.0.0.6") == "10.0.0.6"
    assert advertised_host("::", "node-6.example") == "node-6.example"
    # "0", "0.0", "0x0", "000.0.0.0" and ::ffff:0.0.0.0 bind every interface as well (x1 probe)
    for wildcard in ("0.0.0.0", "::", "[::]", "", "0:0::0", "0", "0.0", "0x0",
                     "000.000.000.000", "::ffff:0.0.0.0", " 0.0.0.0"):  # fmt: skip
        assert is_wildcard(wildcard)
        with pytest.raises(InvalidArgumentError, match="--advertise-host"):
            advertised_host(wildcard, "")
        with pytest.raises(InvalidArgumentError, match="--advertise-host"):
            advertised_host("127.0.0.1", wildcard or "::")
    assert not is_wildcard("localhost") and not is_wildcard("::1")
    assert not any(map(is_wildcard, ("10.0.0.6", "0.example", "127.1", "0x7f000001")))
    assert join_host_port("::1", 5) == "[::1]:5" and join_host_port("a.b", 5) == "a.b:5"
    assert split_host_port("[::1]:5") == ("::1", 5)
    assert split_host_port("10.0.0.6:7") == ("10.0.0.6", 7)
    with pytest.raises(ValueError):
        split_host_port("no-port")


def test_configs_refuse_to_advertise_a_wildcard():
    with pytest.raises(InvalidArgumentError, match="set --advertise-host"):
        NodeConfig(host="0.0.0.0")
    assert NodeConfig(host="0.0.0.0", advertise_host="10.0.0.6").advertised_host == "10.0.0.6"
    with pytest.raises(InvalidArgumentError, match="--advertise-host"):
        MasterConfig(advertise_host="0.0.0.0")
    MasterConfig(host="0.0.0.0")  # clients dial the master's address they were given


def test_node_bound_to_every_interface_without_advertise_host_exits_with_one_line():
    proc = subprocess.run(
        [sys.executable, "-m", "mooncake_store.node", "--host", "0.0.0.0", "--dram", "4MiB"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "set --advertise-host" in proc.stderr and "Traceback" not in proc.stderr


def test_advertised_hosts_reach_clients(tmp_path):
    with InProcessCluster(
        tmp_path,
        nodes=1,
        dram="16MiB",
        master_args=[*FAST_MASTER, "--advertise-host", "localhost"],
        node_args=["--advertise-host", "localhost"],
    ) as cluster:
        with Client(cluster.master_address, local_shm=False) as store:
            store.put("advertised", b"a" * 70000)
            assert store.get("advertised") == b"a" * 70000
            (node,) = store.list_nodes()
            assert node.endpoint.startswith("localhost:")
            master = store._master()
            assert master.framed_endpoint is not None
            assert master.framed_endpoint.host == "localhost"
            assert store.counters["tcp_reads"] == 1 and store.counters["framed_calls"] > 0
