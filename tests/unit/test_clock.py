"""Monotonic <-> wall conversions at the master's edges (common/clock.py)."""

from __future__ import annotations

import math
import time

import pytest

from mooncake_store.common.clock import expiry_ms, to_monotonic, to_wall
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.persistence import _HEADER, decode_object, encode_object


def test_instants_convert_both_ways_and_never_and_forever_are_kept() -> None:
    now = time.monotonic()
    assert to_wall(now) == pytest.approx(time.time(), abs=0.5)
    assert to_monotonic(to_wall(now + 30)) == pytest.approx(now + 30, abs=1e-3)
    for special in (0.0, math.inf):
        assert to_wall(special) == special and to_monotonic(special) == special
    assert expiry_ms(now + 5) == pytest.approx((time.time() + 5) * 1000, abs=500)


def test_a_pin_is_stored_as_wall_time_and_restored_as_monotonic() -> None:
    pin = time.monotonic() + 600
    meta = ObjectMeta("k", 10, ObjectState.COMPLETE, (Replica(1, 0),), pin_until_s=pin)
    blob = encode_object(meta)
    assert decode_object("k", blob).pin_until_s == pytest.approx(pin, abs=1e-3)
    # What RocksDB holds is the wall-clock end, meaningful after a reboot resets monotonic time.
    stored_pin = _HEADER.unpack_from(blob)[8]
    assert stored_pin == pytest.approx(time.time() + 600, abs=0.5)
