"""Grants are checked against the master's wall clock, not the node's: with the master's clock
stepped 30 s back (an NTP step; libfaketime, as the chaos harness does it), puts and reads over
TCP go on once a heartbeat has carried the new time, instead of every grant being refused as
expired (a 240 s chaos run saw 305 puts fail that way over three steps)."""

from __future__ import annotations

import os
import time

import pytest

from mooncake_store import Client
from tests.conftest import chaos_script


def test_grants_of_a_master_whose_clock_stepped_back_are_honoured(tmp_path):
    chaos = chaos_script()
    libfaketime = chaos.find_libfaketime()
    if libfaketime is None:
        pytest.skip("libfaketime is not installed (scripts/install-deps.sh installs it)")
    args = ["--heartbeat-interval", "200ms", "--put-timeout", "5s", "--lease-ttl", "5s"]
    with chaos.ChaosCluster(str(tmp_path), libfaketime=libfaketime, nodes=1, dram="32MiB",
                            master_args=args) as cluster:  # fmt: skip
        with Client(cluster.master_address, local_shm=False, timeout_s=5) as store:
            store.put("before", b"b" * 100_000)
            cluster.step_clock(-30)
            time.sleep(1.0)  # a few heartbeats carry the master's new time to the node
            value = os.urandom(300_000)
            store.put("during", value)  # its write grant expires 25 s ago by the node's clock
            assert store.get("during") == value
            assert store.get("before") == b"b" * 100_000
            cluster.step_clock(0)
            time.sleep(1.0)
            store.put("after", value)
            assert store.get("after") == value
