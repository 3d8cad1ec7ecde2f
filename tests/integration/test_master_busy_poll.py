"""A master with --busy-poll serves puts and reads as any master does, spins while a client's
requests come back to back, and parks once they stop (common/loop_spin.py)."""

from __future__ import annotations

import time

import numpy as np

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER


def test_a_busy_polling_master_serves_and_parks(tmp_path):
    args = [*FAST_MASTER, "--busy-poll", "10ms"]  # wide: requests of one loop fall inside it
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB", master_args=args) as cluster:
        assert cluster.master is not None
        spinner = cluster.master.server._framed.spinner
        assert spinner is not None and spinner.window_s == 0.01
        values = [np.random.default_rng(i).integers(0, 256, 65536, dtype=np.uint8)
                  for i in range(40)]  # fmt: skip
        with Client(cluster.master_address) as store:
            for i, value in enumerate(values):
                store.put_from(f"spin/{i}", value)
            out = np.empty(65536, dtype=np.uint8)
            for i, value in enumerate(values):
                assert store.get_into(f"spin/{i}", out) == 65536
                assert np.array_equal(out, value)
            assert spinner.spins >= 1 and spinner.turns > 0
            time.sleep(0.2)  # idle, well past the window: parked
            turns = spinner.turns
            time.sleep(0.2)
            assert spinner.turns == turns
