"""How the blocking client plans one node's share of a pipelined batch (pure)."""

from __future__ import annotations

from mooncake_store.client.transport import _READV_BYTES, plan_node_requests
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.grant import GRANT_BYTES
from mooncake_store.common.wire import MAX_READV_ENTRIES, Op


def transfer(op: Op, size: int, tier: str = "DRAM"):
    loc = ReplicaLocation("n", 1, "127.0.0.1:1", "", 0, size, b"g" * GRANT_BYTES, tier)
    return (loc, op, memoryview(bytearray(size)))


def test_dram_reads_travel_as_readv_and_the_rest_one_by_one():
    transfers = [
        transfer(Op.READ, 10),
        transfer(Op.READ, 20),
        transfer(Op.WRITE, 30),  # ends the group
        transfer(Op.READ, 40, tier="NVME"),  # staged tiers are read alone
        transfer(Op.READ, 50),
        transfer(Op.READ, 60),
    ]
    plan = plan_node_requests(transfers, list(range(6)), True)
    assert [items for _, _, items in plan] == [[0, 1], [2], [3], [4, 5]]
    assert plan[1][1] is transfers[2][2]  # a write carries its payload
    assert all(payload is None for _, payload, items in plan if items != [2])
    off = plan_node_requests(transfers, list(range(6)), False)
    assert [items for _, _, items in off] == [[i] for i in range(6)]


def test_readv_groups_are_capped_by_entries_and_bytes():
    many = [transfer(Op.READ, 1) for _ in range(MAX_READV_ENTRIES + 5)]
    plan = plan_node_requests(many, list(range(len(many))), True)
    assert [len(items) for _, _, items in plan] == [MAX_READV_ENTRIES, 5]
    big = [transfer(Op.READ, _READV_BYTES // 2 + 1) for _ in range(3)]
    plan = plan_node_requests(big, [0, 1, 2], True)
    assert [items for _, _, items in plan] == [[0], [1], [2]]  # each alone: a plain READ
