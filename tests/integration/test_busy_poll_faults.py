"""Busy polling under faults (client/busy_poll.py): a master frozen with SIGSTOP (a real
process) while a sync Client polls for its reply.  The poll window never outlasts the call's
timeout, and an interrupt while waiting leaves the channel in step for the next call."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from mooncake_store import Client, InvalidArgumentError, MasterTimeoutError
from mooncake_store.cluster import LocalCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(tmp_path_factory.mktemp("busy-faults"), nodes=1, dram="16MiB") as c:
        yield c


def _freeze(cluster: LocalCluster, seconds: float) -> threading.Timer:
    assert cluster.master is not None
    master = cluster.master
    master.signal(signal.SIGSTOP)
    timer = threading.Timer(seconds, master.signal, args=(signal.SIGCONT,))
    timer.start()
    return timer


def test_a_poll_window_longer_than_the_timeout_does_not_outlast_it(cluster):
    """busy_poll_us of 10 s with timeout_s 0.3: the remove times out while the master is still
    frozen (1.5 s).  Polling for the whole window, it waited for the thawed master instead."""
    with Client(cluster.master_address, timeout_s=0.3, busy_poll_us=10_000_000) as store:
        store.put("bpf/window", b"w" * 100)
        timer = _freeze(cluster, 1.5)
        try:
            with pytest.raises(MasterTimeoutError):
                store.remove("bpf/window")
        finally:
            timer.join()
        store.remove("bpf/window")


@pytest.mark.parametrize("busy_poll_us", [0, 3_000_000], ids=["reading", "polling"])
def test_an_interrupt_while_waiting_leaves_the_next_call_its_own_reply(cluster, busy_poll_us):
    """A KeyboardInterrupt while a call waits for its reply (polling, or blocked in the read):
    the next call must not take the interrupted call's late reply for its own (a remove would
    then fail as "may or may not have taken effect")."""

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    with Client(cluster.master_address, timeout_s=5.0, busy_poll_us=busy_poll_us) as store:
        store.put("bpf/interrupted", b"i" * 100)
        previous = signal.signal(signal.SIGALRM, interrupt)
        timer = _freeze(cluster, 0.6)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            with pytest.raises(KeyboardInterrupt):
                store.exists("bpf/interrupted")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
            timer.join()
        assert store.remove("bpf/interrupted") is True
        assert store._driving == 0


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 2.5, "250", True, -1])
def test_a_bad_window_is_refused(cluster, bad):
    """A non-integer window is refused (inf or nan polled a silent socket forever, past any
    timeout)."""
    with pytest.raises(InvalidArgumentError, match="busy_poll_us"):
        Client(cluster.master_address, busy_poll_us=bad)


def test_an_interrupt_in_a_pipelined_node_exchange_leaves_no_reply_for_the_next(cluster):
    """Found by review: an interrupt while a batch's replies were being read left the node
    socket open with replies unread, and the thread's next exchange read one of them as its
    own (a WRITE could take an earlier request's OK).  Now every socket the batch used is
    dropped, and the next operations get their own replies."""
    import mooncake_store.client.tcp_blocking as tcp_blocking

    with Client(cluster.master_address, local_shm=False) as store:
        values = {f"bpf/many/{i}": bytes([i]) * 50_000 for i in range(4)}
        store.put_many(values)
        real = tcp_blocking._recv_exactly
        calls = {"n": 0}

        def interrupted(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2:  # mid-batch: the first reply read, the others not
                raise KeyboardInterrupt
            return real(*args, **kwargs)

        tcp_blocking._recv_exactly = interrupted
        try:
            with pytest.raises(KeyboardInterrupt):
                store.get_many(list(values))
        finally:
            tcp_blocking._recv_exactly = real
        assert calls["n"] >= 2
        assert store.get_many(list(values)) == list(values.values())
        again = {f"bpf/many/again/{i}": bytes([9 - i]) * 50_000 for i in range(4)}
        store.put_many(again)
        assert store.get_many(list(again)) == list(again.values())
