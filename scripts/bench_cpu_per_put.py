#!/usr/bin/env python3
"""CPU time each process spends per put: the client, the node and the master, over TCP and
through same-host shared memory, beside the put's wall time.

On a machine with few cores the three processes share them, so a put loop can be bound by
the CPU all three spend per put rather than by any one round trip: with C cores it cannot run
faster than (client + node + master CPU per put) / C.  This script measures that floor, so a
ratio to another store (scripts/bench_compare.py) can be read against it.

One master and one node on 127.0.0.1 (real processes), one sync client in this process, one
thread.  Each size and path puts `--ops` values (removed in batches of 32 as it goes, so the
pool never fills; their CPU is counted too), reading each process's user+system CPU from /proc
before and after: clock ticks of 10 ms, so 400 puts resolve 25 us per put.  Linux only.

    python scripts/bench_cpu_per_put.py --sizes 1M,4M,16M --ops 400 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_args import positive, sizes_arg

from mooncake_store import Client
from mooncake_store.cluster import LocalCluster

BATCH = 32  # puts between removes


def cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process `pid` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(client: Client, pids: dict[str, int], size: int, ops: int, path: str) -> dict:
    value = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    for i in range(4):  # sockets open, the pool mapped, leases stocked
        client.put_from(f"cpu/warm/{i}", value)
    client.remove_many([f"cpu/warm/{i}" for i in range(4)])
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    started = time.perf_counter()
    latencies = []
    for i in range(ops):
        t = time.perf_counter()
        client.put_from(f"cpu/{path}/{size}/{i}", value)
        latencies.append(time.perf_counter() - t)
        if i % BATCH == BATCH - 1 or i == ops - 1:
            first = i - i % BATCH
            client.remove_many([f"cpu/{path}/{size}/{j}" for j in range(first, i + 1)])
    wall = time.perf_counter() - started
    after = {name: cpu_s(pid) for name, pid in pids.items()}
    per_put = {name: (after[name] - before[name]) / ops * 1e6 for name in pids}
    return {
        "path": path, "size_bytes": size, "ops": ops,
        "put_p50_us": statistics.median(latencies) * 1e6,
        "wall_per_op_us": wall / ops * 1e6,  # with a remove every BATCH puts
        "cpu_us_per_op": per_put,
        "cpu_floor_us": sum(per_put.values()) / (os.cpu_count() or 1),
        "cores": os.cpu_count(),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=sizes_arg, default="1M,4M,16M")
    parser.add_argument("--ops", type=positive, default=400, help="puts per size and path")
    parser.add_argument("--paths", default="tcp,shm", help="tcp, shm or both")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    if not paths or any(p not in ("tcp", "shm") for p in paths):
        parser.error(f"--paths takes tcp and/or shm, got {args.paths!r}")
    if not Path("/proc/self/stat").exists():
        sys.exit("this benchmark reads /proc/PID/stat: Linux only")
    dram = f"{max(args.sizes) * 2 * BATCH * 2 // (1 << 20) + 64}MiB"
    records = []
    with tempfile.TemporaryDirectory(prefix="mooncake-cpu-") as tmp:
        with LocalCluster(tmp, nodes=1, dram=dram, master_args=["--lease-ttl", "1s"]) as cluster:
            assert cluster.master is not None and cluster.nodes
            pids = {"client": os.getpid(), "node": cluster.nodes[0].proc.pid,
                    "master": cluster.master.proc.pid}  # fmt: skip
            for path in paths:
                with Client(cluster.master_address, local_shm=path == "shm") as client:
                    for size in args.sizes:
                        records.append(measure(client, pids, size, args.ops, path))
    print(
        f"{'path':5} {'size':>7} {'put p50':>9} {'client':>8} {'node':>8} {'master':>8} "
        f"{'floor':>8}   (us; CPU per put; floor: their sum / {os.cpu_count()} cores)"
    )
    for r in records:
        c = r["cpu_us_per_op"]
        size = r["size_bytes"]
        label = f"{size >> 20}Mi" if size >= 1 << 20 else f"{size >> 10}Ki"
        print(f"{r['path']:5} {label:>7} {r['put_p50_us']:>9.0f} "
              f"{c['client']:>8.0f} {c['node']:>8.0f} {c['master']:>8.0f} "
              f"{r['cpu_floor_us']:>8.0f}")  # fmt: skip
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
