"""The speculative read's pure core (client/speculative.py): the location cache and the
acceptance rule, without a network."""

from __future__ import annotations

import threading

import pytest

from mooncake_store.client.speculative import CachedLocation, LocationCache, accepted, location_of
from mooncake_store.client.types import ReplicaList, ReplicaLocation
from mooncake_store.common.grant import Grant, GrantMode, sign_grant

SECRET = b"s" * 32
GEN = 1_700_000_000_000_001


def loc(segment: int = 5, offset: int = 4096, generation: int = GEN, tier: str = "DRAM",
        mode: GrantMode = GrantMode.READ) -> ReplicaLocation:  # fmt: skip
    grant = sign_grant(SECRET, Grant(segment, offset, 100, 0, mode, generation))
    return ReplicaLocation("node-0", segment, "127.0.0.1:1", "sock", offset, 100, grant, tier)


ENTRY = CachedLocation(5, 4096, GEN, 100, 0xABC)


def reply(*replicas: ReplicaLocation, size: int = 100, checksum: int = 0xABC) -> ReplicaList:
    return ReplicaList(size, checksum, list(replicas))


def test_an_entry_is_learnt_from_a_dram_replica_whose_grant_names_a_generation():
    assert location_of(loc(mode=GrantMode.WRITE), 100, 0xABC) == ENTRY  # a put's write grant
    assert location_of(loc(), 100, 0xABC) == ENTRY  # a read's grant
    assert location_of(loc(generation=0), 100, 0xABC) is None  # restored or adopted object
    assert location_of(loc(tier="NVME"), 100, 0xABC) is None
    assert location_of(loc(tier="GPU"), 100, 0xABC) is None


def test_the_acceptance_rule_needs_every_condition():
    assert accepted(ENTRY, reply(loc()), 0xABC)
    assert accepted(ENTRY, reply(loc(segment=9), loc()), 0xABC)  # any listed replica
    assert not accepted(ENTRY, reply(loc()), None)  # the copy failed
    assert not accepted(ENTRY, reply(loc()), 0xABD)  # the bytes copied hash to another value
    assert not accepted(ENTRY, reply(loc(), size=101), 0xABC)
    assert not accepted(ENTRY, reply(loc(), checksum=0xABD), 0xABD)  # put again, other bytes
    assert not accepted(ENTRY, reply(loc(generation=GEN + 1)), 0xABC)  # put again, same bytes
    assert not accepted(ENTRY, reply(loc(generation=0)), 0xABC)
    assert not accepted(ENTRY, reply(loc(offset=8192)), 0xABC)  # moved
    assert not accepted(ENTRY, reply(loc(segment=6)), 0xABC)
    assert not accepted(ENTRY, reply(), 0xABC)
    zero = CachedLocation(5, 4096, 0, 100, 0xABC)
    assert not accepted(zero, reply(loc(generation=0)), 0xABC)


def test_the_cache_is_bounded_least_recently_used_first():
    cache = LocationCache(capacity=3)
    for key in "abc":
        cache.put(key, ENTRY)
    assert cache.get("a") == ENTRY  # a is now the most recent
    cache.put("d", ENTRY)
    assert cache.get("b") is None and len(cache) == 3
    assert all(cache.get(k) == ENTRY for k in "acd")
    cache.drop(["a", "zz"])
    assert cache.get("a") is None and len(cache) == 2
    with pytest.raises(ValueError):
        LocationCache(capacity=0)


def test_the_cache_is_safe_to_share_between_threads():
    cache = LocationCache(capacity=500)

    def work(t: int) -> None:
        for i in range(2000):
            key = f"{t}/{i % 700}"
            cache.put(key, ENTRY)
            cache.get(f"{t}/{(i * 7) % 700}")
            if i % 5 == 0:
                cache.drop([key])

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(cache) <= 500
