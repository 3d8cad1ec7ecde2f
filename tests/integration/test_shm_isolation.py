"""Local isolation: the shared-memory pool goes only to the node's uid and its --shm-group.

A client running as `nobody` (a forked child that drops root: the interpreter under /root is
not reachable by another uid, so it cannot be started as one) is refused the pool by a node
without a group and falls back to TCP, and is handed the pool by a node whose --shm-group it
belongs to.  Needs root to change uid; skipped otherwise.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401 (the unprivileged child cannot import from /root)
import grp
import json
import os
import pwd
import select
import signal
from collections.abc import Callable

import pytest

from mooncake_store import Client
from mooncake_store.client.transport import BlockingNodeConnections, ShmMapper
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.cluster import LocalCluster
from mooncake_store.common.shm_handoff import Peer, peer_allowed, supplementary_groups
from mooncake_store.common.wire import Op
from tests.conftest import FAST_MASTER, replica_list

VALUE = os.urandom(256 * 1024)


def test_peer_rule():
    assert peer_allowed(Peer(1, 1000, frozenset({1000})), node_uid=1000, group_gid=None)
    assert not peer_allowed(Peer(1, 1001, frozenset({1001})), node_uid=1000, group_gid=None)
    assert peer_allowed(Peer(1, 1001, frozenset({1001, 50})), node_uid=1000, group_gid=50)
    assert not peer_allowed(Peer(1, 1001, frozenset({1001})), node_uid=1000, group_gid=50)
    assert supplementary_groups("Name:\tx\nGroups:\t4 27 1000 \n") == {4, 27, 1000}
    assert supplementary_groups("Groups:\n") == frozenset()
    assert supplementary_groups("Groups:\tx\n") == frozenset()


def _as_user(uid: int, gid: int, work: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Run `work` in a forked child that dropped to uid/gid; its JSON result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: no pytest machinery from here on
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            result = work()
        except BaseException as exc:
            result = {"error": repr(exc)}
        try:
            os.write(write_end, json.dumps(result).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    try:
        while True:
            ready, _, _ = select.select([read_end], [], [], 30)
            if not ready:
                os.kill(pid, signal.SIGKILL)
                pytest.fail("the unprivileged client hung")
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            data += chunk
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    return json.loads(data)  # type: ignore[no-any-return]


def _probe(loc: ReplicaLocation) -> Callable[[], dict[str, object]]:
    def work() -> dict[str, object]:
        mapper = ShmMapper()
        view = mapper.map(loc)
        out: dict[str, object] = {
            "uid": os.getuid(),
            "mapped": view is not None,
            "refused": not mapper.worth_probing(loc),
        }
        if view is not None:
            out["shm_ok"] = bytes(view[loc.offset : loc.offset + len(VALUE)]) == VALUE
        buffer = memoryview(bytearray(len(VALUE)))
        nodes = BlockingNodeConnections(timeout_s=5)
        try:
            nodes.exchange(loc, Op.READ, buffer)
            out["tcp_ok"] = bytes(buffer) == VALUE
        finally:
            nodes.close()
        mapper.close()
        return out

    return work


@pytest.mark.skipif(os.geteuid() != 0, reason="changing uid to nobody needs root")
def test_other_uid_is_refused_the_pool_unless_in_the_shm_group(tmp_path):
    nobody = pwd.getpwnam("nobody")
    group = grp.getgrgid(nobody.pw_gid).gr_name
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        cluster.add_node("--shm-group", group)
        cluster.wait_for_nodes(2)
        with Client(cluster.master_address, replicas=2) as store:
            store.put("isolated", VALUE)
            assert store.counters["shm_writes"] == 2  # root, the nodes' uid: shared memory
        listing = replica_list(cluster.master_address, "isolated")
        by_node = {loc.node_id: loc for loc in listing.replicas}  # type: ignore[attr-defined]
        assert set(by_node) == {"node-0", "node-1"}

        plain = _as_user(nobody.pw_uid, nobody.pw_gid, _probe(by_node["node-0"]))
        assert plain == {"uid": nobody.pw_uid, "mapped": False, "refused": True, "tcp_ok": True}
        log = (cluster.log_dir / "node-0.log").read_text()
        assert "refused the shared-memory pool to pid" in log and f"(uid {nobody.pw_uid})" in log

        grouped = _as_user(nobody.pw_uid, nobody.pw_gid, _probe(by_node["node-1"]))
        assert grouped == {"uid": nobody.pw_uid, "mapped": True, "refused": False,
                           "shm_ok": True, "tcp_ok": True}  # fmt: skip

        with Client(cluster.master_address) as store:  # the node's own uid still maps it
            assert store.get("isolated") == VALUE
            assert store.counters["shm_reads"] == 1


def test_unknown_shm_group_is_refused_at_start():
    from mooncake_store.common.errors import InvalidArgumentError
    from mooncake_store.node.config import NodeConfig

    with pytest.raises(InvalidArgumentError, match="--shm-group"):
        NodeConfig(shm_group="no-such-group-mooncake")
    assert NodeConfig(shm_group="0").shm_group_gid == 0
