"""The rules of the lease stock (master/lease_stock.py): which leases minted ahead may still be
handed out, and how much a connection may have minted ahead for it."""

from __future__ import annotations

from mooncake_store.master.lease_stock import (
    FRESH_SHARE,
    MAX_CLASSES,
    MAX_PER_CLASS,
    LeaseStock,
    Stocked,
)

MiB = 1 << 20
CLS = (MiB, 1)


def lease(name: str, minted: float = 0.0, life: float = 10.0) -> Stocked:
    return Stocked(name, minted, minted + life, message=None)


def everything(_: Stocked) -> bool:
    return True


def test_a_class_is_stocked_only_once_asked_for_again():
    stock = LeaseStock()
    assert stock.take(7, CLS, 2, 0.0, everything) == ([], [], False)  # first ask: mint inline
    assert stock.wanted(7, CLS) == 2
    assert stock.take(7, CLS, 2, 0.0, everything) == ([], [], True)  # asked again: stock it
    assert stock.take(0, CLS, 2, 0.0, everything) == ([], [], False)  # no connection: never
    assert stock.take(7, CLS, 0, 0.0, everything) == ([], [], False)


def test_fresh_live_leases_are_handed_out_in_order_and_the_rest_released():
    stock = LeaseStock()
    stock.take(1, CLS, 3, 0.0, everything)
    assert stock.add(1, CLS, [lease("a"), lease("b"), lease("c")]) == []
    assert len(stock) == 3 and stock.wanted(1, CLS) == 0
    out, stale, _ = stock.take(1, CLS, 2, 1.0, everything)
    assert [x.lease_id for x in out] == ["a", "b"] and stale == []
    gone = {"c"}  # taken back (or its node left, or drains): released, not handed out
    out, stale, _ = stock.take(1, CLS, 2, 1.0, lambda x: x.lease_id not in gone)
    assert out == [] and stale == ["c"] and len(stock) == 0


def test_a_lease_past_its_fresh_share_is_released_not_handed_out():
    edge = 10.0 * (1 - FRESH_SHARE)  # a lease minted at 0 has exactly FRESH_SHARE left here
    for now, handed, released in [(edge, ["old", "new"], []), (edge + 0.01, ["new"], ["old"])]:
        stock = LeaseStock()
        stock.take(1, CLS, 2, 0.0, everything)
        stock.add(1, CLS, [lease("old", minted=0.0), lease("new", minted=2.0)])
        out, stale, _ = stock.take(1, CLS, 2, now, everything)
        assert [x.lease_id for x in out] == handed and stale == released


def test_the_stock_keeps_no_more_than_last_asked_and_few_classes():
    stock = LeaseStock()
    stock.take(1, CLS, 2, 0.0, everything)
    assert stock.add(1, CLS, [lease(f"x{i}") for i in range(5)]) == ["x2", "x3", "x4"]
    stock.take(1, CLS, 10**6, 0.0, everything)
    assert stock.wanted(1, CLS) == MAX_PER_CLASS
    for size in range(2, 2 + MAX_CLASSES):  # newer classes push the oldest out
        cls = (size, 1)
        stock.take(1, cls, 1, 0.0, everything)
        stock.add(1, cls, [lease(f"s{size}")])
    assert stock.wanted(1, CLS) == 0  # no longer asked for
    assert stock.add(1, CLS, [lease("late")]) == ["late"]  # minted meanwhile: released
    assert len(stock) == MAX_CLASSES


def test_a_class_pushed_out_by_newer_asks_releases_its_stock():
    stock = LeaseStock()
    stock.take(1, CLS, 1, 0.0, everything)
    stock.add(1, CLS, [lease("kept")])
    released = []
    for size in range(2, 2 + MAX_CLASSES):
        released += stock.take(1, (size, 1), 1, 0.0, everything)[1]
    assert released == ["kept"] and len(stock) == 0


def test_a_closed_connection_releases_its_stock_and_any_minted_later():
    stock = LeaseStock()
    stock.take(1, CLS, 2, 0.0, everything)
    stock.take(2, CLS, 1, 0.0, everything)
    stock.add(1, CLS, [lease("a"), lease("b")])
    stock.add(2, CLS, [lease("other")])
    assert sorted(stock.drop_owner(1)) == ["a", "b"]
    assert stock.wanted(1, CLS) == 0
    assert stock.add(1, CLS, [lease("late")]) == ["late"]  # a refill that ended after close
    assert len(stock) == 1 and stock.drop_owner(1) == []


def test_prune_releases_stale_and_unusable_leases():
    stock = LeaseStock()
    stock.take(1, CLS, 3, 0.0, everything)
    stock.add(1, CLS, [lease("stale", minted=0.0), lease("dead", minted=5.0),
                       lease("fresh", minted=5.0)])  # fmt: skip
    assert stock.prune(5.0, lambda x: x.lease_id != "dead") == ["stale", "dead"]
    out, _, _ = stock.take(1, CLS, 3, 5.0, everything)
    assert [x.lease_id for x in out] == ["fresh"]
    assert stock.prune(5.0, everything) == [] and len(stock) == 0
