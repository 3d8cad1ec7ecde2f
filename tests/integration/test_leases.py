"""Puts through allocation leases against a real master and node: one master call per steady
put (single key and batch, same host and TCP), the right bytes, and a lease that died with its
master costs a retry, never the put."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from mooncake_store import AsyncClient, Client, ObjectNotFoundError
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.master.membership import REMOUNT_HOLD_S
from tests.conftest import FAST_MASTER, replica_list, wait_until

MiB = 1 << 20


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("leases")
    with InProcessCluster(root, nodes=1, dram="64MiB", master_args=FAST_MASTER) as c:
        yield c


@pytest.mark.parametrize("local_shm", [False, True], ids=["tcp", "same-host"])
def test_steady_puts_are_one_master_call(cluster, local_shm):
    """Over TCP (a client on a host without a node) and by shared memory (a client on the
    node's host): leases make a warm put one call."""
    with Client(cluster.master_address, leases=True, local_shm=local_shm) as store:
        values = {f"lease/{local_shm}/{i}": os.urandom(MiB - i) for i in range(6)}
        sizes = {len(v) for v in values.values()}
        first = {f"lease/{local_shm}/warm{n}": os.urandom(n) for n in sizes}
        for key, value in first.items():  # two-phase; its PutEnd brings the next lease
            store.put(key, value)
        calls = store.counters["framed_calls"]
        for key, value in values.items():
            assert not store.put(key, value).deduplicated
        assert store.counters["framed_calls"] == calls + len(values)
        assert store.counters["leased_puts"] == len(values)

        batch = [{f"batch/{local_shm}/{b}/{i}": os.urandom(65536) for i in range(8)}
                 for b in range(3)]  # fmt: skip
        store.put_many(batch[0])  # two-phase, then leased
        calls = store.counters["framed_calls"]
        store.put_many(batch[1])
        store.put_many(batch[2])
        assert store.counters["framed_calls"] == calls + 2
        everything = {**values, **batch[0], **batch[1], **batch[2]}
        assert store.get_many(list(everything)) == list(everything.values())
        first = next(iter(values))
        leased = store.counters["leased_puts"]
        assert store.put(first, values[first]).deduplicated  # leased: its written lease ends
        again = os.urandom(len(values[first]))
        store.remove(first)  # remove, then put the same key: as without leases
        assert not store.put(first, again).deduplicated
        assert store.get(first) == again
        assert store.counters["leased_puts"] == leased + 1  # a fresh lease, written once
        assert store.counters["shm_writes" if local_shm else "tcp_writes"] >= len(everything)
        store.remove_many(list(everything))


def test_async_client_leases_by_default(cluster):
    """AsyncClient without options, over TCP: put, put_from and put_many are one master call
    each once warm, as in the sync Client."""
    local_shm = False

    async def run() -> None:
        async with AsyncClient(cluster.master_address, local_shm=local_shm) as store:
            tag = f"async-lease/{local_shm}"
            for i in range(4):
                await store.put(f"{tag}/{i}", bytes([i]) * 70_000)
            assert store.counters["leased_puts"] == 3
            got = await store.get_many([f"{tag}/{i}" for i in range(4)])
            assert got == [bytes([i]) * 70_000 for i in range(4)]
            calls = store.counters["framed_calls"]
            array = np.arange(70_000, dtype=np.uint8)
            await store.put_from(f"{tag}/from", array)  # same size: a lease is held
            assert store.counters["framed_calls"] == calls + 1
            batch = {f"{tag}/many/{b}/{i}": os.urandom(4096) for b in range(2) for i in range(4)}
            items = list(batch.items())
            await store.put_many(dict(items[:4]))  # a new size: two-phase, brings 4 leases
            calls = store.counters["framed_calls"]
            await store.put_many(dict(items[4:]))
            assert store.counters["framed_calls"] == calls + 1
            assert store.counters["leased_puts"] == 3 + 1 + 4
            assert await store.get_many(list(batch)) == list(batch.values())
            assert await store.get(f"{tag}/from") == array.tobytes()

    asyncio.run(run())


@pytest.mark.parametrize("local_shm", [False, True], ids=["tcp", "same-host"])
def test_steady_leases_are_minted_ahead_and_end_with_their_client(cluster, local_shm):
    """A client that keeps putting one size gets its next lease from the leases the master
    minted after its previous reply (master/lease_stock.py): the values read back, those
    leases are reported as leases, and they end with the client's connection."""
    with Client(cluster.master_address) as observer:
        before = observer.stats()
        with Client(cluster.master_address, local_shm=local_shm) as store:
            values = {f"stock/{local_shm}/{i}": os.urandom(300_000) for i in range(8)}
            for key, value in values.items():
                store.put(key, value)
            stats = observer.stats()
            stocked = stats.counters.get("leases_from_stock", 0) - before.counters.get(
                "leases_from_stock", 0
            )
            assert stocked >= 5  # the first put and the first leased one mint inline
            assert store.counters["leased_puts"] == len(values) - 1
            assert stats.leases >= before.leases + 2  # the client's next and the stocked one
            assert store.get_many(list(values)) == list(values.values())
        wait_until(lambda: observer.stats().leases == before.leases, timeout_s=10,
                   what="the closed client's leases, stocked ones too, to end")  # fmt: skip
        observer.remove_many(list(values))


def test_a_lease_stocked_before_its_node_began_draining_is_not_handed_out(tmp_path):
    """Found by review: the master hands out a lease it minted ahead (master/lease_stock.py) as
    long as it is fresh, and handed out one on a node that had begun draining to stop since,
    so a put was placed on a draining node (drain.py: no new put is placed on it).  Now a
    stocked lease whose node is no longer offered to puts (draining, suspect or dropped) is
    released instead, and the put gets a lease minted where a put may go."""
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=FAST_MASTER) as c:
        servicer = c.master.server._servicer
        with Client(c.master_address, local_shm=False) as store:
            for i in range(4):  # steady: each reply's lease comes from the stock
                store.put(f"drained/{i}", os.urandom(300_000))

            async def drain_the_stocked_leases_node() -> str:
                [node] = {r.node_id for classes in servicer.lease_stock._stock.values()
                          for held in classes.values() for lease in held
                          for r in lease.message.replicas}  # fmt: skip
                servicer.drains.drain(node, 0)  # as `mooncake-admin drain` does
                return node

            draining = c.master.call(drain_the_stocked_leases_node())
            store.put("drained/held", os.urandom(300_000))  # its reply: the stocked lease
            value = os.urandom(300_000)
            store.put("drained/next", value)
            placed = [r.node_id for r in replica_list(c.master_address, "drained/next").replicas]
            assert draining not in placed
            assert store.get("drained/next") == value


def test_leases_a_client_holds_on_a_node_that_begins_draining_are_given_back(tmp_path):
    """Found by review: a client holding a lease on a node that began draining to stop put its
    next value there (drain.py: no new put is placed on it; had its commit come after the
    drain's last check, the node would have unmounted with the block).  The drain gives the
    node's unused leases back as it starts: the put is retried two-phase, elsewhere."""
    with InProcessCluster(tmp_path, nodes=2, dram="16MiB", master_args=FAST_MASTER) as c:
        servicer = c.master.server._servicer
        with Client(c.master_address, local_shm=False) as store:
            for i in range(3):
                store.put(f"held-drain/{i}", os.urandom(300_000))
            [held] = [h for h in store._flows._leases._held.values() if h]
            [node] = {loc.node_id for lease in held for loc in lease.locations}

            async def drain() -> None:
                servicer.drains.drain(node, 0)  # as `mooncake-admin drain` does

            c.master.call(drain())
            value = os.urandom(300_000)
            store.put("held-drain/next", value)  # into the lease it holds: given back
            placed = [r.node_id for r in replica_list(c.master_address, "held-drain/next").replicas]
            assert node not in placed
            assert store.get("held-drain/next") == value


def test_a_pin_a_leased_put_adds_to_a_stored_key_is_durable_before_its_reply(tmp_path):
    """Found by review: a leased put of a key already stored, now asked pinned, is deduplicated
    and pins the stored object; that pin reached RocksDB before the reply only because minting
    the next lease wrote the table's changes, so once the next lease came from the master's
    stock it waited for the tick (a master that stopped meanwhile forgot the pin).  The put's
    reply now waits for it, as PutStart's does."""
    args = [*FAST_MASTER, "--tick-interval", "1h"]  # no tick writes it meanwhile
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as c:
        servicer = c.master.server._servicer
        with Client(c.master_address, local_shm=False) as store:
            value = os.urandom(256 * 1024)
            store.put("pin/k", value)  # two-phase; brings a lease
            store.put("pin/other", os.urandom(len(value)))  # leased; asked again: stocked
            calls = store.counters["framed_calls"]
            assert store.put("pin/k", value, pin=True).deduplicated
            assert store.counters["framed_calls"] == calls + 1  # leased; its next: the stock

            async def stored_pin() -> float:
                return next(m.pin_until_s for m in servicer.store.load() if m.key == "pin/k")

            assert c.master.call(stored_pin()) == math.inf


def test_a_lease_from_a_restarted_master_costs_a_retry_not_the_put(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address, leases=True, local_shm=False) as store:
            store.put("before", os.urandom(MiB))  # leaves a lease for the next MiB
            cluster.master.signal(signal.SIGKILL)
            cluster.master.proc.wait()
            cluster.start_master()
            cluster.wait_for_nodes(1)
            time.sleep(REMOUNT_HOLD_S)  # the node mounted again: no room (nor lease) before
            value = os.urandom(MiB)
            assert not store.put("after", value).deduplicated  # the lease is gone: two-phase
            assert store.get("after") == value
            assert store.counters["leased_puts"] == 0
            again = os.urandom(MiB)
            store.put("after-2", again)  # the retry's PutEnd brought a fresh lease
            assert store.counters["leased_puts"] == 1 and store.get("after-2") == again


def _pool_used(store: Client) -> int:
    """Bytes allocated in the pools: objects, puts in flight, leases and frees not done yet."""
    stats = store.stats()
    return stats.used_bytes + stats.leased_bytes


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_leases_are_reported_apart_and_end_with_their_client(cluster, framed):
    """Unused leases are no objects, no puts in flight and no bytes used by objects; a client
    that disconnects has them ended (framed: as it closes; gRPC: by the master's check of
    closed connections) and their room is free again."""
    with Client(cluster.master_address) as observer:
        before = observer.stats()
        pool_before = _pool_used(observer)  # (frees of earlier tests may still be on their way)
        [node_before] = observer.list_nodes()
        with Client(cluster.master_address, framed=framed, local_shm=False) as store:
            value = os.urandom(MiB)
            store.put(f"apart/{framed}", value)  # its PutEnd brings a lease for the next MiB
            stats = observer.stats()
            assert (stats.leases, stats.leased_bytes) == (before.leases + 1, MiB)
            assert stats.objects == before.objects + 1 and stats.processing == 0
            assert stats.used_bytes == before.used_bytes + MiB  # the object's MiB only
            [node] = observer.list_nodes()
            assert node.objects == node_before.objects + 1
            assert (node.leases, node.leased_bytes) == (1, MiB)
            assert node.used_bytes == node_before.used_bytes + MiB
            keys = observer.list_keys(prefix="apart/")[0]
            assert [k.key for k in keys] == [f"apart/{framed}"]  # a lease is no key
        wait_until(lambda: observer.stats().leases == 0, timeout_s=10,
                   what="the closed client's leases to end")  # fmt: skip
        wait_until(lambda: _pool_used(observer) <= pool_before + MiB, timeout_s=10,
                   what="the leased room to be free again")  # fmt: skip
        observer.remove(f"apart/{framed}")


def test_what_a_call_in_flight_as_its_connection_closes_starts_ends_with_it(tmp_path):
    """Found by review: a framed connection that closed while one of its calls was still in
    flight had its puts revoked (and its leases, its stocked ones too) when it closed, but
    what that call went on to start (a pending put here; leases minted for the next puts, or
    the stock's record of the connection, the same way) was owned by a connection already
    gone, and held its room until --put-timeout.  It now ends as that last call ends."""
    from mooncake_store._proto import mooncake_store_pb2 as pb
    from mooncake_store.client.framed_channel import CallTimeoutError
    from mooncake_store.client.master_client import MasterClient
    from mooncake_store.client.types import Retry

    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as c:
        table = c.master.server._servicer.table

        async def hold_the_room(seconds: float) -> None:  # as a node mounted again just now
            until = table._clock() + seconds
            for seg in table._segments.values():
                seg.writable_after = until
            table._held_until = until

        async def put_start_then_close() -> None:
            client = MasterClient(c.master_address, timeout_s=5, retry=Retry())
            channel = await client.framed_channel()
            assert channel is not None
            item = pb.PutStartItem(key="gone/0", size_bytes=4096)
            request = pb.BatchPutStartRequest(items=[item])
            c.master.call(hold_the_room(0.5))  # the PutStart waits the hold out on the master
            with pytest.raises(CallTimeoutError):
                await channel.call("BatchPutStart", request, timeout_s=0.2)
            await client.close()  # closed with the call in flight

        with Client(c.master_address) as observer:
            revoked = observer.stats().counters["puts_revoked"]
            asyncio.run(put_start_then_close())  # the hold ends: the call starts its put
            wait_until(
                lambda: observer.stats().counters["puts_revoked"] == revoked + 1,
                timeout_s=5,
                what="the put started for a closed connection to end",
            )
            assert observer.stats().processing == 0


@pytest.mark.parametrize("framed", [True, False], ids=["framed", "grpc"])
def test_a_client_that_dies_has_its_leases_reclaimed(cluster, framed):
    """Killed, a client gives nothing back: the master ends its leases as its connection
    drops (framed: at once; gRPC: the master's check of closed connections)."""
    script = (
        "import os, signal, sys\n"
        "from mooncake_store import Client\n"
        "store = Client(sys.argv[1], framed=sys.argv[2] == 'framed').connect()\n"
        "store.put('died/0', os.urandom(1 << 20))\n"
        "print('put', flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    with Client(cluster.master_address) as observer:
        before = observer.stats()
        pool_before = _pool_used(observer)
        how = "framed" if framed else "grpc"
        proc = subprocess.run([sys.executable, "-c", script, cluster.master_address, how],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == -signal.SIGKILL and proc.stdout == "put\n", proc.stderr
        wait_until(lambda: observer.stats().leases == before.leases, timeout_s=10,
                   what="the dead client's lease to end")  # fmt: skip
        wait_until(lambda: _pool_used(observer) <= pool_before + MiB, timeout_s=10,
                   what="its room to be free again")  # fmt: skip
        assert len(observer.get("died/0")) == MiB  # what it committed stays
        observer.remove("died/0")


def test_leases_give_way_to_puts_when_the_pool_is_tight(tmp_path):
    """A client holding leases never costs another client's put its room: the other fills the
    pool exactly, evicting nothing and never refused (as it would without leases)."""
    with LocalCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as c:
        with (
            Client(c.master_address, local_shm=False) as holder,  # plain leases: a TCP writer
            Client(c.master_address, leases=False) as other,
        ):
            for b in range(2):  # the second batch is leased and asks for the next ones
                holder.put_many({f"held/{b}/{i}": os.urandom(MiB // 2) for i in range(4)})
            stats = other.stats()
            assert stats.leases == 4 and stats.leased_bytes == 2 * MiB  # 1/8 of the pool
            room = stats.capacity_bytes - stats.used_bytes  # leased room counts as free
            values = {f"other/{i}": os.urandom(MiB // 2) for i in range(room // (MiB // 2))}
            for key, value in values.items():  # two-phase puts, one by one
                other.put(key, value)
            stats = other.stats()
            assert stats.counters["evictions"] == 0 and stats.leases == 0
            assert other.get_many(list(values)) == list(values.values())
            assert stats.used_bytes == stats.capacity_bytes  # exactly full
            value = os.urandom(MiB // 2)
            holder.put("held/after", value)  # its leases are gone: two-phase, evicting
            assert holder.get("held/after") == value


def test_a_leased_commit_repeated_while_the_first_is_made_durable_reports_its_outcome(cluster):
    """A BatchLeasedPut sent again (a retry after its connection died with the call sent)
    while the first is still being made durable: the repeat waits for that commit and reports
    it, as a repeated PutEnd does.  It said "the lease is gone", and the client then put the
    value the two-phase way into a key still committing (ObjectBusyError for a put that
    became visible)."""
    from mooncake_store._proto import mooncake_store_pb2 as pb
    from mooncake_store.client.master_client import put_start_call
    from mooncake_store.client.types import PutSpec
    from mooncake_store.common.checksum import checksum
    from mooncake_store.common.errors import OK

    value = os.urandom(40960)
    with Client(cluster.master_address, local_shm=False) as store, \
            Client(cluster.master_address, leases=False) as other:  # fmt: skip
        store.put("again/0", os.urandom(len(value)))  # two-phase; brings a lease
        [held] = [h for h in store._flows._leases._held.values() if h]
        lease = held.pop()  # sent by hand below
        # A put in flight: the commit below is grouped with others, so it yields meanwhile.
        other._master_call(put_start_call([PutSpec("again/pending", 4096)]))
        request = pb.BatchLeasedPutRequest(items=[pb.LeasedPutItem(
            spec=pb.PutStartItem(key="again/1", size_bytes=len(value)),
            lease_id=lease.lease_id, checksum=checksum(value),
        )])  # fmt: skip
        servicer = cluster.master.server._servicer

        async def twice() -> list[pb.BatchLeasedPutResponse]:
            return await asyncio.gather(
                servicer.BatchLeasedPut(request, None), servicer.BatchLeasedPut(request, None)
            )

        first, repeat = cluster.master.call(twice())
        assert first.results[0].status.code == OK, first.results[0].status
        assert repeat.results[0].status.code == OK, repeat.results[0].status
        assert repeat.results[0].replicas == first.results[0].replicas == 1
        assert store.exists("again/1")


def test_a_same_host_client_never_copies_into_a_lease_taken_back(tmp_path):
    """Found by review: a same-host client copies into a pool through shared memory, which no
    write grant, seal or fence of the node governs.  Holding a lease the master had taken back
    (its room given to another client's put when the pool filled up), its next put copied over
    that put's acknowledged block (b14 failed its checksum).  Now the node shows its write
    fences in shared memory and the client checks them right before the copy: the lease taken
    back is written over TCP instead, refused, and the put retried two-phase; every block of
    the other client reads back (or was evicted), never overwritten."""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as c:
        with Client(c.master_address) as x, Client(c.master_address) as b:  # defaults
            x.put("x0", os.urandom(MiB))  # two-phase; its PutEnd brings a lease
            assert x.stats().leases >= 1
            values = {f"b{i}": os.urandom(MiB) for i in range(15)}
            for key, value in values.items():  # fills the pool: x's leases give way
                b.put(key, value)
            x1 = os.urandom(MiB)
            x.put("x1", x1)
            assert x.counters["copies_refused"] >= 1  # the lease taken back: not copied into
            assert x.get("x1") == x1
            found = 0
            for key, value in values.items():  # (ChecksumMismatchError on b14 before)
                try:
                    assert b.get(key) == value
                    found += 1
                except ObjectNotFoundError:
                    pass  # evicted for x1 (a full pool): never overwritten
            assert found >= 13 and b.counters["checksum_failures"] == 0


def test_a_same_host_copy_under_a_grant_of_an_earlier_mount_goes_to_the_node(tmp_path):
    """A master that restarted hands the pool's room out afresh.  The node shows same-host
    clients its write fences (common/shm_fence.py): a lease granted before the restart is not
    copied into (the node refuses it over TCP), the put is retried two-phase, and no block
    written after the restart is touched."""
    with LocalCluster(tmp_path, nodes=1, dram="32MiB", master_args=FAST_MASTER) as cluster:
        with Client(cluster.master_address) as x, Client(cluster.master_address) as b:
            x.put("before", os.urandom(MiB))  # two-phase; leaves a lease
            assert x.stats().leases >= 1
            cluster.master.signal(signal.SIGKILL)
            cluster.master.proc.wait()
            cluster.start_master()
            cluster.wait_for_nodes(1)
            values = {f"b{i}": os.urandom(MiB) for i in range(8)}
            for key, value in values.items():  # room the new master hands out afresh
                b.put(key, value)
            after = os.urandom(MiB)
            x.put("after", after)  # its lease is of the earlier mount: not copied into
            assert x.counters["copies_refused"] >= 1
            assert x.get("after") == after
            for key, value in values.items():
                assert b.get(key) == value
            assert b.counters["checksum_failures"] == 0
