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


@pytest.mark.parametrize("offset_s", [-90, 90])
def test_a_node_mounts_and_takes_fences_from_a_master_a_minute_and_a_half_off(tmp_path, offset_s):
    """Control requests and a mount reply's fences are stamped with the master's wall clock and
    checked within 60 s: against the master's clock as the node reads it (from the signed time
    in the mount reply, then heartbeats), not the node's own.  With the master 90 s off from
    its first start, the node took no fences (every write refused) before that; then the clock
    steps 90 s the other way while puts of leases and plain puts go on, ending fences."""
    chaos = chaos_script()
    libfaketime = chaos.find_libfaketime()
    if libfaketime is None:
        pytest.skip("libfaketime is not installed (scripts/install-deps.sh installs it)")
    args = ["--heartbeat-interval", "200ms", "--put-timeout", "5s", "--lease-ttl", "5s"]
    cluster = chaos.ChaosCluster(str(tmp_path), libfaketime=libfaketime, nodes=1,
                                 dram="32MiB", master_args=args)  # fmt: skip
    cluster.step_clock(offset_s)  # before the master starts: its first mount reply is off too
    with cluster:
        for local_shm in (False, True):
            with Client(cluster.master_address, local_shm=local_shm, timeout_s=5) as store:
                value = os.urandom(200_000)
                for i in range(20):
                    store.put(f"k{local_shm}{i}", value)
                assert all(store.get(f"k{local_shm}{i}") == value for i in range(20))
                store.remove_many([f"k{local_shm}{i}" for i in range(10)])
                if local_shm and offset_s > 0:  # the master ahead: the node shows its clock,
                    assert store.counters["shm_writes"] == 20  # and grants are live by both
        log = (cluster.log_dir / "node-0.log").read_text()
        assert "off the master's clock" not in log, log[-2000:]  # not one refused so far
        # 90 s the other way, while the node runs: a push stamped after the step and before
        # the next heartbeat reply may be refused once (the master sends it again a tick later).
        cluster.step_clock(0)
        time.sleep(1.0)
        with Client(cluster.master_address, local_shm=False, timeout_s=5) as store:
            for i in range(20):
                store.put(f"after{i}", value)
            assert store.get("after19") == value and store.get("kTrue19") == value
        if offset_s > 0:  # a step back: not followed, so not one push is refused after it either
            master_log = (cluster.log_dir / "master.log").read_text()
            assert "the wall clock went back" in master_log, master_log[-2000:]
            log = (cluster.log_dir / "node-0.log").read_text()
            assert "off the master's clock" not in log, log[-2000:]
