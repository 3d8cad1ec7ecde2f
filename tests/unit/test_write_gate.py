"""The node's write gate (node/write_gate.py): seals of written bytes, fences, pruning."""

from __future__ import annotations

import random

from mooncake_store.common.grant import WriteFence
from mooncake_store.node.write_gate import (
    ENDED,
    RECEIVING,
    SEALED,
    SealedRanges,
    WriteGate,
)

SEG = 7
LATER_MS = 10_000  # a grant expiry later than every `now_ms` below


def test_sealed_ranges_overlap_but_touching_is_not_overlap():
    ranges = SealedRanges()
    ranges.add(100, 200)
    assert ranges.overlaps(150, 160)
    assert ranges.overlaps(50, 101)
    assert ranges.overlaps(199, 300)
    assert ranges.overlaps(0, 1000)  # covers it
    assert not ranges.overlaps(0, 100)  # ends where it starts
    assert not ranges.overlaps(200, 300)  # starts where it ends
    assert not ranges.overlaps(150, 150)  # empty


def test_sealed_ranges_merge_adjacent_and_overlapping():
    ranges = SealedRanges()
    ranges.add(0, 10)
    ranges.add(20, 30)
    assert (ranges.starts, ranges.ends) == ([0, 20], [10, 30])
    ranges.add(10, 20)  # touches both: one range
    assert (ranges.starts, ranges.ends) == ([0], [30])
    ranges.add(40, 50)
    ranges.add(45, 60)  # overlaps: extended
    ranges.add(5, 25)  # inside: unchanged
    assert (ranges.starts, ranges.ends) == ([0, 40], [30, 60])
    ranges.add(0, 0)  # empty: nothing
    assert len(ranges) == 2


def test_sealed_ranges_agree_with_a_byte_map():
    rng = random.Random(11)
    ranges, written = SealedRanges(), [False] * 300
    for _ in range(400):
        start = rng.randrange(290)
        end = start + rng.randrange(1, 10)
        assert ranges.overlaps(start, end) == any(written[start:end])
        if rng.random() < 0.3:
            ranges.add(start, end)
            written[start:end] = [True] * (end - start)
        assert all(s < e for s, e in zip(ranges.starts, ranges.ends, strict=True))
        assert all(e < s for e, s in zip(ranges.ends, ranges.starts[1:], strict=False))


def write(gate: WriteGate, generation: int, start: int, end: int, now_ms: int = 0) -> str | None:
    """One complete write, as the data path makes it: refused (the reason) or sealed."""
    problem = gate.refusal(SEG, generation, start, end)
    if problem is None:
        gate.finish(gate.begin(SEG, generation, start, end, LATER_MS), now_ms)
    return problem


def test_a_grant_writes_each_byte_once_and_disjoint_pieces_all_work():
    gate = WriteGate()
    assert write(gate, 5, 0, 4096) is None
    assert write(gate, 5, 0, 4096) == SEALED  # the same bytes again
    assert write(gate, 5, 4000, 5000) == SEALED  # part of them
    assert write(gate, 5, 4096, 8192) is None  # the next block of the same grant
    assert write(gate, 5, 16384, 20480) is None  # another one, not adjacent
    assert write(gate, 6, 0, 4096) is None  # another put's grant is not this one's
    assert gate.sealed(SEG, 5) == [(0, 8192), (16384, 20480)]


def test_a_write_being_received_blocks_an_overlapping_one_and_a_failed_one_seals_nothing():
    gate = WriteGate()
    first = gate.begin(SEG, 5, 0, 100, LATER_MS)
    assert gate.refusal(SEG, 5, 50, 150) == RECEIVING
    assert gate.refusal(SEG, 5, 100, 200) is None  # disjoint: fine
    gate.abandon(first)  # the connection was lost mid-payload
    assert gate.sealed(SEG, 5) == []
    assert gate.generations() == 0
    assert write(gate, 5, 0, 100) is None  # so the client may send it again


def test_fences_end_generations_and_prune_their_seals():
    gate = WriteGate()
    for generation in (10, 11, 12):
        assert write(gate, generation, generation * 100, generation * 100 + 50) is None
    gate.fenced(SEG, WriteFence(12, frozenset({11})), now_ms=0)  # 10 ended, 11 still open
    assert gate.refusal(SEG, 10, 0, 1) == ENDED
    assert gate.sealed(SEG, 10) == []  # pruned: the fence refuses it anyway
    assert gate.sealed(SEG, 11) == [(1100, 1150)]  # kept: its grant still works elsewhere
    assert write(gate, 11, 1100, 1120) == SEALED
    assert write(gate, 11, 1150, 1160) is None
    assert gate.generations() == 2
    gate.fenced(SEG, WriteFence(13, frozenset()), now_ms=0)
    assert gate.generations() == 0


def test_seals_of_expired_grants_are_dropped():
    gate = WriteGate()
    gate.finish(gate.begin(SEG, 5, 0, 10, expires_ms=1_000), now_ms=0)
    gate.prune(SEG, now_ms=999)
    assert gate.generations() == 1
    gate.prune(SEG, now_ms=1_001)  # the node refuses the expired grant on its own
    assert gate.generations() == 0


def test_a_write_under_way_survives_a_prune_and_still_seals():
    gate = WriteGate()
    pending = gate.begin(SEG, 5, 0, 10, LATER_MS)
    gate.fenced(SEG, WriteFence(6, frozenset()), now_ms=0)  # ended while receiving
    assert gate.generations() == 1  # kept until the write is done
    gate.finish(pending, now_ms=0)
    gate.prune(SEG, now_ms=0)
    assert gate.generations() == 0


def test_a_mount_closes_then_fences_and_a_stale_push_cannot_reopen():
    gate = WriteGate()
    gate.close(SEG)
    assert gate.refusal(SEG, 1, 0, 1) == ENDED  # nothing before the mount reply
    gate.mounted(SEG, WriteFence(100, frozenset({90})))
    assert gate.refusal(SEG, 80, 0, 1) == ENDED  # issued before the mount
    assert gate.refusal(SEG, 90, 0, 1) is None  # a put the master still has open here
    assert gate.refusal(SEG, 100, 0, 1) is None  # issued after the mount
    # A push the master computed before the mount, delivered after it: it may end more, but
    # what the mount ended stays ended.
    gate.fenced(SEG, WriteFence(95, frozenset({80, 90})), now_ms=0)
    assert gate.refusal(SEG, 80, 0, 1) == ENDED
    assert gate.refusal(SEG, 90, 0, 1) is None
    # A new master mounts the node again: its generations start above every earlier
    # master's (master/generations.py), and its fence replaces the earlier ones.
    gate.mounted(SEG, WriteFence(1000, frozenset()))
    assert gate.refusal(SEG, 1000, 0, 1) is None and gate.refusal(SEG, 90, 0, 1) == ENDED


def test_seal_memory_is_swept_without_fences():
    gate = WriteGate()
    for generation in range(3000):  # puts whose grants expired, and no fence ever came
        gate.finish(gate.begin(SEG, generation, 0, 10, expires_ms=5), now_ms=10)
    assert gate.generations() <= 1024 + 1


def test_a_mount_reply_that_arrives_after_a_later_push_keeps_the_push():
    """Found by review: a repeated mount's reply, built while generation 90 was still open,
    arrived after the push that ended it (its room then another put's): the push stays."""
    gate = WriteGate()
    gate.mounted(SEG, WriteFence(100, frozenset()))
    gate.fenced(SEG, WriteFence(120, frozenset()), now_ms=0)  # ends 110 (open in the reply)
    gate.mounted(SEG, WriteFence(105, frozenset({110})))  # the late reply of a repeated mount
    assert gate.refusal(SEG, 110, 0, 1) == ENDED
    assert gate.refusal(SEG, 120, 0, 1) is None
    gate.mounted(SEG, WriteFence(5000, frozenset()))  # a new master: its floor is above
    assert gate.refusal(SEG, 130, 0, 1) == ENDED and gate.refusal(SEG, 5000, 0, 1) is None


def test_a_push_that_comes_after_a_later_one_reopens_nothing():
    """The master may have two pushes in flight to one node (a node's first fence goes out on
    its own): whichever arrives last, a generation the later push ended stays ended."""
    gate = WriteGate()
    gate.mounted(SEG, WriteFence(100, frozenset()))
    gate.fenced(SEG, WriteFence(130, frozenset({110})), now_ms=0)  # the later push: ends 120
    gate.fenced(SEG, WriteFence(125, frozenset({110, 120})), now_ms=0)  # the earlier one
    assert gate.refusal(SEG, 120, 0, 1) == ENDED and gate.refusal(SEG, 110, 0, 1) is None
    # One floor, two pushes: no put started between them, and the later one's open set is
    # the smaller; in either order only what both leave open stays open.
    gate.fenced(SEG, WriteFence(140, frozenset({110, 135})), now_ms=0)
    gate.fenced(SEG, WriteFence(140, frozenset({135})), now_ms=0)
    gate.fenced(SEG, WriteFence(140, frozenset({110, 135})), now_ms=0)
    assert gate.refusal(SEG, 110, 0, 1) == ENDED and gate.refusal(SEG, 135, 0, 1) is None
    assert gate.generation_seen == 140


def test_a_remount_the_node_serves_through_refuses_writes_until_its_reply_is_in():
    """Found by review (issue 14): during a mount the heartbeat port started (the node keeps
    serving), the gate admitted writes by its old fences.  A master to which the mount is new
    hands the node's room out 0.5 s after applying it, so an old grant's write arriving while
    the reply was still on its way could land in room another put had been given."""
    gate = WriteGate()
    gate.mounted(SEG, WriteFence(100, frozenset()))
    landing = gate.begin(SEG, 150, 0, 10, expires_ms=LATER_MS)  # admitted before the mount
    gate.mounting(SEG, True)
    assert gate.ended(SEG, 150)  # the data paths cut the write still landing off
    gate.abandon(landing)
    assert gate.refusal(SEG, 150, 20, 30) == ENDED  # an old grant's write meanwhile
    assert gate.refusal(SEG, 5000, 20, 30) == ENDED  # and a new master's (not granted yet)
    gate.mounted(SEG, WriteFence(5000, frozenset()))  # a new master's reply
    gate.mounting(SEG, False)
    assert gate.refusal(SEG, 150, 20, 30) == ENDED and gate.refusal(SEG, 5000, 20, 30) is None
    gate.mounting(SEG, True)
    gate.mounting(SEG, False)  # a mount that failed: the fences decide again
    assert gate.refusal(SEG, 5000, 40, 50) is None


def test_the_gate_remembers_the_highest_generation_it_saw_for_the_next_mount():
    gate = WriteGate()
    gate.close(SEG)  # a closed segment's fence is no generation anyone handed out
    assert gate.generation_seen == 0
    gate.mounted(SEG, WriteFence(100, frozenset({90})))
    assert gate.generation_seen == 100
    gate.fenced(SEG, WriteFence(120, frozenset({150})), now_ms=0)  # an open put up there
    assert gate.generation_seen == 150
    write = gate.begin(SEG, 160, 0, 1, LATER_MS)  # an admitted write of a later put
    gate.finish(write, now_ms=0)
    assert gate.generation_seen == 160
    gate.mounted(SEG, WriteFence(5, frozenset()))  # a master run whose disk went back
    assert gate.generation_seen == 160  # what was seen stays seen
