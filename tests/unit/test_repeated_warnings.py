"""A node's repeated control failure is logged once, then at most every minute with a count."""

from __future__ import annotations

import logging

from mooncake_store.master.mover import RepeatedWarnings


def test_a_repeated_failure_is_said_once_then_every_interval_with_what_went_unsaid(caplog):
    now = [100.0]
    warnings = RepeatedWarnings(every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="mooncake.master")
    said = []
    for _ in range(240):  # a minute of ticks every 0.25 s
        said.append(warnings.warn("n1", "node %s did not take a write fence: %s", "n1", "why"))
        now[0] += 0.25
    assert said.count(True) == 1 and said[0]
    assert warnings.warn("n1", "node %s did not take a write fence: %s", "n1", "why")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "node n1 did not take a write fence: why",
        "node n1 did not take a write fence: why (239 more since it was last logged)",
    ]


def test_nodes_are_counted_apart_and_a_cleared_failure_is_said_again_at_once(caplog):
    now = [0.0]
    warnings = RepeatedWarnings(every_s=60.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="mooncake.master")
    assert warnings.warn("n1", "fence on %s failed", "n1")
    assert warnings.warn("n2", "fence on %s failed", "n2")  # another node: its own
    assert not warnings.warn("n1", "fence on %s failed", "n1")
    warnings.clear("n1")  # delivered again: the next failure is news
    now[0] += 1.0
    assert warnings.warn("n1", "fence on %s failed", "n1")
    assert [r.getMessage() for r in caplog.records] == [
        "fence on n1 failed",
        "fence on n2 failed",
        "fence on n1 failed",
    ]
