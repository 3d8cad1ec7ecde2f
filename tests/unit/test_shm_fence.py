"""The write fences a node shows same-host clients in shared memory (common/shm_fence.py):
what a client reads admits exactly what the node's gate admits, and a client cannot write it."""

import mmap
import multiprocessing
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_store.common.grant import WriteFence
from mooncake_store.common.shm_fence import CAPACITY, PAGE_BYTES, FencePage, FenceView
from mooncake_store.node.write_gate import OPEN, WriteGate

SEG = 7
gens = st.integers(0, 1 << 40)
fences = st.builds(
    WriteFence, gens, st.frozensets(gens, max_size=12)
)  # fmt: skip


@pytest.fixture
def page_and_view():
    page = FencePage()
    readonly = os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY)  # as the node hands it out
    view = FenceView(readonly)
    yield page, view
    view.close()
    page.close()


def _mirrored_gate(page: FencePage) -> WriteGate:
    gate = WriteGate()
    gate.watcher = lambda seg, mount, pushed: page.publish(mount, pushed)
    return gate


@settings(max_examples=60, deadline=None)
@given(mount=fences, pushed=st.none() | fences, probes=st.lists(gens, max_size=20))
def test_a_client_admits_exactly_what_the_node_gate_admits(mount, pushed, probes):
    page = FencePage()
    view = FenceView(os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY))
    try:
        gate = _mirrored_gate(page)
        gate.close(SEG)
        assert not any(view.admits(g) for g in [*probes, 1, 1 << 62])  # closed: nothing
        gate.mounted(SEG, mount)
        if pushed is not None:
            gate.fenced(SEG, pushed, now_ms=0)
        candidates = [*probes, *mount.open, *(pushed.open if pushed else ()), mount.floor,
                      mount.floor + 1, max(0, mount.floor - 1)]  # fmt: skip
        for g in candidates:
            assert view.admits(g) == (not gate.ended(SEG, g)), g
    finally:
        view.close()
        page.close()


def test_open_lists_that_do_not_fit_admit_only_what_both_floors_admit(page_and_view):
    page, view = page_and_view
    gate = _mirrored_gate(page)
    many = frozenset(range(1000, 1000 + CAPACITY + 1))
    gate.mounted(SEG, WriteFence(5000 + CAPACITY, many))
    assert view.admits(5000 + CAPACITY) and view.admits(1 << 50)
    assert not view.admits(1000) and not gate.ended(SEG, 1000)  # refused: goes over TCP


def test_a_mount_reply_without_a_fence_admits_everything(page_and_view):
    page, view = page_and_view
    gate = _mirrored_gate(page)
    gate.mounted(SEG, OPEN)
    assert view.admits(0) and view.admits(12345)


def _flip(page: FencePage, fences: list[WriteFence], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for fence in fences:
            page.publish(fence, None)
            time.sleep(0.00002)  # steady for a moment: a reader gives up on none-steady pages


def test_a_reader_never_sees_a_fence_half_written(page_and_view):
    """Another process (the node) flips between two fences as fast as it can.  Both admit
    generation 500 (one by its open list, one by its floor); half of one and half of the other
    would not (the first's floor with the second's empty list)."""
    page, view = page_and_view
    by_list = WriteFence(1000, frozenset({500}))
    by_floor = WriteFence(400, frozenset())
    page.publish(by_list, None)
    writer = multiprocessing.get_context("fork").Process(
        target=_flip, args=(page, [by_floor, by_list], 5.0)
    )
    writer.start()
    try:
        deadline = time.monotonic() + 0.5
        reads = 0
        while time.monotonic() < deadline:
            assert view.admits(500)
            reads += 1
        assert reads > 100
    finally:
        writer.kill()
        writer.join()


def test_the_page_a_client_gets_cannot_be_mapped_for_writing(page_and_view):
    page, _ = page_and_view
    readonly = os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY)
    try:
        with pytest.raises(PermissionError):
            mmap.mmap(readonly, PAGE_BYTES, flags=mmap.MAP_SHARED)
    finally:
        os.close(readonly)


def test_the_page_a_client_gets_cannot_be_reopened_writable_nor_resized(page_and_view):
    """Found by review: memfd inodes are mode 0777, so a read-only descriptor could be reopened
    read-write through /proc and the page rewritten or truncated (SIGBUS for the node and
    every client).  The page is sealed once the node has mapped it."""
    page, view = page_and_view
    readonly = os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY)
    try:
        reopened = os.open(f"/proc/self/fd/{readonly}", os.O_RDWR)
        try:
            with pytest.raises(PermissionError):
                mmap.mmap(reopened, PAGE_BYTES, flags=mmap.MAP_SHARED)  # F_SEAL_FUTURE_WRITE
            with pytest.raises(PermissionError):
                os.write(reopened, b"\xff" * 8)
            with pytest.raises(PermissionError):
                os.ftruncate(reopened, 0)  # F_SEAL_SHRINK
        finally:
            os.close(reopened)
    finally:
        os.close(readonly)
    page.publish(WriteFence(7, frozenset()), None)  # the node's own mapping still writes
    assert view.admits(7) and not view.admits(6)


def test_a_gate_mounting_again_is_closed_to_copies_and_writes_until_the_mount_ends(page_and_view):
    page, view = page_and_view
    gate = _mirrored_gate(page)
    gate.mounted(SEG, WriteFence(100, frozenset()))
    gate.mounting(SEG, True)  # the mount may be new to the master: copies and writes stop
    assert not view.admits(150) and gate.ended(SEG, 150)
    gate.fenced(SEG, WriteFence(120, frozenset()), now_ms=0)  # a push meanwhile: still closed
    assert not view.admits(150) and gate.ended(SEG, 150)
    gate.mounting(SEG, False)  # the mount failed: its fences again
    assert view.admits(150) and not view.admits(110)
    assert not gate.ended(SEG, 150) and gate.ended(SEG, 110)


def test_a_closed_view_admits_nothing_and_closes_once(page_and_view):
    page, view = page_and_view
    page.publish(WriteFence(0, frozenset()), None)
    assert view.admits(5)
    view.close()
    view.close()
    assert not view.admits(5)


def test_a_node_shows_the_masters_clock_and_a_bad_value_never_breaks_the_page(page_and_view):
    """None before the node shows one (an older node, or no heartbeat reply yet); the master's
    wall clock once it does, as an offset from the monotonic clock a step of this host's wall
    clock leaves alone; a value no u64 holds is not shown, and leaves the page readable."""
    page, view = page_and_view
    assert view.master_now_ms() is None
    offset = time.time() * 1000 - time.monotonic() * 1000 - 90_000  # the master 90 s behind
    page.publish_clock(offset)
    assert abs(view.master_now_ms() - (time.time() * 1000 - 90_000)) < 50
    page.publish(WriteFence(3, frozenset({1})), None)  # fences leave the clock as it is
    assert abs(view.master_now_ms() - (time.time() * 1000 - 90_000)) < 50
    for absurd in (2.0**64, -5.0, 0.0):
        page.publish_clock(absurd)  # not shown: the last value stays
    assert abs(view.master_now_ms() - (time.time() * 1000 - 90_000)) < 50
    assert view.admits(3) and view.admits(1) and not view.admits(2)  # seq still even
    page.publish(WriteFence(5, frozenset()), None)
    assert view.admits(5) and not view.admits(3)
