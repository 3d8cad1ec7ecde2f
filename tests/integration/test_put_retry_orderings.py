"""A put retried after a lost reply, with the lost try's PutEnd arriving late: on an in-process
cluster, the first PutEnd "times out" at the client and reaches the master only after the
retry's PutStart took the lost try's place (client/put_attempts.py), before the retry wrote a
byte.  That PutEnd names the lost try's generation, so it ends nothing: the retry writes,
commits and reports success, and nothing is visible before it does."""

from __future__ import annotations

import pytest

from mooncake_store import Client, MasterTimeoutError, MooncakeError, ObjectNotFoundError
from mooncake_store.client.sync_client import Client as SyncClient
from mooncake_store.cluster_inprocess import InProcessCluster


@pytest.mark.parametrize("retried", ["same value", "another value"])
def test_the_lost_trys_late_put_end_ends_nothing_and_the_retry_commits(
    tmp_path, monkeypatch, retried
):
    key, first = "late-put-end", b"first value " * 4000
    second = first if retried == "same value" else b"other value " * 4000
    with InProcessCluster(tmp_path, nodes=1, dram="32MiB") as cluster:
        servicer = cluster.master.server._servicer
        held: list = []  # [the first PutEnd's request, then the master's late answer to it]
        seen_between: list = []
        passthrough = SyncClient._master_call_once

        def intercept(self, call, channel, meanwhile=None):
            if call.name == "BatchPutEnd" and not held:
                held.append(call.request)  # on its way by a slow path: no reply comes
                raise MasterTimeoutError("BatchPutEnd: it may or may not have taken effect")
            reply = passthrough(self, call, channel, meanwhile)
            if call.name == "BatchPutStart" and len(held) == 1:
                held.append(cluster.master.call(servicer.BatchPutEnd(held[0], None)))
                try:  # a reader in the window, before the retry wrote anything
                    seen_between.append(reader.get(key))
                except MooncakeError as exc:
                    seen_between.append(exc)
            return reply

        monkeypatch.setattr(SyncClient, "_master_call_once", intercept)
        with (
            Client(cluster.master_address, leases=False) as store,
            Client(cluster.master_address, leases=False) as reader,
        ):
            with pytest.raises(MasterTimeoutError):
                store.put(key, first)
            result = store.put(key, second)
            late = held[1].results[0]
            assert late.status.code == ObjectNotFoundError.code
            assert "replaced by its client's retry" in late.status.message
            [between] = seen_between
            assert isinstance(between, ObjectNotFoundError)
            assert result.replicas == 1 and not result.deduplicated
            assert reader.get(key) == second
            assert store.stats().counters["puts_superseded"] == 1
