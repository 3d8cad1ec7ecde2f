"""The master's busy poll (common/loop_spin.py): it spins only after a request that came close
behind the one before, for its window, and then parks."""

from __future__ import annotations

import asyncio

from mooncake_store.common.loop_spin import LoopSpinner, spins


def test_the_rule_spins_only_for_requests_close_behind_another():
    assert spins(10.0004, 10.0, 0.0005)
    assert spins(10.00049, 10.0, 0.0005)
    assert not spins(10.0006, 10.0, 0.0005)  # too far apart: a spin would not have caught it
    assert not spins(10.0001, float("-inf"), 0.0005)  # the first request
    assert not spins(10.0, 10.0, 0.0)  # off


def test_the_spinner_turns_the_loop_during_its_window_then_parks():
    now = [100.0]
    spinner = LoopSpinner(0.001, clock=lambda: now[0])

    async def run() -> tuple[int, int, int, int]:
        spinner.activity()  # the first request: no spin
        await asyncio.sleep(0.01)
        idle = spinner.turns
        now[0] += 0.0005
        spinner.activity()  # close behind it: spin for a millisecond of the clock
        await asyncio.sleep(0.01)
        spinning = spinner.turns
        now[0] += 0.002  # the window is over: it parks at its next turn
        await asyncio.sleep(0.01)
        parked = spinner.turns
        await asyncio.sleep(0.02)
        still = spinner.turns
        now[0] += 0.5
        spinner.activity()  # long after: no spin
        await asyncio.sleep(0.01)
        assert spinner.turns == still
        await spinner.stop()
        spinner.activity()
        now[0] += 0.0001
        spinner.activity()  # stopped: never again
        await asyncio.sleep(0.01)
        assert spinner.turns == still and spinner._task is None
        return idle, spinning, parked, still

    idle, spinning, parked, still = asyncio.run(run())
    assert idle == 0
    assert spinning > 10  # the loop kept turning while the clock stood inside the window
    assert parked == still  # and stopped once it left it
    assert spinner.spins == 1


def test_the_master_flag_takes_a_duration_up_to_ten_milliseconds():
    import pytest

    from mooncake_store.common.errors import InvalidArgumentError
    from mooncake_store.master.config import MasterConfig

    assert MasterConfig().busy_poll_s == 0.0  # off by default
    assert MasterConfig(busy_poll_s=0.0004).busy_poll_s == 0.0004
    with pytest.raises(InvalidArgumentError, match="--busy-poll must be between 0"):
        MasterConfig(busy_poll_s=0.02)
