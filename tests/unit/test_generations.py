"""Put generations never repeat across masters of one data directory (master/generations.py),
even when the wall clock steps back between them."""

import pytest

from mooncake_store.common.daemon import StartupError
from mooncake_store.master.generations import (
    FLOOR_FILE,
    MARGIN,
    MAX_SEEN,
    RESERVE,
    GenerationFloor,
    first_generation,
    past_earlier_run,
)


def test_a_restarted_master_starts_above_the_last_one_even_with_the_clock_stepped_back(
    tmp_path,
):
    now = 1_800_000_000_000_000
    first = first_generation(tmp_path, now)
    assert first == now
    assert int((tmp_path / FLOOR_FILE).read_text()) == now + RESERVE
    again = first_generation(tmp_path, now - 60_000_000)  # restarted, the clock 60 s back
    assert again == now + RESERVE > first
    later = first_generation(tmp_path, again + RESERVE + 5)  # the clock ahead of the floor
    assert later == again + RESERVE + 5


def test_an_unreadable_floor_falls_back_to_the_clock(tmp_path):
    (tmp_path / FLOOR_FILE).write_text("not a number")
    assert first_generation(tmp_path, 42) == 42


def test_a_node_last_mounted_by_another_run_moves_the_start_past_what_it_saw():
    assert past_earlier_run(run=7, node_run=0, node_seen=0, next_generation=5) == MARGIN
    # A fresh node saw nothing: a master starting at the clock needs no move.
    assert past_earlier_run(run=7, node_run=0, node_seen=0, next_generation=10**15) == 0
    # No reply taken yet, but fences seen (its first mount reply was lost): another run's.
    assert past_earlier_run(7, node_run=0, node_seen=10**15, next_generation=5) == 10**15 + MARGIN
    assert past_earlier_run(run=7, node_run=7, node_seen=10**15, next_generation=5) == 0
    assert past_earlier_run(7, node_run=3, node_seen=10**15, next_generation=5) == 10**15 + MARGIN
    # Already past what the other run may have issued: nothing moves.
    assert past_earlier_run(7, node_run=3, node_seen=10**15, next_generation=10**15 + MARGIN) == 0
    with pytest.raises(ValueError, match="past any a master uses"):
        past_earlier_run(run=7, node_run=3, node_seen=MAX_SEEN, next_generation=5)
    # Only a move is bounded: a node that saw this master's own generations up there (or a
    # later run's floor past them) is mounted again.
    assert past_earlier_run(run=7, node_run=7, node_seen=MAX_SEEN, next_generation=5) == 0
    high = MAX_SEEN + MARGIN
    assert past_earlier_run(7, node_run=3, node_seen=MAX_SEEN, next_generation=high) == 0


def test_the_floor_is_written_again_before_generations_near_it_are_handed_out(tmp_path):
    floor = GenerationFloor(tmp_path)
    first = floor.start(1_000)
    assert int((tmp_path / FLOOR_FILE).read_text()) == first + RESERVE == floor.reserved
    floor.reserve(first + RESERVE // 4)  # well below the floor: nothing to write
    assert int((tmp_path / FLOOR_FILE).read_text()) == first + RESERVE
    ahead = first + RESERVE  # a node saw generations up there (a disk gone back in time)
    floor.reserve(ahead)
    assert int((tmp_path / FLOOR_FILE).read_text()) == ahead + RESERVE
    assert GenerationFloor(tmp_path).start(1_000) == ahead + RESERVE  # the next run: past


def test_a_floor_that_cannot_be_written_refuses(tmp_path):
    floor = GenerationFloor(tmp_path / "file")
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(StartupError, match="generation floor"):
        floor.start(1_000)
