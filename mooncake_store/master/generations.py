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

The floor lives on the master's disk, and a disk can go back in time: a host crash loses the
file's last write, an operator restores a backup.  A master started on such a disk starts where
an earlier master (the one that ran on the lost state) already handed generations out, and the
nodes still hold that master's fences and grants.  The nodes know better: each remembers the
highest generation it has seen (fences, admitted writes: node/write_gate.py) and which master
run mounted it last, and reports both when it mounts.  A node last mounted by another run makes
the master hand out generations from `MARGIN` past what the node saw (`past_earlier_run`): the
earlier run's grants the node has not seen yet were issued after what it saw, fewer than
`MARGIN` of them (a master fences its nodes every tick).  The master moves its floor past the
new start before it replies (`GenerationFloor.reserve`).
"""

from __future__ import annotations

import os
from pathlib import Path

from mooncake_store.common.daemon import StartupError

RESERVE = 1 << 44
MARGIN = 1 << 40  # generations an earlier run may have issued past what a node saw of it
MAX_SEEN = 1 << 62  # no report moves a master past here: the 64-bit space must not run out
FLOOR_FILE = "generation-floor"


def first_generation(data_dir: Path, now_us: int) -> int:
    """The first generation of a master starting now on `data_dir` (and the floor raised past
    what it may use).  Raises StartupError when the floor cannot be written."""
    return GenerationFloor(data_dir).start(now_us)


def past_earlier_run(run: int, node_run: int, node_seen: int, next_generation: int) -> int:
    """The generation this master run must hand out from, before it mounts a node that was
    last mounted by run `node_run` and saw generations up to `node_seen`: 0 when nothing needs
    to move (that was this run, or `next_generation` is past what that run may have issued
    already), else `MARGIN` past what the node saw.  `node_run` 0 (no mount reply taken yet,
    or an older master that sends none) counts as another run: a node whose first reply was
    lost may hold fences of a run that will not say so (a node that saw nothing needs no
    move: masters start at the clock in microseconds, far past `MARGIN`).  Raises
    ValueError when that move would take this run to `MAX_SEEN` or beyond: a report, not this
    master's own puts, is what is bounded (a node that saw this master's generations, however
    high, is always mounted again)."""
    if node_run == run or node_seen + MARGIN <= next_generation:
        return 0
    if node_seen >= MAX_SEEN:
        raise ValueError(f"the node reports put generation {node_seen}, past any a master uses")
    return node_seen + MARGIN


class GenerationFloor:
    """`<data-dir>/generation-floor`: every generation a master of the directory may hand out
    is below it, written (fsynced) before the generation is handed out."""

    def __init__(self, data_dir: Path) -> None:
        self.path = data_dir / FLOOR_FILE
        self.reserved = 0  # the floor this run wrote last

    def start(self, now_us: int) -> int:
        """The first generation of a master starting now (the later of the clock and the
        stored floor), with the floor raised past what it may use.  Raises StartupError when
        the floor cannot be written."""
        try:
            stored = int(self.path.read_text().strip())
        except (OSError, ValueError):
            stored = 0  # none yet (a new data directory), or unreadable: the clock alone
        first = max(now_us, stored)
        self._write(first + RESERVE)
        return first

    def reserve(self, generation: int) -> None:
        """Keep the floor well past `generation` (the master is about to hand out generations
        from there): written again once it is within half a reserve.  Raises StartupError
        when it cannot be written (the master must not hand those generations out)."""
        if generation + RESERVE // 2 > self.reserved:
            self._write(generation + RESERVE)

    def _write(self, floor: int) -> None:
        path, data_dir = self.path, self.path.parent
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            with open(tmp, "w") as out:
                out.write(f"{floor}\n")
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
        self.reserved = floor
