"""Bad input and unreachable services give clear, specific errors and change nothing."""

from __future__ import annotations

import os
import socket

import numpy as np
import pytest

from mooncake_store import (
    BufferTooSmallError,
    Client,
    InvalidKeyError,
    InvalidValueError,
    MasterUnavailableError,
    NoSpaceError,
    ObjectNotFoundError,
)
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """One 16 MiB node, so 'full' is quick to reach."""
    with InProcessCluster(
        tmp_path_factory.mktemp("small"), nodes=1, dram="16MiB", master_args=FAST_MASTER
    ) as c:
        yield c


@pytest.fixture(scope="module")
def store(small):
    with Client(small.master_address) as client:
        yield client


@pytest.mark.parametrize(
    "key,match",
    [
        ("", "must not be empty"),
        ("k" * 1025, "limit is 1024"),
        (b"bytes-key", "must be a str"),
        (17, "must be a str"),
    ],
)
def test_bad_keys(store, key, match):
    with pytest.raises(InvalidKeyError, match=match):
        store.put(key, b"v")
    with pytest.raises(InvalidKeyError):
        store.get(key)
    with pytest.raises(ValueError):  # also a ValueError
        store.exists(key)


@pytest.mark.parametrize(
    "value,match",
    [
        ("text", r"bytes-like object .*encode str"),
        (12, "bytes-like object"),
        (b"", "is empty"),
        (np.zeros((4, 4))[:, 1], "C-contiguous"),
    ],
)
def test_bad_values(store, value, match):
    with pytest.raises(InvalidValueError, match=match):
        store.put("bad-value", value)
    assert not store.exists("bad-value")


def test_value_larger_than_any_pool(store):
    with pytest.raises(InvalidValueError, match="larger than any node's pool"):
        store.put("huge", bytes(17 << 20))
    with Client(store.master, max_value_bytes=1000) as capped:
        with pytest.raises(InvalidValueError, match="over max_value_bytes"):
            capped.put("capped", bytes(1001))
    assert store.stats().processing == 0


def test_missing_key_is_object_not_found_and_key_error(store):
    with pytest.raises(ObjectNotFoundError, match="no object under key 'missing'"):
        store.get("missing")
    with pytest.raises(KeyError):
        store.get_into("missing", bytearray(10))
    store.put("present", b"here")
    with pytest.raises(ObjectNotFoundError) as info:
        store.get_many(["present", "missing-1", "missing-2"])
    assert info.value.keys == ["missing-1", "missing-2"]


def test_get_into_buffer_checks(store):
    store.put("sized", os.urandom(5000))
    with pytest.raises(BufferTooSmallError, match="at least 5000 bytes"):
        store.get_into("sized", bytearray(4999))
    with pytest.raises(InvalidValueError, match="read-only"):
        store.get_into("sized", b"\0" * 5000)
    with pytest.raises(InvalidValueError):
        store.get_into("sized", "not a buffer")


def test_full_pool_evicts_and_is_no_space_only_when_everything_is_pinned(store):
    block = bytes(4 << 20)
    for i in range(10):  # 40 MiB through a 16 MiB pool: older blocks make room
        store.put(f"fill/{i}", block)
    kept = store.exists_many([f"fill/{i}" for i in range(10)])
    assert kept[-1] and not all(kept)
    assert store.stats().counters["evictions"] >= 6
    pinned = bytes((4 << 20) - (64 << 10))  # four fill the pool but for 256 KiB
    for i in range(4):
        store.put(f"pinned/{i}", pinned, pin=True)
    with pytest.raises(NoSpaceError, match="nothing can be evicted"):
        store.put("one-too-many", bytes(1 << 20))
    assert store.stats().processing == 0
    assert all(store.exists_many([f"pinned/{i}" for i in range(4)]))
    store.remove_many([f"pinned/{i}" for i in range(4)])
    store.put("after-full", block)
    assert store.get("after-full") == block


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_master_names_its_address():
    address = f"127.0.0.1:{_free_port()}"
    with pytest.raises(MasterUnavailableError, match=address):
        with Client(address, timeout_s=0.5):
            pass
    client = Client(address, timeout_s=0.5)
    try:
        with pytest.raises(MasterUnavailableError, match=address):
            client.put("k", b"v")
        with pytest.raises(ConnectionError):
            client.get("k")
    finally:
        client.close()


def test_bad_client_options():
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        Client("127.0.0.1:1", replicas=0)
    with pytest.raises(ValueError, match="timeout_s"):
        Client("127.0.0.1:1", timeout_s=0)


def test_get_many_with_a_missing_key_raises_for_the_batch(store):
    """As the README says: one missing key fails the whole get_many with ObjectNotFoundError
    naming it (nothing is returned for the others); exists_many first, or get() per key, when
    some may be missing."""
    store.put_many({"gm/a": b"1", "gm/b": b"2"})
    with pytest.raises(ObjectNotFoundError, match="gm/missing"):
        store.get_many(["gm/a", "gm/missing", "gm/b"])
    assert store.exists_many(["gm/a", "gm/missing"]) == [True, False]
    assert store.get_many(["gm/a", "gm/b"]) == [b"1", b"2"]
