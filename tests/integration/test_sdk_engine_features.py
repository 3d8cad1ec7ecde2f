"""Issue 13's SDK features through real daemons, on both data paths: scatter-gather puts and
gets (one object from many buffers, exact bytes), per-item outcomes, metadata-only
descriptions, the paged key listing, and remove with and without force."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mooncake_store import (
    BufferTooSmallError,
    ChecksumMismatchError,
    Client,
    ObjectHasLeaseError,
    ObjectNotFoundError,
    PutResult,
)


@pytest.fixture(scope="module", params=["shm", "tcp"])
def store(request, cluster):
    with Client(cluster.master_address, local_shm=request.param == "shm") as client:
        client.path = request.param
        yield client


def test_parts_are_stored_as_one_object_and_scattered_back(store):
    rng = np.random.default_rng(7)
    keys = [f"{store.path}/sg/{i}" for i in range(8)]
    parts = [
        [rng.integers(0, 256, n, dtype=np.uint8) for n in (256 * 1024, 1000, 3)]
        if i % 2
        else [rng.integers(0, 256, n, dtype=np.uint8) for n in (700_000, 900_000)]
        for i, _ in enumerate(keys)
    ]
    before = dict(store.counters)
    results = store.put_many_from_parts(list(zip(keys, parts, strict=True)))
    assert [r.replicas for r in results] == [1] * len(keys)
    writes = store.counters[f"{store.path}_writes"] - before[f"{store.path}_writes"]
    assert writes == len(keys)  # one object (one write) per key, not one per part
    for key, p in zip(keys, parts, strict=True):
        assert store.get(key) == b"".join(x.tobytes() for x in p)  # the concatenation
    outs = [[np.zeros_like(x) for x in p] for p in parts]
    sizes = store.get_many_into_parts(keys, outs)
    assert sizes == [sum(x.nbytes for x in p) for p in parts]
    for p, out in zip(parts, outs, strict=True):
        for want, got in zip(p, out, strict=True):
            assert np.array_equal(want, got)
    # Other part sizes of the same total work too: parts are just where the bytes go.
    whole = np.zeros(sizes[0], dtype=np.uint8)
    halves = [whole[: sizes[0] // 2], whole[sizes[0] // 2 :]]
    assert store.get_many_into_parts(keys[:1], [halves]) == sizes[:1]
    assert whole.tobytes() == b"".join(x.tobytes() for x in parts[0])


def test_outcomes_report_each_item(store):
    key = f"{store.path}/outcome"
    out = store.put_many_outcomes([(key, b"x" * 100)])
    assert isinstance(out[0], PutResult)
    small = [bytearray(10)]
    res = store.get_many_into_outcomes(
        [key, f"{store.path}/missing", key], [[bytearray(60), bytearray(40)], [bytearray(5)], small]
    )
    assert res[0] == 100
    assert isinstance(res[1], ObjectNotFoundError) and isinstance(res[2], BufferTooSmallError)
    with pytest.raises(ObjectNotFoundError):
        store.get_many_into_parts([f"{store.path}/missing"], [[bytearray(5)]])


def test_describe_and_list_keys(store):
    prefix = f"{store.path}/listed/"
    keys = [f"{prefix}{i}" for i in range(30)]
    store.put_many([(k, os.urandom(100 + i)) for i, k in enumerate(keys)])
    infos = store.describe_many([keys[3], prefix + "nope"])
    assert infos[1] is None and infos[0] is not None and infos[0].size_bytes == 103
    assert len(infos[0].replicas) == 1 and infos[0].replicas[0].tier == "DRAM"
    seen, cursor = [], ""
    while True:
        page, cursor = store.list_keys(prefix, cursor=cursor, limit=7)
        assert len(page) <= 7
        seen += page
        if not cursor:
            break
    assert sorted(k.key for k in seen) == sorted(keys)
    assert {k.key: k.size_bytes for k in seen}[keys[5]] == 105


def test_remove_without_force_refuses_a_leased_object(store):
    key = f"{store.path}/leased"
    store.put(key, b"v" * 10)
    assert store.get(key) == b"v" * 10  # grants a read lease (5 s)
    [err] = store.remove_many_outcomes([key], force=False)
    assert isinstance(err, ObjectHasLeaseError) and err.code == -706
    assert store.exists(key)
    assert store.remove_many_outcomes([key, key + "/none"], force=True)[0] is None
    assert isinstance(store.remove_many_outcomes([key], force=True)[0], ObjectNotFoundError)
    assert not store.exists(key)


def test_codes_are_mooncakes():
    assert ChecksumMismatchError.code == -801 and ObjectNotFoundError.code == -704


def test_ranged_reads_move_only_the_touched_chunks(store):
    rng = np.random.default_rng(11)
    big = rng.integers(0, 256, 3 * (1 << 20) + 777, dtype=np.uint8)  # four checksum chunks
    small = rng.integers(0, 256, 5000, dtype=np.uint8)
    key, key2 = f"{store.path}/ranged/big", f"{store.path}/ranged/small"
    store.put_many([(key, big), (key2, small)])
    session = store.read_session([key, key2, f"{store.path}/ranged/none"])
    assert isinstance(session.error(f"{store.path}/ranged/none"), ObjectNotFoundError)
    before = store.counters.get("range_bytes_fetched", 0)
    a, b, c = np.zeros(100, np.uint8), np.zeros(3000, np.uint8), np.zeros(10, np.uint8)
    out = store.get_ranges_into(
        session, [(key, [(a, (1 << 20) + 5), (b, (2 << 20) - 1000)]), (key2, [(c, 4990)])]
    )
    assert out == [[100, 3000], [10]]
    assert np.array_equal(a, big[(1 << 20) + 5 : (1 << 20) + 105])
    assert np.array_equal(b, big[(2 << 20) - 1000 : (2 << 20) + 2000])
    assert np.array_equal(c, small[4990:])
    fetched = store.counters.get("range_bytes_fetched", 0) - before
    if store.path == "tcp":  # one chunk for the first range, two for the second: not the whole
        assert fetched == 3 * (1 << 20) + 5000
    else:  # copied from the mapped pool: nothing fetched over the network
        assert fetched == 0
    bad = store.get_ranges_into(session, [(key2, [(c, 4995)])])
    assert isinstance(bad[0][0], ValueError)  # outside the object
    session.close()
