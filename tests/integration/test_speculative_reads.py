"""Speculative same-host reads (client/speculative.py): a get_into of a key the client put or
read copies from the remembered extent while the master looks it up, and returns those bytes
only when the reply confirms the extent still holds that put's object.  Real master and node
(in this process), real shared-memory pools; other clients change the keys behind its back."""

from __future__ import annotations

import asyncio
import os
import threading

import numpy as np
import pytest

from mooncake_store import AsyncClient, Client
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import ChecksumMismatchError, ObjectNotFoundError
from mooncake_store.common.grant import grant_generation
from tests.conftest import FAST_MASTER, replica_list

SIZE = 300_000


@pytest.fixture
def small(tmp_path):
    """One node: every replica is in the same pool, so where a put lands is predictable."""
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as c:
        yield c


def where(store: Client, key: str) -> tuple[int, int]:
    info = store.describe_many([key])[0]
    assert info is not None
    return info.replicas[0].segment_id, info.replicas[0].offset


def spec(store: Client) -> tuple[int, int]:
    return store.counters["speculative_reads"], store.counters["speculative_misses"]


def test_a_get_into_after_a_put_is_served_by_the_overlapped_copy(small):
    value, big = os.urandom(SIZE), os.urandom(5 << 20)  # big: the copy is split in two threads
    with Client(small.master_address) as a, Client(small.master_address) as c:
        a.put("k", value)
        a.put_from("big", np.frombuffer(big, dtype=np.uint8))
        out = bytearray(SIZE)
        calls = a.counters["framed_calls"]
        assert a.get_into("k", out) == SIZE and out == value
        assert spec(a) == (1, 0) and a.counters["framed_calls"] == calls + 1  # one lookup
        dst = np.zeros(5 << 20, dtype=np.uint8)
        assert a.get_into("big", dst) == 5 << 20 and dst.tobytes() == big
        larger = bytearray(SIZE + 1000)
        assert a.get_into("k", larger) == SIZE and larger[:SIZE] == value
        assert spec(a) == (3, 0) and a.counters["shm_reads"] == 3
        # Another client learns the location from its first (plain) read.
        assert c.get_into("k", out) == SIZE and spec(c) == (0, 0)
        assert c.get_into("k", out) == SIZE and out == value and spec(c) == (1, 0)
        # get (new bytes) takes the plain path, and a removed key is forgotten.
        assert a.get("k") == value and spec(a) == (3, 0)
        a.remove("k")
        a.put("k", value)
        assert a.get_into("k", out) == SIZE and out == value and spec(a) == (4, 0)


def test_read_grants_name_the_put_generation_the_client_remembers(small):
    value = os.urandom(SIZE)
    with Client(small.master_address) as a:
        a.put("k", value)
        first = replica_list(small.master_address, "k")
        generation = grant_generation(first.replicas[0].grant)  # type: ignore[attr-defined]
        assert generation != 0
        again = replica_list(small.master_address, "k")
        assert grant_generation(again.replicas[0].grant) == generation  # type: ignore[attr-defined]
        remembered = a._async.flows._locations.get("k")
        assert remembered is not None and remembered.generation == generation  # the put's
        a.remove("k")
        a.put("k", value)
        fresh = replica_list(small.master_address, "k")
        assert grant_generation(fresh.replicas[0].grant) not in (0, generation)  # type: ignore[attr-defined]
    with Client(small.master_address, local_shm=False) as tcp:  # nodes take such READ grants
        assert tcp.get("k") == value and tcp.counters["tcp_reads"] == 1


def test_a_key_removed_by_another_client_is_not_found(small):
    """The old bytes still sit in the freed extent: only the master's answer tells."""
    value = os.urandom(SIZE)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put("k", value)
        assert b.remove("k")
        out = bytearray(SIZE)
        with pytest.raises(ObjectNotFoundError):
            a.get_into("k", out)
        with pytest.raises(ObjectNotFoundError):
            a.get_many_into(["k"], [out])
        assert spec(a)[0] == 0


def test_a_key_put_again_with_other_bytes_by_another_client_reads_the_new_bytes(small):
    old, new = os.urandom(SIZE), os.urandom(SIZE)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put("k", old)
        out = bytearray(SIZE)
        a.get_into("k", out)  # its read lease keeps the old extent (and bytes) from reuse
        first = where(a, "k")
        assert b.remove("k")
        b.put("k", new)
        assert where(b, "k") != first  # the old bytes are still at the remembered extent
        assert a.get_into("k", out) == SIZE and out == new
        assert spec(a) == (1, 1)
        assert a.get_into("k", out) == SIZE and out == new and spec(a) == (2, 1)  # relearnt


def test_a_key_put_again_with_the_same_bytes_at_the_same_extent_is_a_miss(small):
    """Same size, checksum and extent: only the put generation tells the puts apart."""
    value = os.urandom(SIZE)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put("k", value)
        first = where(a, "k")
        assert b.remove("k")
        b.put("k", value)
        assert where(b, "k") == first  # another put's object in the remembered extent
        out = bytearray(SIZE)
        assert a.get_into("k", out) == SIZE and out == value
        assert spec(a) == (0, 1)


def test_an_extent_reused_by_another_key_never_returns_that_keys_bytes(small):
    value = os.urandom(SIZE)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put("k", value)
        first = where(a, "k")
        assert b.remove("k")
        others = {}
        for i in range(40):  # until another key lands in the remembered extent
            others[f"other/{i}"] = os.urandom(SIZE)
            b.put(f"other/{i}", others[f"other/{i}"])
            if where(b, f"other/{i}") == first:
                break
        else:
            pytest.fail("no other key reused the extent")
        out = bytearray(SIZE)
        with pytest.raises(ObjectNotFoundError):
            a.get_into("k", out)
        b.put("k", value)  # back, elsewhere; the reused extent holds the other key
        assert a.get_into("k", out) == SIZE and out == value
        assert spec(a)[0] == 0


def test_bytes_damaged_in_the_pool_are_never_returned(small):
    value = os.urandom(SIZE)
    with Client(small.master_address) as a:
        a.put("k", value)
        segment, offset = where(a, "k")
        pool = a._async.flows.shm.segment(segment)
        assert pool is not None
        pool[offset + 1000] ^= 0xFF  # a same-host process may write anywhere in the pool
        out = bytearray(SIZE)
        with pytest.raises(ChecksumMismatchError):
            a.get_into("k", out)
        assert spec(a) == (0, 1) and a.counters["checksum_failures"] >= 1


def test_a_batch_is_speculative_only_when_every_key_is_remembered(small):
    values = {f"b/{i}": os.urandom(SIZE) for i in range(3)}
    keys = list(values)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put_many({k: values[k] for k in keys[:2]})
        b.put(keys[2], values[keys[2]])  # not known to a
        outs = [bytearray(SIZE) for _ in keys]
        assert a.get_many_into(keys, outs) == [SIZE] * 3
        assert [bytes(o) for o in outs] == list(values.values()) and spec(a) == (0, 0)
        calls = a.counters["framed_calls"]
        outs = [bytearray(SIZE) for _ in keys]
        assert a.get_many_into(keys, outs) == [SIZE] * 3  # every key known now
        assert [bytes(o) for o in outs] == list(values.values())
        assert spec(a) == (3, 0) and a.counters["framed_calls"] == calls + 1
        values[keys[1]] = os.urandom(SIZE)
        assert b.remove(keys[1])
        b.put(keys[1], values[keys[1]])
        outs = [bytearray(SIZE) for _ in keys]
        assert a.get_many_into(keys, outs) == [SIZE] * 3  # one miss, read from the reply
        assert [bytes(o) for o in outs] == list(values.values()) and spec(a) == (5, 1)


def test_the_async_client_and_the_grpc_path_overlap_too(small):
    old, new = os.urandom(SIZE), os.urandom(SIZE)

    async def through_async() -> tuple[bytes, bytes, tuple[int, int]]:
        async with AsyncClient(small.master_address) as a:
            await a.put("k", old)
            out = bytearray(SIZE)
            await a.get_into("k", out)
            first = bytes(out)
            with Client(small.master_address) as b:
                b.remove("k")
                b.put("k", new)
            await a.get_into("k", out)
            return first, bytes(out), (a.counters["speculative_reads"],
                                       a.counters["speculative_misses"])  # fmt: skip

    assert asyncio.run(through_async()) == (old, new, (1, 1))
    with Client(small.master_address, framed=False) as g:  # meanwhile, then the gRPC call
        g.put("g", old)
        out = bytearray(SIZE)
        assert g.get_into("g", out) == SIZE and out == old
        assert spec(g) == (1, 0) and g.counters["framed_calls"] == 0


def test_reads_racing_removes_and_puts_get_one_value_whole_or_not_found(tmp_path):
    """Threads of one client read keys that another client keeps removing and putting again
    with one of two values: each read returns one of them whole, or not found."""
    keys = [f"race/{i}" for i in range(6)]
    pair = (os.urandom(SIZE), os.urandom(SIZE))
    stop = threading.Event()
    bad: list[str] = []
    with (
        InProcessCluster(tmp_path, nodes=1, dram="64MiB", master_args=FAST_MASTER) as small,
        Client(small.master_address) as a,
        Client(small.master_address) as b,
    ):
        a.put_many({k: pair[0] for k in keys})

        def read() -> None:
            out = bytearray(SIZE)
            while not stop.is_set():
                for key in keys:
                    try:
                        a.get_into(key, out)
                    except ObjectNotFoundError:
                        continue
                    if bytes(out) not in pair:
                        bad.append(key)

        readers = [threading.Thread(target=read) for _ in range(2)]
        for t in readers:
            t.start()
        try:
            for n in range(60):
                key = keys[n % len(keys)]
                b.remove(key)
                b.put(key, pair[n % 2])
        finally:
            stop.set()
            for t in readers:
                t.join()
    assert bad == []
    assert a.counters["speculative_reads"] > 0


def test_a_batch_sent_as_slices_copies_first_then_looks_up(tmp_path):
    """A batch over the master's cap goes as slices: no overlap, the same result."""
    values = {f"s/{i}": os.urandom(SIZE) for i in range(5)}
    args = [*FAST_MASTER, "--max-batch-items", "2"]
    with (
        InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as small,
        Client(small.master_address) as a,
    ):
        a.put_many(values)
        outs = [bytearray(SIZE) for _ in values]
        calls = a.counters["framed_calls"]
        assert a.get_many_into(list(values), outs) == [SIZE] * 5
        assert [bytes(o) for o in outs] == list(values.values())
        assert spec(a) == (5, 0) and a.counters["framed_calls"] == calls + 3


def test_scatter_reads_and_their_outcomes_are_speculative_too(small):
    """get_many_into_parts / get_many_into_outcomes (the compat layer's get_into and
    batch_get_into): kept copies count, refused ones are read again or fail alone."""
    values = {f"p/{i}": os.urandom(SIZE) for i in range(3)}
    keys = list(values)
    with Client(small.master_address) as a, Client(small.master_address) as b:
        a.put_many(values)

        def parts() -> list[list[bytearray]]:
            return [[bytearray(1000), bytearray(SIZE - 1000)] for _ in keys]

        outs = parts()
        assert a.get_many_into_parts(keys, outs) == [SIZE] * 3
        assert [bytes(x[0] + x[1]) for x in outs] == list(values.values()) and spec(a) == (3, 0)
        assert b.remove(keys[0])
        values[keys[1]] = os.urandom(SIZE)
        assert b.remove(keys[1])
        b.put(keys[1], values[keys[1]])
        outs = parts()
        got = a.get_many_into_outcomes(keys, outs)
        assert isinstance(got[0], ObjectNotFoundError) and got[1:] == [SIZE, SIZE]
        assert [bytes(x[0] + x[1]) for x in outs[1:]] == [values[k] for k in keys[1:]]
        assert spec(a) == (4, 2)
        outs = parts()  # keys[1] was learnt again by its read, keys[0] is forgotten
        assert a.get_many_into_parts(keys[1:], outs[1:]) == [SIZE, SIZE] and spec(a) == (6, 2)


def test_the_compat_layers_pointer_reads_are_speculative(small):
    from mooncake_store.compat import MooncakeDistributedStore

    data = np.frombuffer(os.urandom(SIZE), dtype=np.uint8)
    store = MooncakeDistributedStore()
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 << 20, "tcp", "",
                       small.master_address) == 0  # fmt: skip
    try:
        assert store.put_from("c/k", int(data.ctypes.data), SIZE) == 0
        out = np.zeros(SIZE, dtype=np.uint8)
        assert store.get_into("c/k", int(out.ctypes.data), SIZE) == SIZE
        assert np.array_equal(out, data)
        assert store.batch_get_into(["c/k"], [int(out.ctypes.data)], [SIZE]) == [SIZE]
        assert store._client is not None and spec(store._client) == (2, 0)
    finally:
        assert store.close() == 0


def test_an_overlapped_step_keeps_the_call_when_its_local_work_fails(small):
    """Both drivers: what `meanwhile` raises is handed back beside the reply, never raised;
    an interrupt (BaseException) propagates, and the framed channel skips the reply it left."""
    from mooncake_store.client.master_client import get_replica_list_call
    from mooncake_store.client.steps import Overlapped

    def fails() -> None:
        raise ValueError("copy failed")

    def interrupted() -> None:
        raise KeyboardInterrupt

    def flow(meanwhile):
        return (yield Overlapped(get_replica_list_call(["k"], b""), meanwhile))

    with Client(small.master_address) as a:
        a.put("k", b"v" * 1000)
        (reply,), outcome = a._drive(flow(fails))
        assert reply.size_bytes == 1000 and isinstance(outcome, ValueError)
        calls = a.counters["framed_calls"]
        with pytest.raises(KeyboardInterrupt):
            a._drive(flow(interrupted))
        assert a.get("k") == b"v" * 1000  # the same channel: the skipped reply is not taken
        assert a.counters["framed_calls"] == calls + 1

        async def through_async() -> object:
            async with AsyncClient(small.master_address) as b:
                (reply,), outcome = await b._drive(flow(fails))
                assert reply.size_bytes == 1000
                return outcome

        assert isinstance(asyncio.run(through_async()), ValueError)


def test_a_leased_put_is_remembered_under_its_leases_generation(small):
    values = [os.urandom(SIZE) for _ in range(3)]
    with Client(small.master_address) as a:
        for i, value in enumerate(values):  # the first brings leases, the next use them
            a.put(f"l/{i}", value)
        assert a.counters["leased_puts"] >= 1
        out = bytearray(SIZE)
        for i, value in enumerate(values):
            assert a.get_into(f"l/{i}", out) == SIZE and out == value
        assert spec(a) == (3, 0)
