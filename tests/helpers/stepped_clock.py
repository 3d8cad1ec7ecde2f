"""Run a daemon whose wall clock (`time.time`) can be stepped from outside, like an NTP step.

    python tests/helpers/stepped_clock.py OFFSET_FILE mooncake_store.master [daemon args...]

OFFSET_FILE holds a number of seconds added to `time.time()` (and `time.time_ns()`); a thread
rereads it every 20 ms, so writing the file steps the clock of the running daemon.  The
monotonic clock is left alone, as a real wall-clock step leaves it.  (libfaketime does the same
from outside; this needs no package.)
"""

from __future__ import annotations

import runpy
import sys
import threading
import time
from pathlib import Path

_offset_s = 0.0
_real_time = time.time
_real_time_ns = time.time_ns


def _read(path: Path) -> None:
    global _offset_s
    while True:
        try:
            _offset_s = float(path.read_text() or 0)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)


def _time() -> float:
    return _real_time() + _offset_s


def _time_ns() -> int:
    return _real_time_ns() + int(_offset_s * 1e9)


if __name__ == "__main__":
    offset_file, module, *args = sys.argv[1:]
    threading.Thread(target=_read, args=(Path(offset_file),), daemon=True).start()
    time.time = _time
    time.time_ns = _time_ns
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
