"""Replica placement: distinct nodes, most free first, best effort."""

from dataclasses import dataclass

from mooncake_store.master.placement import choose_segments


@dataclass
class Seg:
    node_id: str
    free_bytes: int
    largest_free: int


def test_distinct_nodes_most_free_first():
    segs = [Seg("a", 10, 10), Seg("b", 50, 50), Seg("c", 30, 30), Seg("b", 40, 40)]
    chosen = choose_segments(segs, 5, 3)
    assert [s.node_id for s in chosen] == ["b", "c", "a"]
    assert chosen[0].free_bytes == 50


def test_skips_segments_without_a_large_enough_hole():
    segs = [Seg("a", 100, 8), Seg("b", 20, 20)]
    assert [s.node_id for s in choose_segments(segs, 16, 2)] == ["b"]


def test_best_effort_and_empty():
    segs = [Seg("a", 100, 100)]
    assert len(choose_segments(segs, 10, 3)) == 1
    assert choose_segments(segs, 1000, 1) == []
