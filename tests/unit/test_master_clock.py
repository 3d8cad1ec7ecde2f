"""The node reads grant expiries against the master's wall clock (node/master_clock.py): an
offset from its own monotonic clock, taken from each heartbeat reply."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from mooncake_store.common.errors import AccessDeniedError
from mooncake_store.common.grant import Grant, GrantMode, sign_grant
from mooncake_store.node.data_server import DataAccess
from mooncake_store.node.master_clock import STALE_OFFSET_MS, MasterClock


class Clocks:
    def __init__(self) -> None:
        self.mono = 100.0
        self.wall = 1_700_000_000.0


def test_before_any_reply_the_node_wall_clock_stands_in():
    c = Clocks()
    clock = MasterClock(lambda: c.mono, lambda: c.wall)
    assert clock.now_ms() == 1_700_000_000_000
    clock.observe(0, 99.0, 99.1)  # a master that sends no time changes nothing
    assert clock.now_ms() == 1_700_000_000_000


def test_the_master_clock_is_followed_through_steps_of_either_wall_clock():
    c = Clocks()
    clock = MasterClock(lambda: c.mono, lambda: c.wall)
    # The master's clock stands 60 s behind the node's; the reply took 10 ms both ways.
    clock.observe(1_699_999_940_000, 99.99, 100.01)
    assert clock.now_ms() == 1_699_999_940_000
    c.mono += 2.0
    c.wall -= 3600  # the node's wall clock steps back an hour: it plays no part
    assert clock.now_ms() == 1_699_999_942_000
    # The master's clock steps forward 60 s; the next reply carries it.
    clock.observe(1_700_000_002_000, 101.99, 102.01)
    assert clock.now_ms() == 1_700_000_002_000
    clock.observe(1_700_000_002_500, 103.0, 102.0)  # a reply before its request: ignored
    assert clock.now_ms() == 1_700_000_002_000


def test_a_node_takes_only_the_time_its_master_signed_for_this_request():
    """With a control key, the master's time in a heartbeat reply is signed over the request's
    nonce: a process answering on the master's port cannot set the node's clock back (old
    grants would work again), nor can a reply to an earlier request be replayed."""
    from mooncake_store.common.auth import master_time_signed, sign_master_time

    key, other = b"k" * 32, b"o" * 32
    signature = sign_master_time(key, "node-0", 7, 12345, 1_700_000_000_000)
    assert master_time_signed(key, "node-0", 7, 12345, 1_700_000_000_000, signature)
    assert not master_time_signed(key, "node-0", 7, 12345, 1_000, signature)  # another time
    assert not master_time_signed(key, "node-0", 7, 54321, 1_700_000_000_000, signature)  # replay
    assert not master_time_signed(key, "node-1", 7, 12345, 1_700_000_000_000, signature)
    assert not master_time_signed(key, "node-0", 8, 12345, 1_700_000_000_000, signature)
    assert not master_time_signed(other, "node-0", 7, 12345, 1_700_000_000_000, signature)
    assert not master_time_signed(key, "node-0", 7, 12345, 1_700_000_000_000, "")
    assert not master_time_signed(key, "node-0", 7, 12345, 1_700_000_000_000, "zz")


def test_a_slow_mount_reply_replaces_no_reading_but_slow_heartbeats_are_followed():
    """A mount that waited seconds for its master says little of when the reply left (off by
    up to half the wait): it seeds a clock that has no reading, and changes none that has.
    Heartbeat replies are always taken, however slow: else a master whose replies all took
    over a second would never be followed through a step of its clock."""
    c = Clocks()
    clock = MasterClock(lambda: c.mono, lambda: c.wall)
    clock.observe(1_699_999_910_000, 90.0, 100.0, mount=True)  # 10 s, and nothing better yet
    assert clock.now_ms() == 1_699_999_910_000 + 5_000
    clock.observe(1_699_999_910_000, 99.99, 100.01)  # a heartbeat replaces it
    assert clock.now_ms() == 1_699_999_910_000
    clock.observe(1_700_000_000_000, 98.0, 100.0, mount=True)  # a slow mount does not
    assert clock.now_ms() == 1_699_999_910_000
    clock.observe(1_700_000_001_000, 99.5, 100.5, mount=True)  # a quick one does
    assert clock.now_ms() == 1_700_000_001_000
    for i in range(10):  # heartbeats that each take 1.2 s, after a -90 s step of the master
        c.mono += 1.2
        clock.observe(1_699_999_911_000 + int(i * 1200), c.mono - 1.2, c.mono)
    assert clock.now_ms() == 1_699_999_911_000 + 9 * 1200 + 600  # half the last round trip


def test_control_requests_are_checked_against_the_masters_clock_not_the_nodes():
    """A node checks the stamp of the master's control requests (FenceWrites, Fetch, Release,
    a mount reply's fences) against its clock of the master: a master 90 s behind the node
    (a step, a skewed host) is still within the 60 s window, and a request replayed from a
    minute before is not."""
    import pytest

    from mooncake_store.common.auth import RequestVerifier, sign_request
    from mooncake_store.common.errors import AccessDeniedError

    c = Clocks()
    clock = MasterClock(lambda: c.mono, lambda: c.wall)
    master_now_s = c.wall - 90
    verifier = RequestVerifier(b"k" * 32, clock=lambda: clock.now_ms() / 1000)
    early = sign_request(b"k" * 32, "FenceWrites", b"body", master_now_s)
    with pytest.raises(AccessDeniedError, match=r"\+90s off the master's clock"):
        verifier.verify("FenceWrites", b"body", early)  # no reading yet: the node's own clock
    clock.observe(int(master_now_s * 1000), 99.99, 100.01)
    verifier.verify("FenceWrites", b"body", sign_request(b"k" * 32, "FenceWrites", b"body",
                                                         master_now_s))  # fmt: skip
    stale = sign_request(b"k" * 32, "FenceWrites", b"body", master_now_s - 61)
    with pytest.raises(AccessDeniedError, match="off the master's clock"):
        verifier.verify("FenceWrites", b"body", stale)


def test_a_reading_older_than_the_masters_heartbeat_ttl_is_stale_and_shown_as_such():
    """Replies can stop coming back while the master still hears the node (lost or late, a
    mount too slow to be taken).  The master gives away a put's extent once no reading a node
    writes under can be older than its heartbeat TTL, so past that the node's reading is stale:
    it refuses writes, and shows same-host clients a clock by which every grant has expired."""
    c = Clocks()
    clock = MasterClock(lambda: c.mono, lambda: c.wall)
    shown: list[float] = []
    clock.watcher = shown.append
    assert not clock.stale()  # no limit known yet (an older master sends none)
    clock.observe(1_700_000_000_000, 99.99, 100.01, mount=True, max_age_s=10.0)
    assert clock.max_age_s == 10.0 and shown == [1_700_000_000_000 - 100_000]
    c.mono = 109.9
    clock.show_if_stale()
    assert not clock.stale() and len(shown) == 1
    c.mono = 110.1  # ten seconds since the request that brought the reading was sent
    assert clock.stale()
    clock.show_if_stale()
    clock.show_if_stale()  # shown once
    assert shown[1:] == [STALE_OFFSET_MS]
    # A slow mount reply is not taken as a reading: still stale, but its limit applies.
    clock.observe(1_700_000_012_000, 110.2, 111.5, mount=True, max_age_s=20.0)
    assert clock.max_age_s == 20.0 and not clock.stale()  # 20 s since 99.99: not yet
    c.mono = 120.1
    assert clock.stale()
    clock.observe(1_700_000_020_100, 120.05, 120.15)  # a heartbeat reply: fresh again
    assert not clock.stale() and shown[-1] == 1_700_000_020_100 - 120_100
    c.mono = 200.0
    clock.observe(1_700_000_100_000, 199.9, 200.0, mount=True, max_age_s=0.0)  # no limit
    c.mono = 10_000.0
    assert not clock.stale()


def test_a_node_with_a_stale_reading_refuses_writes_and_still_serves_reads():
    access = DataAccess(b"s" * 32, ThreadPoolExecutor(1))
    access.dram[7] = memoryview(bytearray(1 << 16))
    expires = int(time.time() * 1000) + 60_000
    write = sign_grant(b"s" * 32, Grant(7, 0, 4096, expires, GrantMode.WRITE, 5))
    read = sign_grant(b"s" * 32, Grant(7, 0, 4096, expires, GrantMode.READ))
    assert access.check(write, 0, 4096, GrantMode.WRITE) == 7
    clock = access.gate.clock
    now = time.monotonic()
    clock.observe(int(time.time() * 1000), now - 12.0, now - 11.9, mount=True, max_age_s=10.0)
    with pytest.raises(AccessDeniedError, match="not had the master's time"):
        access.check(write, 0, 4096, GrantMode.WRITE)
    assert access.check(read, 0, 4096, GrantMode.READ) == 7  # a read's checksum is checked
    now = time.monotonic()
    clock.observe(int(time.time() * 1000), now - 0.01, now)
    assert access.check(write, 0, 4096, GrantMode.WRITE) == 7


def test_the_watch_shows_a_reading_stale_when_it_goes_stale_not_at_the_next_heartbeat():
    """The heartbeat loop can be blocked on the late replies that make the reading stale, and
    the master counts a reading only a second past its TTL: a thread of its own shows it."""
    clock = MasterClock()
    shown: list[float] = []
    clock.watcher = shown.append
    clock.start_watching()
    try:
        now = time.monotonic()
        clock.observe(int(time.time() * 1000), now - 0.7, now - 0.69, mount=True, max_age_s=1.0)
        deadline = time.monotonic() + 5
        while STALE_OFFSET_MS not in shown and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shown[-1] == STALE_OFFSET_MS
        assert time.monotonic() - now < 2.0  # at the TTL (0.3 s from here), not later
        now = time.monotonic()
        clock.observe(int(time.time() * 1000), now - 0.01, now)  # a fresh reading
        assert shown[-1] != STALE_OFFSET_MS and not clock.stale()
    finally:
        clock.stop_watching()


def test_the_watch_shows_a_limit_with_no_reading_as_stale_at_once():
    """A mount reply whose time was not taken (slow, with no reading yet) still sets the limit:
    with nothing to go by, the node is stale, and the watch says so instead of spinning."""
    clock = MasterClock()
    shown: list[float] = []
    clock.watcher = shown.append
    clock.start_watching()
    try:
        clock.observe(0, 0.0, 0.0, mount=True, max_age_s=5.0)  # no time in the reply
        deadline = time.monotonic() + 5
        while not shown and time.monotonic() < deadline:
            time.sleep(0.01)
        assert shown == [STALE_OFFSET_MS] and clock.stale()
    finally:
        clock.stop_watching()
