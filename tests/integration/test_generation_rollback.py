"""A master whose data directory went back in time never reuses an earlier run's put
generations (master/generations.py): the nodes report what they saw when they mount.

The disk going back is made by hand: the generation floor file is put back to what it held
before the last master run started (as a host crash losing its last write, or a restored
backup, leaves it), against a real master and node (in-process: InProcessCluster)."""

from __future__ import annotations

import os
import time

import grpc
from google.protobuf.message import Message

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.auth import (
    SIGNATURE_METADATA,
    bearer,
    node_proof_key,
    node_secret_of,
    sign_request,
)
from mooncake_store.common.errors import AccessDeniedError
from mooncake_store.common.grant import grant_generation
from mooncake_store.master.generations import FLOOR_FILE, MARGIN, MAX_SEEN, RESERVE
from tests.conftest import FAST_MASTER, wait_until
from tests.integration.test_security import create_token
from tests.integration.test_write_grants import Master, connect, write

VALUE = os.urandom(256 * 1024)


def test_a_master_on_a_disk_gone_back_starts_past_the_generations_its_nodes_saw(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master, floor_file = cluster.master_address, cluster.data_dir / FLOOR_FILE
        assert cluster.master is not None
        cluster.master.stop()
        before = floor_file.read_text()  # the floor the next run starts from (past the clock)
        cluster.start_master()
        cluster.wait_for_nodes(1)
        gate = cluster.nodes[0].server.access.gate
        with Master(master) as calls:
            stale = calls.put_start("granted-then-lost", len(VALUE))  # never written
            generation = grant_generation(stale.grant)
            with Client(master) as store:  # later puts: the master fences the node past them
                store.put_many({f"earlier/{i}": VALUE for i in range(6)})
            wait_until(lambda: gate.generation_seen > generation + 5, timeout_s=10)
            cluster.master.stop()
        floor_file.write_text(before)  # the disk went back: the next run starts where the
        cluster.start_master()  # last one did, and would name its puts as that one did
        cluster.wait_for_nodes(1)

        # The grant the lost run handed out finds its generation ended, not reopened...
        with connect(stale) as sock:
            status, message = write(sock, stale, b"\xee" * len(VALUE))
        assert status == AccessDeniedError.code, message
        assert "write grant ended" in message
        # ...and the new run's own puts are admitted (they are named past the lost run's).
        with Client(master) as store:
            fresh = {f"fresh/{i}": os.urandom(len(VALUE)) for i in range(8)}
            store.put_many(fresh)
            assert store.get_many(list(fresh)) == list(fresh.values())
        # The floor on disk moved past the new names before they were handed out, so a later
        # restart on this directory starts past them too.
        assert int(floor_file.read_text()) >= generation + MARGIN + RESERVE // 2
        cluster.master.stop()
        cluster.start_master()
        cluster.wait_for_nodes(1)
        with Client(master) as store:
            store.put("after-restart", VALUE)
            assert store.get("after-restart") == VALUE
            assert store.get_many(list(fresh)) == list(fresh.values())


def test_a_node_reporting_generations_near_the_cap_cannot_lock_the_others_out(tmp_path):
    """One node token (`intruder`'s) reports having seen a generation just under the cap from
    another master run: the master moves its generations past it, up where every node it
    fences then sees more than the cap.  A remount that needs no move (the same run, or a later
    run whose floor is past what the nodes saw) must still be taken: the cap only bounds how
    far a report may move the master, never what its own puts were named.  (Without that,
    every node was refused at the next master start: the cluster was locked out for good.)"""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        master = cluster.master_address
        token = create_token(cluster, "--role", "node", "--node-id", "intruder")
        report = pb.MountSegmentRequest(
            node_id="intruder", incarnation=7, endpoint="127.0.0.1:1",
            control_endpoint="127.0.0.1:1", generation_seen=MAX_SEEN - 1, master_run=1,
        )  # fmt: skip
        proof = node_proof_key(node_secret_of(token), "intruder", 7)
        with grpc.insecure_channel(master) as channel:
            stub = pb_grpc.MasterServiceStub(channel)

            def signed(method: str, request: Message) -> list[tuple[str, str]]:
                body = request.SerializeToString(deterministic=True)
                signature = sign_request(proof, method, body, time.time())
                return [("authorization", f"Bearer {bearer(token)}"),
                        (SIGNATURE_METADATA, signature)]  # fmt: skip

            reply = stub.MountSegment(report, timeout=5, metadata=signed("MountSegment", report))
            assert reply.status.code == 0, reply.status.message  # under the cap: taken
            gone = pb.UnmountSegmentRequest(node_id="intruder", incarnation=7)
            stub.UnmountSegment(gone, timeout=5, metadata=signed("UnmountSegment", gone))
        gate = cluster.nodes[0].server.access.gate
        with Client(master) as store:  # the master fences node-0 with its puts' generations
            store.put_many({f"before/{i}": VALUE for i in range(4)})
            wait_until(lambda: gate.generation_seen >= MAX_SEEN, timeout_s=10)
        # node-0 mounts on the next run: its floor is past what node-0 saw, nothing to move.
        cluster.master.stop()
        cluster.start_master()
        cluster.wait_for_nodes(1, timeout_s=10)
        with Client(master) as store:
            store.put("next-run", VALUE)
            assert store.get("next-run") == VALUE
