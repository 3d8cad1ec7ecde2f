"""Object lifecycle with a real master and real nodes (issue 11): a repeated PutEnd is a
success, a poisoned key heals, a write grant ends with its put."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import subprocess

import pytest
import xxhash

from mooncake_store import ChecksumMismatchError, Client
from mooncake_store.client.master_client import (
    MasterClient,
    put_end_call,
    put_revoke_call,
    remove_call,
    report_corrupt_call,
)
from mooncake_store.client.transport import ShmMapper
from mooncake_store.client.types import PutSpec, ReplicaList, ReplicaLocation, Retry
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import (
    OK,
    AccessDeniedError,
    InvalidArgumentError,
    MooncakeError,
    ObjectConflictError,
    ObjectHasLeaseError,
)
from mooncake_store.common.wire import RESPONSE, Op, pack_request
from tests.conftest import FAST_MASTER, replica_list, wait_until


@pytest.fixture(scope="module")
def cluster2(tmp_path_factory):
    root = tmp_path_factory.mktemp("lifecycle")
    with InProcessCluster(root, nodes=2, dram="32MiB", master_args=FAST_MASTER) as c:
        yield c


def send(loc: ReplicaLocation, op: Op, offset: int, payload: bytes) -> int:
    """One data-path request with the location's grant; returns the node's status."""
    host, _, port = loc.endpoint.rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(pack_request(op, loc.grant, offset, len(payload)) + payload)
        header = bytearray(RESPONSE.size)
        view, got = memoryview(header), 0
        while got < len(header):
            n = sock.recv_into(view[got:])
            assert n, "node closed the connection"
            got += n
        status, _, _ = RESPONSE.unpack(header)
        return status


def put_with_ends(master: str, key: str, value: bytes, *checksums: int) -> list:
    """PutStart, write the value with the write grant, then one BatchPutEnd per checksum, all
    on one master connection (a closed connection revokes its pending puts)."""

    async def run():
        client = MasterClient(master, timeout_s=5, retry=Retry())
        try:
            [plan] = await client.put_start([PutSpec(key, len(value), 1)])
            loc = plan.replicas[0]
            assert send(loc, Op.WRITE, loc.offset, value) == OK
            return [await client.run(put_end_call([(key, c, [], 0)])) for c in checksums]
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_repeated_put_end_of_a_committed_put_is_a_success(cluster2):
    """A BatchPutEnd the master committed but whose reply was lost, sent again, succeeds."""
    value = os.urandom(50_000)
    digest = xxhash.xxh3_64_intdigest(value)
    first, again = put_with_ends(cluster2.master_address, "repeat", value, digest, digest)
    assert first == [1] and again == [1]  # both report one replica, no ObjectNotFoundError
    with Client(cluster2.master_address) as store:
        assert store.get("repeat") == value
        assert store.stats().counters["put_ends_repeated"] == 1


@pytest.mark.parametrize("local_shm", [True, False])
def test_a_key_committed_with_a_wrong_checksum_heals(cluster2, local_shm):
    """A put committed with a wrong checksum is unreadable; the failed read reports it, the
    master deletes it, and the next correct put of the key stores and reads back."""
    key = f"poisoned/{local_shm}"
    value = os.urandom(30_000)
    put_with_ends(cluster2.master_address, key, value, xxhash.xxh3_64_intdigest(value) ^ 1)
    with Client(cluster2.master_address, local_shm=local_shm) as store:
        with pytest.raises(ChecksumMismatchError):
            store.get(key)
        assert store.counters["corrupt_reported"] == 1
        assert not store.exists(key)
        result = store.put(key, value)
        assert not result.deduplicated  # written afresh, not "already stored"
        assert store.get(key) == value
        assert store.stats().counters["objects_corrupt"] >= 1


def test_a_correct_put_heals_a_key_committed_with_a_wrong_checksum(cluster2):
    """A put conflicting with a stored value whose every replica fails its checksum asks the
    master to check them; the master deletes the key and the put stores it afresh, with no
    read in between.  A conflict with a sound stored value still stands."""
    key, value = "poisoned/then-put", os.urandom(30_000)
    put_with_ends(cluster2.master_address, key, value, xxhash.xxh3_64_intdigest(value) ^ 1)
    with Client(cluster2.master_address) as store:
        result = store.put(key, value)
        assert not result.deduplicated  # written afresh, not "already stored"
        assert store.get(key) == value
        with pytest.raises(ObjectConflictError):
            store.put(key, os.urandom(30_000))  # the sound value stays
        assert store.get(key) == value


def test_a_leased_put_of_a_stored_key_with_another_value_is_no_duplicate(cluster2):
    """The one-RTT (leased) put of a key stored with another value used to report
    "deduplicated"; it now goes the two-phase way: a conflict, or a heal of a poisoned key."""
    with Client(cluster2.master_address, leases=True, local_shm=False) as store:  # TCP: leases
        for i in range(3):  # puts of this size: the client now holds leases for it
            store.put(f"leased/warm{i}", os.urandom(20_000))
        assert store.counters["leased_puts"] >= 1
        store.put("leased/a", os.urandom(20_000))
        with pytest.raises(ObjectConflictError):
            store.put("leased/a", os.urandom(20_000))
        value = os.urandom(20_000)
        put_with_ends(cluster2.master_address, "leased/poisoned", value,
                      xxhash.xxh3_64_intdigest(value) ^ 1)  # fmt: skip
        assert not store.put("leased/poisoned", value).deduplicated
        assert store.get("leased/poisoned") == value


def report_corrupt(master: str, key: str, info: ReplicaList) -> list:
    """Report `key` corrupt, naming every replica of `info`, as a reader of the tenant may."""

    async def run():
        client = MasterClient(master, timeout_s=5, retry=Retry())
        try:
            return await client.run(report_corrupt_call([(key, info.checksum, info.replicas)]))
        finally:
            await client.close()

    return asyncio.run(run())


def test_a_false_corrupt_report_deletes_nothing(cluster2):
    """Any client of a tenant may report a key corrupt; the master has the nodes hash the
    replicas named, and a report about bytes that check out deletes nothing, not even of a
    leased object that a non-forced remove refuses (it used to be trusted blindly)."""
    key, value = "falsely-reported", os.urandom(40_000)
    with Client(cluster2.master_address) as store:
        store.put(key, value, replicas=2)
        before = store.stats().counters
        info = replica_list(cluster2.master_address, key)  # a read: leased for 5 s
        assert len(info.replicas) == 2
        [leased] = store.remove_many_outcomes([key], force=False)
        assert isinstance(leased, ObjectHasLeaseError)
        [refused] = report_corrupt(cluster2.master_address, key, info)
        assert isinstance(refused, InvalidArgumentError)
        assert store.get(key) == value
        assert len(replica_list(cluster2.master_address, key).replicas) == 2
        after = store.stats().counters
        assert after["corrupt_reports_refuted"] == before["corrupt_reports_refuted"] + 1
        assert after["replicas_corrupt"] == before["replicas_corrupt"]
        assert after["objects_corrupt"] == before["objects_corrupt"]


def test_a_corrupt_report_drops_only_the_replicas_that_fail(cluster2):
    """A report naming two replicas of which one really fails drops that one; the object
    stays, readable from the other."""
    key, value = "half-corrupt", os.urandom(40_000)
    with Client(cluster2.master_address) as store:
        store.put(key, value, replicas=2)
        before = store.stats().counters
        info = replica_list(cluster2.master_address, key)
        bad, good = info.replicas
        mapper = ShmMapper()
        pool = mapper.map(bad)
        assert pool is not None
        pool[bad.offset] ^= 0xFF  # flip a byte of one replica, in its node's pool
        mapper.close()
        assert report_corrupt(cluster2.master_address, key, info) == [None]
        after = store.stats().counters
        assert after["replicas_corrupt"] == before["replicas_corrupt"] + 1
        assert after["objects_corrupt"] == before["objects_corrupt"]
        now = replica_list(cluster2.master_address, key).replicas
        assert (good.segment_id, good.offset) in {(r.segment_id, r.offset) for r in now}
        assert (bad.segment_id, bad.offset) not in {(r.segment_id, r.offset) for r in now}
        assert store.get(key) == value


@pytest.fixture
def tiny_disk(tmp_path):
    """A 4 MiB tmpfs for the master's data directory (needs root: skipped otherwise)."""
    data = tmp_path / "cluster" / "master"
    data.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(data)], capture_output=True
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield tmp_path / "cluster"
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def fill(path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_remove_is_durable_before_visible_and_the_master_recovers_from_enospc(tiny_disk):
    with LocalCluster(tiny_disk, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as store:
            # Long keys: their deletes need WAL pages the full disk no longer has.
            keys = [f"kept/{i:04d}/" + "k" * 200 for i in range(100)]
            store.put_many({k: k.encode() for k in keys})
            filler = cluster.data_dir / "filler"
            fill(filler)
            with pytest.raises(MooncakeError, match="metadata write failed"):
                store.remove_many(keys)
            assert all(store.exists_many(keys))  # nothing was removed
            assert store.get(keys[0]) == keys[0].encode()  # leased: first in the pool
            # A put that must evict first: the evictions cannot be made durable, so the put
            # fails and holds nothing (the evicted keys stay dirty until the disk is back).
            with pytest.raises(MooncakeError, match="metadata write failed"):
                store.put("big", b"\0" * (16 * 1024 * 1024 - 8192))
            assert store.stats().processing == 0
            filler.unlink()  # space is back: the running master recovers, no restart
            store.remove_many(keys)
            assert not any(store.exists_many(keys))
            store.put("after", b"written after the recovery")
            assert store.stats().counters["metadata_reopened"] >= 1
        assert cluster.master.stop() == 0
        cluster.start_master()  # what RocksDB holds agrees with what was acknowledged
        with Client(cluster.master_address) as store:
            wait_until(lambda: store.exists("after"), what="the node to mount again")
            assert not any(store.exists_many(keys))


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_abandoned_puts_of_a_closed_connection_neither_evict_nor_block(cluster2, framed):
    """One client starts 10k puts and disconnects: committed objects stay, later puts work.
    Over gRPC too, where the master learns of the closed connection from the kernel."""
    master = cluster2.master_address
    with Client(master) as store:
        base_used = store.stats().used_bytes
        kept = {f"kept/{i}": os.urandom(256 * 1024) for i in range(40)}  # 10 MiB of 64
        store.put_many(kept)
        evictions = store.stats().counters["evictions"]

    async def abandon() -> list:
        client = MasterClient(master, timeout_s=30, retry=Retry(), framed=framed)
        try:
            specs = [PutSpec(f"abandoned/{i}", 16 * 1024, 1) for i in range(10_000)]
            return await client.put_start(specs)
        finally:
            await client.close()  # the connection drops with every put still pending

    plans = asyncio.run(abandon())
    assert any(not isinstance(p, Exception) for p in plans)
    with Client(master) as store:
        wait_until(lambda: store.stats().processing == 0, timeout_s=10,
                   what="the closed connection's puts to be revoked")  # fmt: skip
        stats = store.stats()
        assert stats.counters["evictions"] == evictions  # nothing committed was evicted
        assert all(store.exists_many(list(kept)))
        later = {f"later/{i}": os.urandom(256 * 1024) for i in range(40)}
        store.put_many(later)  # no NoSpaceError
        assert store.get("later/39") == later["later/39"]
        store.remove_many([*kept, *later])
        # The revoked puts' extents are free again once their nodes took the write fence: the
        # next test (the other variant) starts with the room this one had.
        wait_until(lambda: store.stats().used_bytes <= base_used, timeout_s=30,
                   what="the revoked and removed extents to be free again")  # fmt: skip


def test_write_grants_end_with_their_put(cluster2):
    """A write grant stops working once its put was committed, revoked or removed."""
    master = cluster2.master_address

    async def run() -> None:
        client = MasterClient(master, timeout_s=5, retry=Retry())
        try:
            value = os.urandom(8192)
            specs = [PutSpec(k, len(value), 1) for k in ("ended", "revoked", "removed")]
            plans = await client.put_start(specs)
            locs = {s.key: p.replicas[0] for s, p in zip(specs, plans, strict=True)}
            for loc in locs.values():
                assert send(loc, Op.WRITE, loc.offset, value) == OK  # while the put is open
            digest = xxhash.xxh3_64_intdigest(value)
            await client.run(put_end_call([("ended", digest, [], 0), ("removed", digest, [], 0)]))
            await client.run(put_revoke_call(["revoked"]))
            await client.run(remove_call(["removed"]))

            def refused(key: str, payload: bytes = b"") -> bool:  # empty: changes nothing
                loc = locs[key]
                return send(loc, Op.WRITE, loc.offset, payload) == AccessDeniedError.code

            for key in locs:  # the master fences the nodes within a tick
                await asyncio.to_thread(
                    wait_until, lambda key=key: refused(key), 10.0, 0.05, f"{key}'s grant to end"
                )
                assert refused(key, b"late")
        finally:
            await client.close()

    asyncio.run(run())
    with Client(master) as store:
        assert len(store.get("ended")) == 8192  # the refused late writes never landed
