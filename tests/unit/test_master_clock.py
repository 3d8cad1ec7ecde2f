"""The node reads grant expiries against the master's wall clock (node/master_clock.py): an
offset from its own monotonic clock, taken from each heartbeat reply."""

from mooncake_store.node.master_clock import MasterClock


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
