#!/usr/bin/env python3
"""TCP put latency with the payload hashed in 1 MiB steps before each is sent ("steps", the
path before the send-hash helper) and hashed on the helper while it is sent whole ("overlap",
client/tcp_wire.py `write_hashed`), interleaved round by round on one cluster.

One master and one node on 127.0.0.1, one sync client over TCP (`local_shm=False`), one
thread.  Each round puts `--ops` values of each size in each mode, then removes them.  Prints
the median over rounds of each round's p50, the ratio, and writes JSON.

    python scripts/bench_send_hash.py --sizes 1M,4M,16M --ops 60 --rounds 5 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import positive, sizes_arg

from mooncake_store import Client
from mooncake_store.client import tcp_wire
from mooncake_store.cluster import LocalCluster

MODES = {"steps": 1 << 62, "overlap": tcp_wire.OVERLAP_MIN}  # the OVERLAP_MIN of each


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default="1M,4M,16M")
    parser.add_argument("--ops", type=positive, default=60, help="puts per size, mode and round")
    parser.add_argument("--rounds", type=positive, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    sizes = args.sizes
    p50s: dict[tuple[int, str], list[float]] = {(s, m): [] for s in sizes for m in MODES}
    pool = max(sizes) * (args.ops + 8) + (128 << 20)  # a mode's puts are removed after it
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, nodes=1, dram=str(pool)) as c:
        with Client(c.master_address, local_shm=False) as store:
            key = 0
            for _ in range(args.rounds):
                for size in sizes:
                    values = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(8)]
                    for mode, threshold in MODES.items():
                        tcp_wire.OVERLAP_MIN = threshold
                        samples, keys = [], []
                        for i in range(args.ops):
                            keys.append(f"sh/{key}")
                            key += 1
                            start = time.perf_counter()
                            store.put_from(keys[-1], values[i % len(values)])
                            samples.append(time.perf_counter() - start)
                        store.remove_many(keys)
                        p50s[(size, mode)].append(statistics.median(samples) * 1e6)
    tcp_wire.OVERLAP_MIN = MODES["overlap"]
    rows = []
    print(f"{'size':>6} {'steps p50 us':>13} {'overlap p50 us':>15} {'speed-up':>9}")
    for size in sizes:
        steps = statistics.median(p50s[(size, "steps")])
        overlap = statistics.median(p50s[(size, "overlap")])
        print(f"{size >> 10:>5}K {steps:>13.0f} {overlap:>15.0f} {steps / overlap:>8.2f}x")
        rows.append({"size_bytes": size, "steps_p50_us": steps, "overlap_p50_us": overlap,
                     "steps_runs": p50s[(size, "steps")],
                     "overlap_runs": p50s[(size, "overlap")]})  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
