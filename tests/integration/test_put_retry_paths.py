"""Every path on which a put can lose a reply keeps its attempt (client/put_attempts.py), so
that the retry takes the lost try's place instead of being refused as busy until the master
reclaims it (put_timeout_s, 30 s): the PutStart of a put healing a poisoned key, a put the
caller's own timeout cancelled mid-call, a revoke sent as slices of which one got no reply.
Found by a review of the first version; in-process cluster, replies lost at the client."""

from __future__ import annotations

import asyncio
import os

import pytest
import xxhash

from mooncake_store import AsyncClient, Client, MasterTimeoutError
from mooncake_store.client.master_client import MasterClient
from mooncake_store.client.sync_client import Client as SyncClient
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.integration.test_lifecycle import put_with_ends


@pytest.fixture
def cluster(tmp_path):
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB") as c:
        yield c


def _poison(cluster, key: str, value: bytes) -> None:
    """`key` committed with a wrong checksum: the next put of `value` heals it
    (client/put_items.py `heal_conflicts`, which sends its own PutStart)."""
    put_with_ends(cluster.master_address, key, value, xxhash.xxh3_64_intdigest(value) ^ 1)


@pytest.mark.parametrize("lost", ["heal PutStart", "heal PutEnd"])
def test_a_healing_put_whose_reply_was_lost_is_retried_without_busy(cluster, monkeypatch, lost):
    """heal_conflicts sends a PutStart of its own (put_items.py `start_puts`, as every put)."""
    key, value = "poisoned/retry", os.urandom(30_000)
    _poison(cluster, key, value)
    passthrough = SyncClient._master_call_once
    starts: list = []
    fired: list = []

    def intercept(self, call, channel, meanwhile=None):
        if call.name == "BatchPutStart":
            starts.append(call)
            reply = passthrough(self, call, channel, meanwhile)
            if lost == "heal PutStart" and len(starts) == 2 and not fired:
                fired.append(call)  # the master started the healing put; its reply is lost
                raise MasterTimeoutError("BatchPutStart: it may or may not have taken effect")
            return reply
        if call.name == "BatchPutEnd" and lost == "heal PutEnd" and not fired:
            fired.append(call)  # never reaches the master: the healing put stays pending
            raise MasterTimeoutError("BatchPutEnd: it may or may not have taken effect")
        return passthrough(self, call, channel, meanwhile)

    monkeypatch.setattr(SyncClient, "_master_call_once", intercept)
    with Client(cluster.master_address, leases=False) as store:
        with pytest.raises(MasterTimeoutError):
            store.put(key, value)
        assert fired
        assert starts[1].request.items[0].attempt != 0  # the heal names its attempt too
        result = store.put(key, value)  # takes the lost healing put's place
        assert result.replicas == 1
        assert store.get(key) == value


@pytest.mark.parametrize("method", ["BatchPutStart", "BatchPutEnd"])
def test_an_async_put_its_caller_cancelled_mid_call_is_retried_without_busy(
    cluster, monkeypatch, method
):
    """A caller's own timeout (asyncio.wait_for around put) cancels the flow while its call
    is out: a PutStart the master ran (the put starts there, nobody gets its grant), or a
    PutEnd not sent yet (the put stays pending, written, never ended).  A cancelled call counts
    as unanswered (put_attempts.py), so its attempt is kept and the retry takes its place."""
    key, value = f"cancelled/{method}", b"cancelled " * 3000
    real_run = MasterClient.run
    slow: list = []

    async def run(self, call):
        if call.name != method or slow:
            return await real_run(self, call)
        slow.append(call)
        reply = await real_run(self, call) if method == "BatchPutStart" else None
        await asyncio.sleep(30)  # the reply is late (or the call not sent): the caller gives up
        return reply

    monkeypatch.setattr(MasterClient, "run", run)

    async def scenario() -> None:
        async with AsyncClient(cluster.master_address, leases=False) as store:
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(store.put(key, value), 0.5)
            assert slow
            result = await store.put(key, value)  # takes the lost try's place
            assert result.replicas == 1
            assert await store.get(key) == value

    asyncio.run(scenario())


def test_a_revoke_slice_that_got_no_reply_keeps_the_attempt(tmp_path, monkeypatch):
    """A BatchPutRevoke over the master's cap goes as slices (MasterCall.beside); a slice that
    gets no reply reads as per-key errors: `_revoke` keeps those keys' attempts, so their
    retries take the place of the puts still pending."""
    from mooncake_store.client.writes import WriteFlows
    from mooncake_store.common.errors import DataPathError

    failing = [True]
    real_local, real_remote = WriteFlows._write_local, WriteFlows._write_remote

    def write_local(self, p):
        return False if failing[0] else real_local(self, p)

    def write_remote(self, pending):
        if not failing[0]:
            return (yield from real_remote(self, pending))
        for p in pending:  # every replica refused by its node: nothing landed
            p.failed = [loc.segment_id for loc in p.plan.replicas]
            p.error = DataPathError(f"writing {p.key!r} refused")
        return None

    monkeypatch.setattr(WriteFlows, "_write_local", write_local)
    monkeypatch.setattr(WriteFlows, "_write_remote", write_remote)
    passthrough = SyncClient._master_call_once
    dropped: list = []

    def intercept(self, call, channel, meanwhile=None):
        if call.name == "BatchPutRevoke" and len(call.request.keys) == 1 and failing[0]:
            dropped.append(list(call.request.keys))  # the second slice: no reply
            raise MasterTimeoutError("BatchPutRevoke: it may or may not have taken effect")
        return passthrough(self, call, channel, meanwhile)

    monkeypatch.setattr(SyncClient, "_master_call_once", intercept)
    keys = ["sliced/a", "sliced/b", "sliced/c"]
    with (
        InProcessCluster(
            tmp_path, nodes=1, dram="32MiB", master_args=["--max-batch-items", "2"]
        ) as cluster,
        Client(cluster.master_address, leases=False) as store,
    ):
        with pytest.raises(DataPathError):
            store.put_many([(k, b"v" * 5000) for k in keys])
        assert dropped == [["sliced/c"]]
        failing[0] = False
        assert store.put("sliced/a", b"v" * 5000).replicas == 1  # revoked: fine
        assert store.put("sliced/c", b"v" * 5000).replicas == 1  # takes the lost try's place


def test_a_repeated_put_end_naming_its_generation_still_reports_success(cluster):
    """The idempotent repeat of a committed put's PutEnd, naming the put's generation, is
    answered success (service_puts.py `_repeated_put_end` runs before the generation check)."""
    from mooncake_store.client.master_client import put_end_call
    from mooncake_store.client.types import PutSpec, Retry
    from mooncake_store.common.errors import OK
    from mooncake_store.common.grant import grant_generation
    from mooncake_store.common.wire import Op
    from tests.integration.test_lifecycle import send

    key, value = "repeat/generation", os.urandom(40_000)
    digest = xxhash.xxh3_64_intdigest(value)

    async def run():
        client = MasterClient(cluster.master_address, timeout_s=5, retry=Retry())
        try:
            [plan] = await client.put_start([PutSpec(key, len(value), 1)])
            loc = plan.replicas[0]
            assert send(loc, Op.WRITE, loc.offset, value) == OK
            gen = grant_generation(loc.grant)
            assert gen
            first = await client.run(put_end_call([(key, digest, [], gen)]))
            again = await client.run(put_end_call([(key, digest, [], gen)]))
            other = await client.run(put_end_call([(key, digest ^ 1, [], gen)]))
            return first, again, other
        finally:
            await client.close()

    first, again, other = asyncio.run(run())
    assert first == [1] and again == [1]
    assert isinstance(other[0], Exception)
