"""Retries that know what they repeat: a stalled master, timeouts and the shared connection.

The master is stalled with SIGSTOP / SIGCONT (a real process, frozen as a GC pause, a swap
storm or an overloaded host would freeze it).  Liveness settings stay at their defaults, so the
nodes are not dropped while the master is frozen.
"""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from mooncake_store import AsyncClient, Client, MasterTimeoutError, ObjectBusyError
from mooncake_store.client.framed_channel import (
    BlockingFramedChannel,
    FramedChannel,
    FramedEndpoint,
)
from mooncake_store.cluster import LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import wait_until

STALL_S = 1.5


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    root = tmp_path_factory.mktemp("retries")
    with LocalCluster(root, nodes=1, dram="32MiB") as c:
        yield c


class Stall:
    """Freeze the master for `STALL_S` from the moment the first call named `method` is about
    to be sent (the fault is injected at the client so that it hits exactly that call)."""

    def __init__(self, cluster: LocalCluster, method: str) -> None:
        self.cluster = cluster
        self.method = method
        self.fired = threading.Event()
        self.resumed = threading.Event()

    def maybe_fire(self, name: str) -> None:
        if name != self.method or self.fired.is_set():
            return
        self.fired.set()
        assert self.cluster.master is not None
        self.cluster.master.signal(signal.SIGSTOP)

        def resume() -> None:
            assert self.cluster.master is not None
            self.cluster.master.signal(signal.SIGCONT)
            self.resumed.set()

        threading.Timer(STALL_S, resume).start()


@pytest.fixture
def stall_on(cluster, monkeypatch):
    """stall_on("BatchPutEnd") arms a Stall on both clients' framed channels."""
    stalls: list[Stall] = []
    blocking_send = BlockingFramedChannel.send  # the sync client's calls all go out here
    async_call = FramedChannel.call

    def blocking(self, name, request):
        for s in stalls:
            s.maybe_fire(name)
        return blocking_send(self, name, request)

    async def pipelined(self, name, request, timeout_s):
        for s in stalls:
            s.maybe_fire(name)
        return await async_call(self, name, request, timeout_s)

    monkeypatch.setattr(BlockingFramedChannel, "send", blocking)
    monkeypatch.setattr(FramedChannel, "call", pipelined)

    def arm(method: str) -> Stall:
        stall = Stall(cluster, method)
        stalls.append(stall)
        return stall

    yield arm
    for s in stalls:  # never leave the master frozen
        if s.fired.is_set():
            assert s.resumed.wait(10)


def test_sync_put_during_a_master_stall_at_put_end_reports_success(cluster, stall_on):
    """The PutEnd times out (1 s) while the master is frozen (1.5 s); it is retried, and the
    master answers the repeat as it answered the first: the put succeeded, and says so."""
    value = b"committed once" * 1000
    with Client(cluster.master_address, timeout_s=1.0) as store:
        stall = stall_on("BatchPutEnd")
        result = store.put("stalled-sync", value)
        assert stall.fired.is_set()
        assert result.replicas == 1 and not result.deduplicated
        assert store.exists("stalled-sync")
        assert store.get("stalled-sync") == value


def test_async_put_during_a_master_stall_at_put_end_reports_success(cluster, stall_on):
    value = b"committed once, async" * 1000

    async def run() -> None:
        async with AsyncClient(cluster.master_address, timeout_s=1.0) as store:
            stall = stall_on("BatchPutEnd")
            result = await store.put("stalled-async", value)
            assert stall.fired.is_set()
            assert result.replicas == 1 and not result.deduplicated
            assert await store.exists("stalled-async")
            assert await store.get("stalled-async") == value

    asyncio.run(run())


def started(store: Client) -> int:
    return store.stats().counters["puts_started"]


def test_a_put_retried_after_its_put_start_timed_out_takes_the_lost_ones_place(cluster, stall_on):
    """The PutStart times out (1 s) while the master is frozen (1.5 s); the master then starts
    that put, and nobody reads its reply.  Retried, the put names that attempt
    (client/put_attempts.py) and takes its place, instead of being refused as busy until the
    master reclaims it (30 s).  Another client's put of the key is still refused meanwhile."""
    key, value = "retried-start", b"retried after a lost reply" * 1000
    with (
        Client(cluster.master_address, timeout_s=1.0) as store,
        Client(cluster.master_address) as other,
    ):
        superseded, before = store.stats().counters["puts_superseded"], started(store)
        stall = stall_on("BatchPutStart")
        with pytest.raises(MasterTimeoutError, match="may or may not have taken effect"):
            store.put(key, value)
        assert stall.resumed.wait(10)
        wait_until(lambda: started(other) == before + 1, what="the lost PutStart to run")
        with pytest.raises(ObjectBusyError, match="in progress"):
            other.put(key, b"another value")
        result = store.put(key, value)
        assert result.replicas == 1 and not result.deduplicated
        assert store.get(key) == value
        assert store.stats().counters["puts_superseded"] == superseded + 1


def test_an_async_put_retried_after_its_put_start_timed_out_succeeds(cluster, stall_on):
    key, value = "retried-start-async", b"async retry" * 1000

    async def run() -> None:
        async with AsyncClient(cluster.master_address, timeout_s=1.0) as store:
            superseded = (await store.stats()).counters["puts_superseded"]
            stall = stall_on("BatchPutStart")
            with pytest.raises(MasterTimeoutError):
                await store.put(key, value)
            assert await asyncio.to_thread(stall.resumed.wait, 10)
            for _ in range(50):  # the lost PutStart runs once the master wakes up
                if (await store.stats()).processing:
                    break
                await asyncio.sleep(0.02)
            result = await store.put(key, value)
            assert result.replicas == 1 and not result.deduplicated
            assert await store.get(key) == value
            assert (await store.stats()).counters["puts_superseded"] == superseded + 1

    asyncio.run(run())


def test_a_remove_that_times_out_is_not_sent_again(cluster, stall_on):
    """A remove is not idempotent in what it reports (a repeat finds nothing to remove): after
    a timeout it raises MasterTimeoutError instead of being re-sent."""
    with Client(cluster.master_address, timeout_s=1.0) as store:
        store.put("to-remove", b"x" * 100)
        stall = stall_on("BatchRemove")
        with pytest.raises(MasterTimeoutError, match="may or may not have taken effect"):
            store.remove("to-remove")
        assert stall.resumed.wait(10)
        # It ran once the master woke up (durable, then applied); the same socket serves the
        # next calls (the late reply is skipped).
        wait_until(lambda: store.exists("to-remove") is False, what="the remove to apply")
        assert store.remove("to-remove") is False


def test_one_call_timing_out_leaves_the_shared_connection_and_other_calls_alone(cluster):
    """Two calls in flight on the async client's one framed connection; the first times out.
    The second is neither failed nor re-sent: the remove it carries runs once and reports True
    (re-sent, it would have found nothing left to remove and reported False)."""
    timeout_s = 3.0
    assert cluster.master is not None
    master = cluster.master

    async def run() -> None:
        async with AsyncClient(cluster.master_address, timeout_s=timeout_s) as store:
            await store.put("present", b"p" * 100)
            await store.put("doomed", b"d" * 100)
            channel = await store.flows.master_client().framed_channel()
            assert channel is not None
            master.signal(signal.SIGSTOP)
            try:
                start = time.monotonic()
                first = asyncio.ensure_future(store.exists("present"))  # times out, retried
                await asyncio.sleep(timeout_s / 2)
                second = asyncio.ensure_future(store.remove("doomed"))
                # Resume after the first call's deadline, well before the second's.
                await asyncio.sleep(max(0.0, start + timeout_s + 0.3 - time.monotonic()))
                assert not first.done() or first.exception() is None
            finally:
                master.signal(signal.SIGCONT)
            assert await second is True
            assert await first is True
            assert not channel.closed
            assert await store.flows.master_client().framed_channel() is channel
            assert await store.exists("doomed") is False

    asyncio.run(run())


def test_a_connection_the_master_closed_while_idle_is_replaced_not_failed(tmp_path, monkeypatch):
    """The master closes framed connections idle for --idle-timeout.  The next call on the
    sync client's TCP socket sees the close before sending, so even a call that is not safe to
    repeat (a remove) goes out on a new connection instead of failing as "may have taken
    effect" (over TCP a send to a closed peer succeeds; only the reply read fails)."""
    monkeypatch.setattr(FramedEndpoint, "unix_socket", lambda self: None)  # as from another host
    args = ["--idle-timeout", "1s"]
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=args) as idle:
        with Client(idle.master_address) as store:
            store.put("idle-1", b"x" * 100)
            store.put("idle-2", b"y" * 100)
            before = store.counters["framed_calls"]
            time.sleep(2.5)  # the master closes the idle connection meanwhile
            assert store.remove("idle-1") is True
            assert store.counters["framed_calls"] > before  # on the framed endpoint again
            time.sleep(2.5)
            assert store.remove("idle-2") is True


def test_a_sync_client_whose_sockets_are_numbered_above_1024_works(cluster, monkeypatch):
    """A process with many files open (an inference engine) gets socket numbers above
    FD_SETSIZE (1024), which select() cannot watch: x1's probe got "filedescriptor out of range
    in select()" from every call after the first on such a client."""
    monkeypatch.setattr(FramedEndpoint, "unix_socket", lambda self: None)  # the TCP socket
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 1200
    if hard != resource.RLIM_INFINITY and hard < want:
        pytest.skip(f"the hard limit on open files ({hard}) is below {want}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, want), hard))
    fillers: list[int] = []
    try:
        while not fillers or fillers[-1] < 1100:
            fillers.append(os.open(os.devnull, os.O_RDONLY))
        with Client(cluster.master_address, local_shm=False) as store:
            store.put("high-fd", b"h" * 100)
            assert store.get("high-fd") == b"h" * 100
            assert store.remove("high-fd") is True
            assert store.counters["framed_calls"] >= 3
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_put_whose_grants_a_master_restart_ended_is_put_again(tmp_path):
    """The master restarts between a put's PutStart and its write: the node, mounted again,
    refuses the earlier run's write grant ("write grant ended") and the put fails with no
    replica written.  The client then puts it once more from a new PutStart, on the new run,
    instead of failing a put that a retry stores (counted in `put_retries`)."""
    from mooncake_store.client.master_calls import MasterCall
    from tests.conftest import FAST_MASTER

    value = os.urandom(300_000)
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        with Client(cluster.master_address, local_shm=False) as store:
            call_master = store._master_call
            restarted: list[str] = []

            def restart_after_put_start(call: MasterCall) -> object:
                reply = call_master(call)
                if call.name == "BatchPutStart" and not restarted:
                    restarted.append(call.name)
                    cluster.master.stop()
                    cluster.start_master()  # same port and data: the node mounts again
                    cluster.wait_for_nodes(1)
                    time.sleep(1.0)  # past the new mount's hold
                return reply

            store._master_call = restart_after_put_start  # type: ignore[method-assign]
            store.put("across-a-restart", value)
            assert restarted and store.counters["put_retries"] == 1
            assert store.get("across-a-restart") == value


def test_a_put_right_after_a_master_restart_waits_for_its_nodes(tmp_path):
    """A restarted master has no node mounted until the nodes notice (a heartbeat or two): a
    put that comes first waits for them, instead of failing with "no store node is mounted"
    (the chaos harness counted ~90 such failed puts per master restart).  A master with no
    data to restore still refuses at once: nobody is expected."""
    from tests.conftest import FAST_MASTER

    value = os.urandom(200_000)
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        with Client(cluster.master_address) as store:
            store.put("before", value)
        cluster.master.stop()
        cluster.start_master()  # same data: it restores "before" and expects its node
        assert cluster.master.server.table.nodes_expected()
        with Client(cluster.master_address) as store:
            store.put("after", value)
            assert store.get("after") == value and store.get("before") == value


def test_a_put_end_repeated_on_a_restarted_master_reports_the_put_it_committed(tmp_path):
    """A PutEnd committed, its reply lost, and the master restarted before the client sent it
    again: the new run restored the object but cannot name the put that committed it, and
    answers the repeat "no put pending", a definite failure for a block that is stored (a
    chaos run counted one as a misreported put). The client puts it once more from a new
    PutStart instead, which finds the key stored with its bytes (deduplicated)."""
    from mooncake_store.client.master_calls import MasterCall
    from tests.conftest import FAST_MASTER

    value = os.urandom(200_000)
    with InProcessCluster(tmp_path, nodes=1, dram="16MiB", master_args=FAST_MASTER) as cluster:
        assert cluster.master is not None
        with Client(cluster.master_address, local_shm=False, leases=False) as store:
            call_master = store._master_call
            repeated: list[object] = []

            def lose_put_end_reply(call: MasterCall) -> object:
                reply = call_master(call)
                if call.name == "BatchPutEnd" and not repeated:
                    cluster.master.stop()  # the reply is lost with it
                    cluster.start_master()
                    cluster.wait_for_nodes(1)
                    time.sleep(1.0)  # past the new mount's hold
                    repeated.append(reply)
                    return call_master(call)  # sent again, as after a lost reply
                return reply

            store._master_call = lose_put_end_reply  # type: ignore[method-assign]
            result = store.put("committed-before-a-restart", value)
            assert repeated, "the PutEnd did not go through _master_call"
            assert result.deduplicated and store.counters["put_retries"] == 1
            assert store.get("committed-before-a-restart") == value
