"""Eviction policies: LRU order, and the weighted policy's frequency, chains and memory."""

from __future__ import annotations

import pytest

from mooncake_store.master.eviction import LruPolicy, WeightedPolicy, make_policy


def every(_key: str) -> bool:
    return True


def drain(policy, segment=0, evictable=every) -> list[str]:
    order = []
    while (key := policy.pick(segment, evictable)) is not None:
        order.append(key)
        policy.discard(key, segment)
    return order


def test_lru_order_and_evictability():
    p = LruPolicy()
    for k in "abcd":
        p.insert(k, 0)
    p.access("a")
    assert p.pick(0, lambda k: k != "b") == "c"
    assert drain(p) == ["b", "c", "d", "a"]


def test_weighted_keeps_frequently_read_blocks():
    p = WeightedPolicy(depth_cost=0)
    p.insert("hot", 0)
    for _ in range(3):
        p.access("hot")
    for k in ("new1", "new2", "new3"):
        p.insert(k, 0)
    assert drain(p)[-1] == "hot"


def test_weighted_evicts_leaves_before_their_parents():
    p = WeightedPolicy(depth_cost=0)
    p.insert("a", 0)
    p.insert("b", 0, parent="a")
    p.insert("c", 0, parent="b")
    p.insert("x", 0)  # newer, unrelated
    order = drain(p)
    assert order.index("c") < order.index("b") < order.index("a")


def test_weighted_orphans_go_first():
    p = WeightedPolicy(depth_cost=0)
    p.insert("a", 0)
    p.insert("b", 0, parent="a")
    p.insert("c", 0, parent="b")
    for _ in range(5):
        p.access("c")  # popular, but unreachable once its parent is gone
    p.insert("fresh", 0)
    p.discard("b", 0)  # its replica in this segment is gone (say, removed)
    assert p.pick(0, every) == "c"


def test_weighted_remembers_blocks_that_come_back():
    p = WeightedPolicy(depth_cost=0)
    p.insert("returning", 0)
    p.discard("returning", 0)  # evicted ...
    p.insert("returning", 0)  # ... and put again: proven reuse
    p.insert("once", 0)
    assert p.pick(0, every) == "once"
    assert WeightedPolicy(ghost_entries=0).ghost_size() == 0


def test_weighted_values_deeper_blocks_more():
    p = WeightedPolicy(depth_cost=0.5)
    chain = [f"b{i}" for i in range(4)]
    for i, k in enumerate(chain):
        p.insert(k, 0, parent=chain[i - 1] if i else "")
    p.insert("shallow", 0)
    p.discard("b3", 0)
    p.insert("b3", 0, parent="b2")  # re-put: same depth, now a returning block
    assert p.pick(0, every) == "shallow"


def test_weighted_respects_evictability_and_segments():
    p = WeightedPolicy()
    p.insert("k", 0)
    p.insert("k", 1)  # a second replica in another segment
    p.insert("j", 0)
    assert p.pick(0, lambda key: key != "k") == "j"
    p.discard("k", 0)
    assert p.pick(1, every) == "k"
    assert p.pick(0, every) == "j"
    assert p.pick(7, every) is None


def test_make_policy():
    assert make_policy("lru").name == "lru"
    assert make_policy("weighted", depth_cost=0.1).name == "weighted"
    with pytest.raises(ValueError, match="unknown eviction policy"):
        make_policy("fifo")


def test_weighted_fork_stays_a_parent_until_its_last_child_goes():
    p = WeightedPolicy(depth_cost=0.0)
    p.insert("root", 0)
    for child in ("left", "right", "mid"):
        p.insert(child, 0, parent="root")
    for _ in range(3):
        p.access("left")  # the children outlive the root's value, not its role as a parent
        p.access("right")
        p.access("mid")
    assert p.pick(0, every) != "root"  # a parent: a leaf goes first
    assert p.pick(0, lambda k: k == "root") == "root"  # unless no leaf may go
    order = drain(p, evictable=lambda k: True)
    assert order.index("root") == 3  # every child goes first, then the bare root


def test_weighted_block_in_two_segments_is_evicted_from_each():
    p = WeightedPolicy()
    p.insert("a", 0)
    p.insert("a", 1)
    p.insert("b", 1)
    assert p.pick(0, every) == "a"
    p.discard("a", 0)
    assert p.pick(0, every) is None  # gone from segment 0 only
    assert sorted(drain(p, segment=1)) == ["a", "b"]
