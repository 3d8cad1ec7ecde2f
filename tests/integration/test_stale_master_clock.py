"""A node that stops getting the master's time refuses writes once its reading is older than
the master's heartbeat TTL, over TCP and through its fence page (same-host clients), wired end
to end: the mount reply carries the TTL, the node's clock takes it, its watch shows the page
stale (node/master_clock.py).  Here the master is stopped, so no reply comes back."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import AccessDeniedError
from mooncake_store.common.grant import Grant, GrantMode, sign_grant
from mooncake_store.common.shm_fence import FenceView
from tests.conftest import FAST_MASTER, wait_until

TTL_S = 1.5  # FAST_MASTER's --heartbeat-ttl


def test_a_node_cut_off_from_the_masters_time_refuses_writes_everywhere(tmp_path: Path) -> None:
    assert FAST_MASTER[FAST_MASTER.index("--heartbeat-ttl") + 1] == "1500ms"
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        node = cluster.nodes[0].server
        access = node.access
        clock = access.gate.clock
        wait_until(lambda: clock.max_age_s == TTL_S, timeout_s=5, what="the TTL from the mount")
        page = FenceView(os.open(f"/proc/self/fd/{node.fence_page.fd}", os.O_RDONLY))
        [segment] = list(access.dram)
        expires = int(time.time() * 1000) + 600_000
        grant = sign_grant(access.secret, Grant(segment, 0, 4096, expires, GrantMode.WRITE, 1))
        shown = page.master_now_ms()
        assert shown is not None and abs(shown - time.time() * 1000) < 5_000  # the real clock
        assert not clock.stale()

        cluster.master.stop()  # no reply comes back from here on
        stopped = time.monotonic()
        wait_until(lambda: (page.master_now_ms() or 0) > 1 << 61, timeout_s=10,
                   what="the fence page showing the clock stale")  # fmt: skip
        assert time.monotonic() - stopped < TTL_S + 1.0  # by the TTL, not a heartbeat later
        assert clock.stale()
        with pytest.raises(AccessDeniedError, match="not had the master's time"):
            access.check(grant, 0, 4096, GrantMode.WRITE)
        read = sign_grant(access.secret, Grant(segment, 0, 4096, expires, GrantMode.READ))
        assert access.check(read, 0, 4096, GrantMode.READ) == segment  # reads are checksummed

        cluster.start_master()  # replies again: the node writes again
        wait_until(lambda: not clock.stale(), timeout_s=20, what="a fresh reading")
        wait_until(lambda: (page.master_now_ms() or 0) < 1 << 61, timeout_s=5,
                   what="the page showing the real clock again")  # fmt: skip
