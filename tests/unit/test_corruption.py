"""RecentChecks (master/corruption.py): a key whose replicas checked out is not checked again
for RECHECK_AFTER_S, only for that very object, and the memory it keeps is bounded."""

from __future__ import annotations

from mooncake_store.master import corruption
from mooncake_store.master.corruption import RECHECK_AFTER_S, RecentChecks


def test_a_passed_check_is_fresh_for_that_object_until_the_recheck_time() -> None:
    now = [100.0]
    recent = RecentChecks(clock=lambda: now[0])
    assert not recent.fresh("k", 1.0)
    recent.passed("k", 1.0)
    assert recent.fresh("k", 1.0)
    assert not recent.fresh("k", 2.0)  # put again since: a new object is checked
    now[0] += RECHECK_AFTER_S
    assert not recent.fresh("k", 1.0)
    recent.passed("k", 1.0)
    recent.forget("k")
    assert not recent.fresh("k", 1.0)


def test_recent_checks_forget_the_oldest_beyond_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(corruption, "MAX_REMEMBERED", 3)
    recent = RecentChecks(clock=lambda: 0.0)
    for key in "abcd":
        recent.passed(key, 0.0)
    assert [recent.fresh(k, 0.0) for k in "abcd"] == [False, True, True, True]
