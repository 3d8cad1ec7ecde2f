"""Eviction policies: LRU order, and the weighted policy's frequency, chains and memory.

Policies know blocks by slot number (the object table's); `Names` gives each named block a
slot, as the table would, and passes the names along for the ghost table.
"""

from __future__ import annotations

import pytest

from mooncake_store.master.eviction import (
    LOST_PARENT,
    NO_PARENT,
    EvictionPolicy,
    LruPolicy,
    WeightedPolicy,
    make_policy,
)

S0, S1 = 1, 2  # segment ids (never 0)


class Names:
    """Named blocks over a policy: slot numbers handed out as the table does."""

    def __init__(self, policy: EvictionPolicy) -> None:
        self.policy = policy
        self.slots: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.free: list[int] = []

    def slot(self, name: str) -> int:
        if name not in self.slots:
            slot = self.free.pop() if self.free else len(self.names)  # dense, as the table
            self.slots[name], self.names[slot] = slot, name
        return self.slots[name]

    def insert(self, name: str, segment: int = S0, parent: str = "") -> None:
        if not parent:
            parent_slot = NO_PARENT
        else:
            parent_slot = self.slots.get(parent, LOST_PARENT)
        self.policy.insert(self.slot(name), segment, parent=parent_slot, key=name)

    def access(self, name: str) -> None:
        self.policy.access(self.slots[name])

    def discard(self, name: str, segment: int = S0, *, forget: bool = False) -> None:
        """Drop `name`'s replica in `segment`; `forget`: the block is gone (its slot freed)."""
        self.policy.discard(self.slots[name], segment, name)
        if forget:
            slot = self.slots.pop(name)
            del self.names[slot]
            self.free.append(slot)

    def pick(self, segment: int = S0, evictable=lambda name: True) -> str | None:
        slot = self.policy.pick(segment, lambda s: evictable(self.names[s]))
        return None if slot is None else self.names[slot]

    def drain(self, segment: int = S0, evictable=lambda name: True) -> list[str]:
        order = []
        while (name := self.pick(segment, evictable)) is not None:
            order.append(name)
            self.discard(name, segment)
        return order


def test_lru_order_and_evictability():
    p = Names(LruPolicy())
    for k in "abcd":
        p.insert(k)
    p.access("a")
    assert p.pick(S0, lambda k: k != "b") == "c"
    assert p.drain() == ["b", "c", "d", "a"]


def test_weighted_keeps_frequently_read_blocks():
    p = Names(WeightedPolicy(depth_cost=0))
    p.insert("hot")
    for _ in range(3):
        p.access("hot")
    for k in ("new1", "new2", "new3"):
        p.insert(k)
    assert p.drain()[-1] == "hot"


def test_weighted_evicts_leaves_before_their_parents():
    p = Names(WeightedPolicy(depth_cost=0))
    p.insert("a")
    p.insert("b", parent="a")
    p.insert("c", parent="b")
    p.insert("x")  # newer, unrelated
    order = p.drain()
    assert order.index("c") < order.index("b") < order.index("a")


def test_weighted_orphans_go_first():
    p = Names(WeightedPolicy(depth_cost=0))
    p.insert("a")
    p.insert("b", parent="a")
    p.insert("c", parent="b")
    for _ in range(5):
        p.access("c")  # popular, but unreachable once its parent is gone
    p.insert("fresh")
    p.discard("b", forget=True)  # its replica in this segment is gone (say, removed)
    assert p.pick() == "c"


def test_weighted_block_put_without_its_parent_goes_first():
    p = Names(WeightedPolicy(depth_cost=0))
    p.insert("old")
    p.insert("stray", parent="never-stored")  # nobody can reach it by prefix
    for _ in range(3):
        p.access("stray")
    assert p.pick() == "stray"


def test_weighted_remembers_blocks_that_come_back():
    p = Names(WeightedPolicy(depth_cost=0))
    p.insert("returning")
    p.discard("returning", forget=True)  # evicted ...
    p.insert("returning")  # ... and put again: proven reuse
    p.insert("once")
    assert p.pick() == "once"
    assert WeightedPolicy(ghost_entries=0).ghost_size() == 0


def test_weighted_values_deeper_blocks_more():
    p = Names(WeightedPolicy(depth_cost=0.5))
    chain = [f"b{i}" for i in range(4)]
    for i, k in enumerate(chain):
        p.insert(k, parent=chain[i - 1] if i else "")
    p.insert("shallow")
    p.discard("b3", forget=True)
    p.insert("b3", parent="b2")  # re-put: same depth, now a returning block
    assert p.pick() == "shallow"


def test_weighted_respects_evictability_and_segments():
    p = Names(WeightedPolicy())
    p.insert("k", S0)
    p.insert("k", S1)  # a second replica in another segment
    p.insert("j", S0)
    assert p.pick(S0, lambda key: key != "k") == "j"
    p.discard("k", S0)
    assert p.pick(S1) == "k"
    assert p.pick(S0) == "j"
    assert p.pick(7) is None


def test_make_policy():
    assert make_policy("lru").name == "lru"
    assert make_policy("weighted", depth_cost=0.1).name == "weighted"
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")
    with pytest.raises(ValueError, match="depth_cost"):
        WeightedPolicy(depth_cost=-1)


def test_weighted_fork_stays_a_parent_until_its_last_child_goes():
    p = Names(WeightedPolicy(depth_cost=0.0))
    p.insert("root")
    for child in ("left", "right", "mid"):
        p.insert(child, parent="root")
    for _ in range(3):
        p.access("left")  # the children outlive the root's value, not its role as a parent
        p.access("right")
        p.access("mid")
    assert p.pick() != "root"  # a parent: a leaf goes first
    assert p.pick(S0, lambda k: k == "root") == "root"  # unless no leaf may go
    order = p.drain()
    assert order.index("root") == 3  # every child goes first, then the bare root


def test_weighted_block_in_two_segments_is_evicted_from_each():
    p = Names(WeightedPolicy())
    p.insert("a", S0)
    p.insert("a", S1)
    p.insert("b", S1)
    assert p.pick(S0) == "a"
    p.discard("a", S0)
    assert p.pick(S0) is None  # gone from segment 0 only
    assert sorted(p.drain(S1)) == ["a", "b"]


def test_weighted_reused_slot_starts_fresh():
    """A slot freed by one block and handed to another keeps nothing of the first."""
    policy = WeightedPolicy(depth_cost=0)
    policy.insert(0, S0, key="parent")
    policy.insert(1, S0, parent=0, key="child")
    for _ in range(5):
        policy.access(1)
    policy.discard(1, S0, "child")  # the child goes; slot 1 is free
    policy.insert(1, S0, key="stranger")  # ... and now holds an unrelated block
    policy.insert(2, S0, key="newest")
    # The stranger has no reads and no parent: the oldest leaf with the lowest value; the
    # parent (a leaf again) is older still, so it goes first, then the stranger.
    assert policy.pick(S0, lambda s: True) == 0
    policy.discard(0, S0, "parent")
    assert policy.pick(S0, lambda s: True) == 1


def test_weighted_heaps_stay_bounded_under_rereads():
    """Reads and re-inserts leave stale heap entries; compaction keeps the heap near its
    live size."""
    policy = WeightedPolicy()
    for slot in range(100):
        policy.insert(slot, S0, key=f"k{slot}")
    for _ in range(50):
        for slot in range(100):
            policy.insert(slot, S0, key=f"k{slot}")  # a refresh: a new entry each
    assert len(policy._heaps[S0]) <= 2 * 100 + 1024 + 1
    seen = set()
    while (slot := policy.pick(S0, lambda s: True)) is not None:
        assert slot not in seen
        seen.add(slot)
        policy.discard(slot, S0, f"k{slot}")
    assert seen == set(range(100))


def test_weighted_heap_of_each_segment_stays_near_its_own_size_under_churn():
    """Removed blocks leave stale entries behind; each segment's heap is compacted against
    its own live count, so a cluster of many segments never holds several times its blocks
    in stale entries."""
    policy = WeightedPolicy()
    segments = list(range(1, 9))
    live: dict[int, int] = {}  # slot -> segment
    next_slot = 0
    for _round in range(40):
        for _ in range(500):  # put 500 new blocks, spread over the segments
            live[next_slot] = segments[next_slot % 8]
            policy.insert(next_slot, live[next_slot], key=f"k{next_slot}")
            next_slot += 1
        for slot in list(live)[:400]:  # ... and remove most of the older ones
            policy.discard(slot, live.pop(slot), f"k{slot}")
    for segment in segments:
        count = sum(1 for s in live.values() if s == segment)
        assert len(policy._heaps[segment]) <= 2 * count + 1024 + 1
    assert sum(len(h) for h in policy._heaps.values()) < 3 * len(live) + 8 * 1025
