"""The sync Client waits for replies by busy polling while one of its threads is in an
operation (client/busy_poll.py): the same results, the polls counted, and none when it is
turned off or another thread is in an operation too."""

from __future__ import annotations

import os
import threading

import pytest

from mooncake_store import Client, InvalidArgumentError, ObjectNotFoundError
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("busy-poll")
    with InProcessCluster(root, nodes=1, dram="64MiB", master_args=FAST_MASTER) as c:
        yield c


@pytest.mark.parametrize("local_shm", [False, True], ids=["tcp", "same-host"])
def test_replies_are_busy_polled_for_and_read_whole(cluster, local_shm):
    """(A master in this process shares the GIL with the polling thread, so polls here often
    see nothing in time and back off: what is asserted is that polls happen, the results are
    whole, and an operation that failed left the client polling.)"""
    with Client(cluster.master_address, local_shm=local_shm) as store:
        values = {f"bp/{local_shm}/{i}": os.urandom(65536 + i) for i in range(12)}
        for key, value in values.items():
            store.put(key, value)
        assert [store.get(k) for k in values] == list(values.values())
        counters = store.counters
        assert 0 <= counters["busy_poll_hits"] <= counters["busy_polls"]
        assert counters["busy_polls"] >= 1
        with pytest.raises(ObjectNotFoundError):
            store.get(f"bp/{local_shm}/missing")
        assert store._driving == 0  # the failed operation ended: the next ones may poll
        store.remove_many(list(values))


def test_turned_off_or_bad(cluster):
    with Client(cluster.master_address, busy_poll_us=0) as store:
        store.put("bp/off", b"x" * 5000)
        assert store.get("bp/off") == b"x" * 5000
        assert store.counters["busy_polls"] == 0
        store.remove("bp/off")
    with pytest.raises(InvalidArgumentError, match="busy_poll_us"):
        Client(cluster.master_address, busy_poll_us=-1)


def test_no_polling_while_another_thread_is_in_an_operation(cluster):
    """Two threads in operations at once would take turns on the GIL while polling: while
    another thread sits inside an operation, a get polls for nothing."""
    with Client(cluster.master_address, local_shm=False) as store:
        store.put("bp/shared", b"y" * 4096)
        inside, release = threading.Event(), threading.Event()

        def parked() -> bytes:  # an operation held open between two of its steps
            inside.set()
            release.wait(10)
            return b"z"

        store.get("bp/shared")  # this thread's sockets open
        blocker = threading.Thread(target=lambda: store._drive(_parked_flow(parked)))
        blocker.start()
        assert inside.wait(10)
        channel = store._local.channel
        asked = []
        receive = channel.receive
        channel.receive = lambda *a: asked.append(a[2]) or receive(*a)  # what the client asks
        try:
            assert store.get("bp/shared") == b"y" * 4096
        finally:
            release.set()
            blocker.join(10)
        store.get("bp/shared")
        assert asked[0] == 0.0 and asked[-1] > 0  # none while the other was inside; then again
        store.remove("bp/shared")


def _parked_flow(parked):
    """A flow with no steps that runs `parked` inside `_drive` (as an operation's local work
    does between its steps)."""
    return parked()
    yield  # a generator
