"""The chaos report places lost blocks in time and by client (scripts/chaos.py), so that a
loss can be set beside the faults injected when those puts were acknowledged."""

from __future__ import annotations

import time

from tests.conftest import chaos_script


def _hms(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def test_lost_blocks_are_grouped_by_client_and_acknowledgement_window():
    chaos = chaos_script()
    t0 = 1_700_000_000.0
    lost = [("c1/7", t0 + 1), ("c1/3", t0), ("c1/9", t0 + 4.5),  # one window (gaps <= 5 s)
            ("c1/40", t0 + 60), ("c1/41", t0 + 61),  # a second, a minute later
            ("c0/2", t0 + 2)]  # fmt: skip
    windows = chaos.loss_windows(lost, gap_s=5.0)
    assert windows == [
        {"client": "c0", "count": 1, "first": _hms(t0 + 2), "last": _hms(t0 + 2)},
        {"client": "c1", "count": 3, "first": _hms(t0), "last": _hms(t0 + 4.5)},
        {"client": "c1", "count": 2, "first": _hms(t0 + 60), "last": _hms(t0 + 61)},
    ]
    assert chaos.loss_windows([]) == []


def test_a_run_keeps_its_token_file_in_its_own_directory(tmp_path, monkeypatch):
    from mooncake_store.common.credentials import local_token_path

    chaos = chaos_script()
    monkeypatch.delenv("MOONCAKE_TOKEN_DIR", raising=False)  # restored after the test
    directory = chaos.private_token_dir(str(tmp_path))
    assert directory == tmp_path / "tokens"
    assert local_token_path(4242).parent == tmp_path / "tokens"  # not ~/.config/mooncake
