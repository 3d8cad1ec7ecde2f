"""A copy the master asked a node for lands only while the run that asked still mounts the
node.  A Fetch of run A, accepted while A had mounted the node, may still be reading from a
slow source when the master restarts; run B then hands that DRAM room to its own puts.  The
node asks again right before the bytes go into the pool (node/control.py `_copy_refused`),
so the late copy is refused and B's acknowledged block is kept (found by review of 7a4374e:
the check was made only when the request came, and the fetch overwrote the block)."""

from __future__ import annotations

import os
import socket
import threading
import time

import grpc

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.checksum import checksum
from mooncake_store.common.errors import OK, AccessDeniedError
from mooncake_store.common.wire import REQUEST, RESPONSE
from mooncake_store.master.releases import BlockName
from tests.conftest import FAST_MASTER, replica_list, wait_until
from tests.integration.test_tiers import fill_and_demote, tier_cluster

SPAN = 4 * 1024 * 1024  # the fetch covers the start of the pool, where the next puts go
JUNK = b"\xee" * SPAN
VALUE = os.urandom(256 * 1024)


class SlowSource:
    """A node data path that answers one READ only when `release` is set."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.asked = threading.Event()
        self.release = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.recv(REQUEST.size, socket.MSG_WAITALL)
            self.asked.set()
            self.release.wait(60)
            conn.sendall(RESPONSE.pack(OK, 0, SPAN) + JUNK)
            time.sleep(1)


def test_a_fetch_of_an_earlier_run_still_in_flight_after_a_restart_writes_nothing(
    tmp_path,
):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        master, node = cluster.master.server, cluster.nodes[0].server
        segment = node.segment_id
        source = SlowSource()
        fetch = pb.FetchRequest(
            tasks=[pb.FetchTask(key="re-replicated", src_endpoint=source.endpoint, grant=b"g",
                                src_offset=0, size_bytes=SPAN, checksum=checksum(JUNK),
                                dst_segment=segment, dst_offset=0)],
            master_run=master._servicer.master_run,
        )  # fmt: skip
        signed = master.mover._signed(node.node_id, "Fetch", fetch)
        replies: list[pb.FetchResponse] = []

        def send() -> None:
            with grpc.insecure_channel(f"127.0.0.1:{node.control_port}") as channel:
                stub = pb_grpc.NodeServiceStub(channel)
                replies.append(stub.Fetch(fetch, timeout=60, metadata=signed))

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        assert source.asked.wait(10)  # run A's fetch is under way on the node

        cluster.master.stop()  # run A is gone: the node remounts on run B
        cluster.start_master()
        cluster.wait_for_nodes(1)
        assert node._link.master_run == cluster.master.server._servicer.master_run
        time.sleep(1.0)  # past REMOUNT_HOLD_S
        with Client(cluster.master_address) as store:
            store.put("acknowledged", VALUE)
            assert store.get("acknowledged") == VALUE

            source.release.set()  # run A's fetch completes
            sender.join(30)
            assert replies, "the fetch got no answer"
            status = replies[0].statuses[0]
            assert status.code == AccessDeniedError.code and "master run" in status.message
            assert "nothing was written" in status.message
            assert store.get("acknowledged") == VALUE


def test_a_release_the_node_refuses_as_another_runs_is_sent_again(tmp_path):
    """A node refuses a Release of a run other than the one whose mount reply it took
    last (its mount reply on its way, or lost).  The master sends it again at later ticks
    (mover.release, frees.py `release_again`), so once the reply is in the node forgets the
    removed block; dropped, the NVMe index kept it and the next mount's inventory made the
    master adopt it again: a removed key came back (found by review of 7a4374e).  The window is
    simulated by setting the link's master_run (what a lost mount reply leaves)."""
    with tier_cluster(InProcessCluster, tmp_path) as cluster:
        node = cluster.nodes[0].server
        link = node._link
        with Client(cluster.master_address) as store:
            on_nvme = fill_and_demote(cluster, store, "r")
            key = on_nvme[0]
            offset = replica_list(cluster.master_address, key).replicas[0].offset
            indexed = {b.offset for b in node.nvme.load_index()}
            assert offset in indexed
            run = link.master_run
            link.master_run = run ^ 0x10  # the node still names the earlier run
            mover = cluster.master.server.mover
            releases: list[dict[int, list[tuple[int, BlockName]]]] = []
            release = mover.release

            async def spy(released, generations):  # type: ignore[no-untyped-def]
                releases.append(released)
                await release(released, generations)

            mover.release = spy
            assert store.remove(key)
            sent = lambda: {o for r in releases for blocks in r.values() for o, _ in blocks}  # noqa: E731
            wait_until(lambda: offset in sent(),
                       timeout_s=20, what="the master's Release")  # fmt: skip
            time.sleep(0.5)  # its reply (refused) is in
            assert offset in {b.offset for b in node.nvme.load_index()}  # refused: kept
            link.master_run = run  # the mount reply is in
            wait_until(lambda: offset not in {b.offset for b in node.nvme.load_index()},
                       timeout_s=10, what="the Release sent again")  # fmt: skip
        cluster.master.stop()
        cluster.start_master()  # the node mounts again with its NVMe inventory
        cluster.wait_for_nodes(1)
        with Client(cluster.master_address) as store:
            assert not store.exists(key)


def test_a_master_restarted_before_its_release_landed_does_not_bring_the_key_back(tmp_path):
    """The node refuses every Release (its link names another run, as a lost mount reply
    leaves it), the key is removed, and the master stops before any Release landed.  The next
    run finds the release owed in RocksDB (master/releases.py) and, when the node mounts again
    with the block still in its index, releases it instead of adopting it: before, the queue
    lived in memory only and the removed key came back."""
    with tier_cluster(InProcessCluster, tmp_path) as cluster:
        node = cluster.nodes[0].server
        link = node._link
        with Client(cluster.master_address) as store:
            on_nvme = fill_and_demote(cluster, store, "r")
            key, kept = on_nvme[0], on_nvme[1]
            offset = replica_list(cluster.master_address, key).replicas[0].offset
            link.master_run ^= 0x10  # every Release of this run is refused from now on
            refused: list[int] = []
            mover = cluster.master.server.mover
            release = mover.release

            async def spy(released, generations):  # type: ignore[no-untyped-def]
                await release(released, generations)
                refused.extend(o for blocks in released.values() for o, _ in blocks)

            mover.release = spy
            assert store.remove(key)
            wait_until(lambda: offset in refused, timeout_s=20, what="a refused Release")
            assert offset in {b.offset for b in node.nvme.load_index()}
        cluster.master.stop()
        cluster.start_master()  # the node mounts again and reports the block still indexed
        cluster.wait_for_nodes(1)
        with Client(cluster.master_address) as store:
            assert not store.exists(key)
            assert store.exists(kept)
            wait_until(lambda: offset not in {b.offset for b in node.nvme.load_index()},
                       timeout_s=20, what="the node forgetting the removed block")  # fmt: skip
            assert not store.exists(key)
