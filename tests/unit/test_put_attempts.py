"""A put retried after its reply was lost (client/put_attempts.py, master/puts.py `put_start`):
the retry names the pending put's attempt id with a higher retry count, and only then does it
revoke that put and start in its place.  A stranger, a stale try and a sealed put are refused
as before, and the lost try's late PutEnd or revoke, which name its generation, cannot end the
retry's put.  Pure: the master's table with an injected clock, and the client's record."""

import asyncio

import pytest

from mooncake_store.client.put_attempts import PutAttempts, unanswered
from mooncake_store.common.errors import (
    MasterTimeoutError,
    MasterUnavailableError,
    ObjectBusyError,
    ObjectNotFoundError,
)
from mooncake_store.master.columns import COMPLETE
from mooncake_store.master.object_table import ObjectTable, TableConfig
from tests.unit.test_allocation_lifecycle import ack_all
from tests.unit.test_object_table import Clock, MiB, beat, mount, used

ID = 0x1234_5678_9ABC_DEF0


@pytest.fixture
def table():
    t = ObjectTable(TableConfig(put_timeout_s=30), clock=Clock(), fence_writes=True)
    mount(t, "node-0", 100, 8 * MiB)
    ack_all(t)  # the node took the mount reply (as the master's server runs the table)
    yield t
    t.validate()


def test_a_retry_with_a_higher_count_revokes_the_lost_try_and_starts_anew(table):
    first = table.put_start("k", MiB, 1, attempt=ID, retry=0)
    assert table.pending_attempt("k") == ID
    second = table.put_start("k", MiB, 1, attempt=ID, retry=1)
    assert not second.already_exists and second.generation != first.generation
    assert table.counters["puts_superseded"] == 1 and table.counters["puts_revoked"] == 1
    assert used(table) == 2 * MiB  # the first try's extent waits for the nodes' write fence
    ack_all(table)
    assert used(table) == MiB
    with pytest.raises(ObjectBusyError):  # the first try's PutEnd, late: not its put any more
        table.put_start("k", MiB, 1, attempt=ID, retry=0)
    table.put_end("k", 7)
    table.commit_put_end("k")
    assert table.get("k").checksum == 7
    assert table.pending_attempt("k") == 0  # committed: forgotten
    assert not table._attempt


@pytest.mark.parametrize(
    "attempt, retry",
    [
        (0, 5),  # an older client: no id
        (ID + 1, 5),  # another put of the key (another client, another id)
        (ID, 2),  # a stale try of the same put, arriving after a later one
        (ID, 3),  # the same try again
    ],
)
def test_only_a_later_try_of_the_same_put_supersedes_it(table, attempt, retry):
    table.put_start("k", MiB, 1, attempt=ID, retry=3)
    with pytest.raises(ObjectBusyError, match="in progress"):
        table.put_start("k", MiB, 1, attempt=attempt, retry=retry)
    assert table.pending_attempt("k") == ID
    assert table.counters["puts_superseded"] == 0


def test_a_sealed_put_is_not_superseded_and_a_committed_one_deduplicates(table):
    """Its PutEnd came: the service waits for the commit (service_puts.py), then the retry
    finds the object stored."""
    table.put_start("k", MiB, 1, attempt=ID)
    table.put_end("k", 9)
    assert table.pending_attempt("k") == ID
    with pytest.raises(ObjectBusyError):
        table.put_start("k", MiB, 1, attempt=ID, retry=1)
    table.commit_put_end("k")
    assert table.put_start("k", MiB, 1, attempt=ID, retry=1).already_exists
    assert table.counters["puts_superseded"] == 0


@pytest.mark.parametrize("end", ["revoke", "reclaim", "owner"])
def test_a_put_that_ends_uncommitted_leaves_no_attempt_behind(table, end):
    table.put_start("k", MiB, 1, attempt=ID, owner=5)
    if end == "revoke":
        table.put_revoke("k")
    elif end == "reclaim":
        table._clock.now += 31
        beat(table)
        assert "k" in table.tick().reclaimed_puts
    else:
        table.revoke_owner(5)
    assert table.pending_attempt("k") == 0 and not table._attempt
    with pytest.raises(ObjectNotFoundError):
        table.put_end("k", 1)
    table.put_start("k", MiB, 1, attempt=ID + 1)  # a fresh put of the key is not busy
    assert table._attempt == {table._slot["k"]: (ID + 1, 0)}


def test_the_client_names_a_lost_attempt_again_with_a_higher_count_until_it_lands():
    attempts = PutAttempts()
    [(first, zero)] = attempts.start(["k"])
    assert first and zero == 0 and len(attempts) == 0
    assert attempts.start(["k"])[0][0] != first  # nothing lost: every put a new id
    attempts.lost("k", (first, 0))
    assert attempts.start(["k", "other"])[0] == (first, 1)  # taken: one try at a time
    assert len(attempts) == 0
    attempts.lost("k", (first, 2))
    attempts.lost("k", (first, 1))  # an earlier try reported late: the count stays
    assert attempts.start(["k"]) == [(first, 3)]
    attempts.lost("k", (0, 0))  # no attempt (an older path): nothing to keep
    assert len(attempts) == 0 and attempts.start(["k"])[0][0] != first


def test_the_client_keeps_a_bounded_number_of_lost_attempts():
    attempts = PutAttempts(max_kept=3)
    for n in range(5):
        attempts.lost(f"k{n}", (n + 1, 0))
    assert len(attempts) == 3
    assert attempts.start(["k0", "k1", "k2", "k4"])[2:] == [(3, 1), (5, 1)]
    assert attempts.start(["k0"])[0][0] != 1  # the oldest went first


def test_only_failures_that_may_have_taken_effect_are_unanswered():
    """No reply, a connection lost after sending, or the call abandoned while it was out."""
    for error in (MasterTimeoutError("late"), MasterUnavailableError("gone"),
                  asyncio.CancelledError(), KeyboardInterrupt(), GeneratorExit()):  # fmt: skip
        assert unanswered(error)
    assert not unanswered(ObjectBusyError("busy")) and not unanswered(ValueError("no"))


def test_the_lost_trys_late_put_end_cannot_seal_the_retry(table):
    """Its PutEnd was on its way when the retry took its place (it came over another
    connection, or late): sealing the retry's put with it would commit an extent nobody wrote
    yet under the lost try's checksum."""
    first = table.put_start("k", MiB, 1, attempt=ID, retry=0)
    second = table.put_start("k", MiB, 1, attempt=ID, retry=1)
    with pytest.raises(ObjectNotFoundError, match="replaced by its client's retry"):
        table.put_end("k", 7, generation=first.generation)
    assert table.pending_attempt("k") == ID and not table.exists("k")
    table.put_end("k", 8, generation=second.generation)
    table.commit_put_end("k")
    assert table.get("k").checksum == 8


def test_the_lost_trys_late_revoke_cannot_revoke_the_retry(table):
    first = table.put_start("k", MiB, 1, attempt=ID, retry=0)
    second = table.put_start("k", MiB, 1, attempt=ID, retry=1)
    with pytest.raises(ObjectNotFoundError, match="ended already"):
        table.put_revoke("k", first.generation)
    table.put_end("k", 8, generation=second.generation)
    table.commit_put_end("k")
    assert table.exists("k")


def test_a_put_end_or_revoke_naming_no_generation_ends_whichever_put_is_pending(table):
    """Older clients name none: what they did before (they send no attempt either, so no put
    of theirs is ever superseded)."""
    table.put_start("k", MiB, 1)
    table.put_revoke("k")
    table.put_start("k", MiB, 1)
    table.put_end("k", 3)
    table.commit_put_end("k")
    assert table.get("k").checksum == 3


def test_one_try_of_a_lost_attempt_at_a_time():
    """Two puts of a key whose attempt was lost (threads or tasks of one client): only the
    first names it; the other gets a new id and is refused as busy at the master, so that no
    record of the attempt can outlive the try that is writing."""
    attempts = PutAttempts()
    attempts.lost("k", (ID, 0))
    [b] = attempts.start(["k"])
    [d] = attempts.start(["k"])
    assert b == (ID, 1) and d[0] != ID and d[1] == 0
    attempts.lost("k", d)  # the other's call got no reply: its own id is kept, not B's
    assert attempts.start(["k"]) == [(d[0], 1)]


def test_a_concurrent_put_of_a_lost_key_cannot_revoke_the_try_being_written(table):
    attempts = PutAttempts()
    table.put_start("k", MiB, 1, attempt=ID, retry=0)  # the lost try
    attempts.lost("k", (ID, 0))
    [b], [d] = attempts.start(["k"]), attempts.start(["k"])
    table.put_start("k", MiB, 1, attempt=b[0], retry=b[1])  # B supersedes it and writes
    with pytest.raises(ObjectBusyError):  # D: a new id, refused while B is pending
        table.put_start("k", MiB, 1, attempt=d[0], retry=d[1])
    attempts.lost("k", d)
    [e] = attempts.start(["k"])
    with pytest.raises(ObjectBusyError):  # E names D's attempt, not B's
        table.put_start("k", MiB, 1, attempt=e[0], retry=e[1])
    assert table.pending_attempt("k") == ID


@pytest.mark.parametrize("ended", ["revoked", "reclaimed"])
def test_a_put_end_of_a_put_that_ended_cannot_seal_the_next_put_of_the_key(table, ended):
    """Not only retries: a client whose put was revoked or reclaimed while its PutEnd was on
    its way must not seal the put another client started for the key meanwhile."""
    mine = table.put_start("k", MiB, 1)
    if ended == "revoked":
        table.put_revoke("k", mine.generation)
    else:
        table._clock.now += 31
        beat(table)
        table.tick()
    theirs = table.put_start("k", MiB, 1)
    with pytest.raises(ObjectNotFoundError):
        table.put_end("k", 7, generation=mine.generation)
    table.put_end("k", 8, generation=theirs.generation)


def test_a_repeated_put_end_finds_its_own_put_not_another_of_the_same_bytes(table):
    """A repeated PutEnd (its first reply lost) is answered from the committed object only
    when that object is its put: a put reclaimed meanwhile, whose key another client then
    committed with the same bytes (maybe under another identity), is not reported stored."""
    mine = table.put_start("k", MiB, 1)
    table.put_revoke("k", mine.generation)  # reclaimed, or revoked as its connection closed
    theirs = table.put_start("k", MiB, 1)
    table.put_end("k", 5, generation=theirs.generation)
    table.commit_put_end("k")
    assert table.committed_as("k", 5, theirs.generation) == (COMPLETE, 1)
    assert table.committed_as("k", 5, mine.generation) is None
    assert table.committed_as("k", 5) == (COMPLETE, 1)  # naming no put: as before
