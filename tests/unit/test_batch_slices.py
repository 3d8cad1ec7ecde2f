"""A batch over the master's cap as slices (client/master_calls.py MasterCall.slices and
join; common/batching.py): pure, no network."""

from __future__ import annotations

import pytest

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.client.leases import put_end_leases_call
from mooncake_store.client.master_calls import exists_call, put_revoke_call, remove_call
from mooncake_store.common.batching import cap_in_message, too_many_message
from mooncake_store.common.errors import MasterTimeoutError, ObjectNotFoundError


def test_a_batch_within_the_cap_is_not_sliced_and_a_bigger_one_is_in_order() -> None:
    call = remove_call([f"k{i}" for i in range(10)], unless_leased=True)
    assert call.items() == 10 and call.slices(10) == []
    parts = call.slices(4)
    assert [list(p.request.keys) for p in parts] == [
        ["k0", "k1", "k2", "k3"], ["k4", "k5", "k6", "k7"], ["k8", "k9"]
    ]  # fmt: skip
    assert all(p.request.unless_leased and p.name == "BatchRemove" for p in parts)


def test_per_call_lists_go_with_the_first_slice_only() -> None:
    wanted = [pb.LeaseRequest(size_bytes=4096, replicas=1, count=8)]
    call = put_end_leases_call([(f"k{i}", i, (), 100 + i) for i in range(5)], wanted)
    parts = call.slices(2)
    assert [len(p.request.items) for p in parts] == [2, 2, 1]
    assert [len(p.request.next) for p in parts] == [1, 0, 0]  # leases asked for once
    assert [i.generation for p in parts for i in p.request.items] == [100, 101, 102, 103, 104]
    lease = pb.Lease(lease_id="L1")
    merged = call.join(parts, [([1, 1], [lease]), ([1, 1], []), ([1], [])])
    assert merged == ([1, 1, 1, 1, 1], [lease])


def test_a_revokes_generations_are_sliced_beside_its_keys() -> None:
    call = put_revoke_call([f"k{i}" for i in range(5)], [10, 11, 12, 13, 14])
    parts = call.slices(2)
    assert [list(p.request.keys) for p in parts] == [["k0", "k1"], ["k2", "k3"], ["k4"]]
    assert [list(p.request.generations) for p in parts] == [[10, 11], [12, 13], [14]]


def test_a_failed_slice_is_an_error_per_item_and_the_others_keep_their_outcomes() -> None:
    call = remove_call([f"k{i}" for i in range(5)])
    parts = call.slices(2)
    missing = ObjectNotFoundError("k4")
    timeout = MasterTimeoutError("no reply")
    merged = call.join(parts, [[None, None], timeout, [missing]])
    assert merged == [None, None, timeout, timeout, missing]
    with pytest.raises(MasterTimeoutError):  # every slice failed: the call fails
        call.join(parts, [timeout, timeout, timeout])
    with pytest.raises(KeyboardInterrupt):  # not a MooncakeError: never turned into outcomes
        call.join(parts, [[None, None], KeyboardInterrupt(), [None]])


def test_a_call_without_per_item_errors_fails_whole_when_a_slice_fails() -> None:
    call = exists_call([f"k{i}" for i in range(5)])
    parts = call.slices(3)
    merged = call.join(parts, [[True, False, True], [False, True]])
    assert merged == [True, False, True, False, True]
    with pytest.raises(MasterTimeoutError):
        call.join(parts, [[True, False, True], MasterTimeoutError("no reply")])


def test_the_cap_is_read_back_from_the_refusal() -> None:
    assert cap_in_message(too_many_message("BatchExists", 1000, 100)) == 100
    assert cap_in_message("key 'x' is not valid") is None
