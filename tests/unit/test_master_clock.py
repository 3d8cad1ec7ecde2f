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
