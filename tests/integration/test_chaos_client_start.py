"""A chaos client that starts while the master is down (the first fault of a run can be a master
kill) waits for it, as an engine would, instead of dying: a client that died left its blocks
unchecked and the run still passed (scripts/chaos.py `connect`, `clients_failed`)."""

from __future__ import annotations

import contextlib
import signal
import threading
import time

import pytest

from mooncake_store.cluster import LocalCluster
from mooncake_store.common.errors import MasterUnavailableError
from tests.conftest import chaos_script


def test_a_client_started_while_the_master_is_down_waits_for_it(tmp_path):
    chaos = chaos_script()
    with LocalCluster(tmp_path, nodes=1, dram="32MiB") as cluster:
        cluster.master.signal(signal.SIGKILL)
        cluster.master.proc.wait()
        with pytest.raises(MasterUnavailableError):  # past its deadline it gives up
            chaos.connect(cluster.master_address, time.time(), local_shm=False)
        restarter = threading.Timer(1.0, cluster.start_master)
        restarter.start()
        try:
            store = chaos.connect(cluster.master_address, time.time() + 60, local_shm=False)
            with contextlib.closing(store):
                cluster.wait_for_nodes(1)
                store.put("after-restart", b"x" * 4096)
                assert store.get("after-restart") == b"x" * 4096
        finally:
            restarter.join()
