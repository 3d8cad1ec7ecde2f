"""The retry policy's schedule: jittered within bounds, and the plain schedule on request."""

from __future__ import annotations

import itertools
import random

from mooncake_store import Retry
from mooncake_store.client.master_client import (
    exists_call,
    get_replica_list_call,
    put_end_call,
    put_revoke_call,
    put_start_call,
    remove_call,
)


def test_jittered_waits_stay_within_bounds_and_differ_between_clients():
    retry = Retry(attempts=8, backoff_s=0.05, max_backoff_s=1.0)
    schedules = [retry.delays(random.Random(seed)) for seed in range(20)]
    for waits in schedules:
        assert len(waits) == 7
        assert all(0.05 <= w <= 1.0 for w in waits)
        for previous, wait in itertools.pairwise(waits):
            assert wait <= max(previous * 3, 0.05)
    # Clients that lost the master together do not come back in lockstep.
    assert len({tuple(w) for w in schedules}) == len(schedules)
    assert len({w[0] for w in schedules}) > 10


def test_without_jitter_the_wait_doubles_up_to_the_cap():
    assert Retry(attempts=5, backoff_s=0.1, max_backoff_s=0.5, jitter=False).delays() == [
        0.1,
        0.2,
        0.4,
        0.5,
    ]
    assert Retry(attempts=1).delays() == []


def test_only_calls_that_are_safe_to_repeat_are_marked_idempotent():
    assert exists_call(["k"]).idempotent
    assert get_replica_list_call(["k"]).idempotent
    assert put_end_call([("k", 1, (), 0)]).idempotent  # the master answers a repeat the same way
    assert not put_start_call([]).idempotent  # a repeat finds its own put pending
    assert not remove_call(["k"]).idempotent  # a repeat reports "nothing to remove"
    assert not put_revoke_call(["k"]).idempotent  # a late repeat could revoke a later put
