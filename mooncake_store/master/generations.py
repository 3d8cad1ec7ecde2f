"""Put generations that never repeat, across master restarts and wall-clock steps.

A write grant names its put's generation (common/grant.py); nodes end grants by generation
(node/write_gate.py), and same-host clients check the same fences before copying
(common/shm_fence.py).  A restarted master must therefore start above every generation an
earlier master of this data directory handed out, or a stale grant of the earlier master could
be admitted by the new mount's fence.  Starting from the wall clock in microseconds does that
only while the clock never steps back, so the master also keeps a floor in
`<data-dir>/generation-floor`: it starts at the later of the clock and that floor, and before
handing anything out it raises the floor by `RESERVE`, more generations than a master hands out
in its life (2^44: 200 days at a million puts a second), written durably.
"""

from __future__ import annotations

import os
from pathlib import Path

from mooncake_store.common.daemon import StartupError

RESERVE = 1 << 44
FLOOR_FILE = "generation-floor"


def first_generation(data_dir: Path, now_us: int) -> int:
    """The first generation of a master starting now on `data_dir` (and the floor raised past
    what it may use).  Raises StartupError when the floor cannot be written."""
    path = data_dir / FLOOR_FILE
    try:
        stored = int(path.read_text().strip())
    except (OSError, ValueError):
        stored = 0  # none yet (a new data directory), or unreadable: the clock alone
    first = max(now_us, stored)
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w") as out:
            out.write(f"{first + RESERVE}\n")
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
        directory = os.open(data_dir, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
    except OSError as exc:
        raise StartupError(
            f"cannot write {path} (the master's put generation floor): {exc}"
        ) from exc
    return first
