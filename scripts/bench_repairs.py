"""How much a master tick spends on objects that cannot be re-replicated (issue 11).

40k objects want 3 replicas on a 2-node cluster: none can be repaired.  Prints the mean time of
`Replication.plan()` (the per-tick repair planning) over 40 ticks of 250 ms.

    python scripts/bench_repairs.py [--objects 40000]
"""

from __future__ import annotations

import argparse
import time

from mooncake_store.master.object_table import ObjectTable, TableConfig
from mooncake_store.master.replication import Replication
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=40_000)
    args = parser.parse_args()
    clock = Clock()
    table = ObjectTable(TableConfig(), clock=clock)
    for i in range(2):
        node = NodeInfo(f"n{i}", 1, f"n{i}:data", "shm", f"n{i}:ctl", b"k" * 32)
        table.mount(node, [(SegmentInfo(node, 100 + i, Tier.DRAM, 1 << 40), None)])
    for i in range(args.objects):
        key = f"block/{i:08d}"
        table.put_start(key, 4096, 3)
        table.put_end(key, 1)
        table.commit_put_end(key)
    repl = Replication(table, TableConfig(), clock=clock)
    ticks, spent = 40, 0.0
    for _ in range(ticks):
        started = time.perf_counter()
        repl.plan()
        spent += time.perf_counter() - started
        clock.now += 0.25
    print(f"{args.objects} unrepairable objects: plan() {spent / ticks * 1000:.2f} ms per tick "
          f"(mean of {ticks} ticks of 250 ms)")  # fmt: skip


if __name__ == "__main__":
    main()
