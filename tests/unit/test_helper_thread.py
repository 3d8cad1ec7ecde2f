"""The process's helper threads (common/helper_thread.py) and the TCP send that hashes its
payload on one while it is sent (client/tcp_wire.py write_hashed)."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import threading

import numpy as np
import pytest

from mooncake_store.client import tcp_wire
from mooncake_store.common.checksum import CHUNK_BYTES, ChunkedHasher, checksum
from mooncake_store.common.helper_thread import HelperThread


def test_a_job_runs_on_the_helper_and_wait_returns_its_result():
    helper = HelperThread("test-helper")
    ran_on: list[str] = []
    assert helper.start(lambda: ran_on.append(threading.current_thread().name) or 42)
    assert helper.busy
    assert helper.wait() == 42
    assert ran_on == ["test-helper"] and not helper.busy and helper.jobs == 1


def test_a_busy_helper_refuses_at_once_and_a_failed_job_raises_in_wait():
    helper = HelperThread("test-helper")
    release = threading.Event()
    assert helper.start(release.wait)
    assert not helper.start(lambda: 1)  # never queues behind another caller's job
    release.set()
    assert helper.wait() is True

    def failing() -> None:
        raise OSError("bad page")

    assert helper.start(failing)
    with pytest.raises(OSError, match="bad page"):
        helper.wait()
    assert not helper.busy and helper.start(lambda: "again") and helper.wait() == "again"


def _in_child(helper: HelperThread, out: multiprocessing.Queue) -> None:
    out.put(helper.start(os.getpid) and helper.wait())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_forked_child_gets_a_helper_thread_of_its_own():
    helper = HelperThread("test-helper")
    assert helper.start(os.getpid) and helper.wait() == os.getpid()
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = ctx.Queue()
    child = ctx.Process(target=_in_child, args=(helper, out))
    child.start()
    got = out.get(timeout=10)  # the parent's thread is not in the child: a hang without one
    child.join(10)
    assert got == child.pid and child.exitcode == 0


def _payload(size: int, seed: int = 3) -> memoryview:
    return memoryview(np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8))


class _Sink:
    """A `write` that keeps what it is given, and can be told to fail."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.data = bytearray()
        self.pieces: list[int] = []  # the length of each write
        self.fail_after = fail_after

    def __call__(self, piece: memoryview) -> None:
        if self.fail_after is not None and len(self.data) + len(piece) > self.fail_after:
            raise BrokenPipeError("peer went away")
        self.data += piece
        self.pieces.append(len(piece))


@pytest.mark.parametrize("size", [CHUNK_BYTES - 1, CHUNK_BYTES, 3 * CHUNK_BYTES + 4097])
def test_a_hashed_send_sends_every_byte_in_order_and_hashes_what_it_sent(size):
    payload = _payload(size)
    before = tcp_wire._SEND_HASH.jobs
    sink, hasher = _Sink(), ChunkedHasher()
    tcp_wire.write_hashed(sink, payload, hasher)
    assert bytes(sink.data) == payload.tobytes()
    assert hasher.intdigest() == checksum(payload)
    overlapped = tcp_wire._SEND_HASH.jobs - before
    assert overlapped == (1 if size >= tcp_wire.OVERLAP_MIN else 0)
    assert not tcp_wire._SEND_HASH.busy


def test_parts_of_any_length_hash_as_one_object():
    whole = _payload(5 * CHUNK_BYTES + 123)
    cuts = [0, 700_001, 700_001 + 2 * CHUNK_BYTES + 5, 4 * CHUNK_BYTES, len(whole)]
    parts = [whole[a:b] for a, b in itertools.pairwise(cuts)]
    sink, hasher = _Sink(), ChunkedHasher()
    tcp_wire.write_hashed(sink, parts, hasher)
    assert bytes(sink.data) == whole.tobytes() and hasher.intdigest() == checksum(whole)


def test_a_busy_helper_leaves_the_send_to_hash_in_steps():
    payload = _payload(2 * CHUNK_BYTES + 9)
    release = threading.Event()
    assert tcp_wire._SEND_HASH.start(release.wait)  # another thread's send holds it
    try:
        sink, hasher = _Sink(), ChunkedHasher()
        tcp_wire.write_hashed(sink, payload, hasher)
    finally:
        release.set()
        tcp_wire._SEND_HASH.wait()
    assert bytes(sink.data) == payload.tobytes() and hasher.intdigest() == checksum(payload)


def test_a_failed_send_raises_its_own_error_and_frees_the_helper():
    payload = _payload(2 * CHUNK_BYTES)
    with pytest.raises(BrokenPipeError, match="peer went away"):
        tcp_wire.write_hashed(_Sink(fail_after=CHUNK_BYTES), payload, ChunkedHasher())
    assert not tcp_wire._SEND_HASH.busy
    sink, hasher = _Sink(), ChunkedHasher()  # the next send overlaps again
    before = tcp_wire._SEND_HASH.jobs
    tcp_wire.write_hashed(sink, payload, hasher)
    assert tcp_wire._SEND_HASH.jobs == before + 1 and hasher.intdigest() == checksum(payload)


def test_a_failed_hash_fails_the_send():
    class Broken(ChunkedHasher):
        def update(self, data):  # type: ignore[override]
            raise MemoryError("no room to hash")

    with pytest.raises(MemoryError, match="no room to hash"):
        tcp_wire.write_hashed(_Sink(), _payload(2 * CHUNK_BYTES), Broken())
    assert not tcp_wire._SEND_HASH.busy


def test_every_step_of_a_send_is_at_most_a_chunk_so_a_socket_timeout_bounds_each():
    """A socket's timeout bounds one `sendall`: a value sent in one call would have to go out
    whole within it (a slow link fails a big put that steps of a chunk each pass)."""
    kept = tcp_wire.OVERLAP_MIN
    for hasher in (ChunkedHasher(), None):
        for overlap_min in (CHUNK_BYTES, 1 << 62):
            tcp_wire.OVERLAP_MIN = overlap_min
            sink = _Sink()
            try:
                tcp_wire.write_hashed(sink, _payload(5 * CHUNK_BYTES + 7), hasher)
            finally:
                tcp_wire.OVERLAP_MIN = kept
            assert sum(sink.pieces) == 5 * CHUNK_BYTES + 7
            assert max(sink.pieces) <= tcp_wire.SEND_STEP < 5 * CHUNK_BYTES


def test_after_a_send_nothing_holds_the_callers_buffer():
    """The helper keeps no reference to a payload once the send returns: the caller may resize
    or free its buffer (a bytearray that is still exported cannot be cleared)."""
    for size in (4 * CHUNK_BYTES, 3 * CHUNK_BYTES + 5):
        buffer = bytearray(_payload(size).tobytes())
        hasher = ChunkedHasher()
        before = tcp_wire._SEND_HASH.jobs
        tcp_wire.write_hashed(_Sink(), memoryview(buffer), hasher)
        assert tcp_wire._SEND_HASH.jobs == before + 1
        buffer.clear()  # BufferError while anything still holds a view of it


def test_an_interrupt_while_waiting_is_raised_only_once_the_job_has_ended():
    """A KeyboardInterrupt in `wait` (the helper still reading the caller's buffers) waits for
    the job to end, then raises, and the helper is free for the next caller."""
    import signal

    helper = HelperThread("test-helper")
    ended = threading.Event()

    def job() -> None:
        threading.Event().wait(0.3)
        ended.set()

    def interrupt(signum, frame):  # type: ignore[no-untyped-def]
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        assert helper.start(job)
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(KeyboardInterrupt):
            helper.wait()
        assert ended.is_set()  # not raised while the job ran
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert not helper.busy and helper.start(lambda: 7) and helper.wait() == 7


def _start_in_child(helper: HelperThread, out: multiprocessing.Queue) -> None:
    out.put((helper.busy, helper.start(os.getpid) and helper.wait()))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_a_child_forked_while_another_thread_holds_the_helper_gets_a_free_one():
    helper = HelperThread("test-helper")
    release = threading.Event()
    assert helper.start(release.wait)  # another thread's send holds it at the fork
    try:
        ctx = multiprocessing.get_context("fork")
        out: multiprocessing.Queue = ctx.Queue()
        child = ctx.Process(target=_start_in_child, args=(helper, out))
        child.start()
        busy_in_child, got = out.get(timeout=10)
        child.join(10)
    finally:
        release.set()
        helper.wait()
    assert busy_in_child is False and got == child.pid
