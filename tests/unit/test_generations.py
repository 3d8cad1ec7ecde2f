"""Put generations never repeat across masters of one data directory (master/generations.py),
even when the wall clock steps back between them."""

from mooncake_store.master.generations import FLOOR_FILE, RESERVE, first_generation


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
