#!/usr/bin/env python3
"""Put latency with and without allocation leases, interleaved put by put on one cluster.

One master and one node on 127.0.0.1; two clients (leases off / on) put the same values in
turn, so both see the same machine state, single thread, same host then TCP.  Prints the p50
of each and the master calls each made.

    python scripts/bench_leases.py 65536,1048576,4194304 150
"""

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mooncake_store import Client
from mooncake_store.cluster import LocalCluster

sizes = [int(s) for s in sys.argv[1].split(",")]
n = int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, nodes=1, dram="512MiB") as c:
    for shm in (True, False):
        with (
            Client(c.master_address, local_shm=shm) as a,
            Client(c.master_address, local_shm=shm, leases=True) as b,
        ):
            for size in sizes:
                v = np.ones(size, dtype=np.uint8)
                ta, tb = [], []
                for i in range(n):
                    for cl, t, tag in ((a, ta, "a"), (b, tb, "b")):
                        k = f"ab/{shm}/{size}/{tag}/{i}"
                        s = time.perf_counter()
                        cl.put_from(k, v)
                        t.append(time.perf_counter() - s)
                    if i % 50 == 49:
                        a.remove_many([f"ab/{shm}/{size}/a/{j}" for j in range(i - 49, i + 1)])
                        b.remove_many([f"ab/{shm}/{size}/b/{j}" for j in range(i - 49, i + 1)])
                ma, mb = statistics.median(ta[5:]) * 1e6, statistics.median(tb[5:]) * 1e6
                path = "shm" if shm else "tcp"
                print(
                    f"{path} {size >> 10:>6} KiB put p50: two-phase {ma:.0f} us, "
                    f"leased {mb:.0f} us ({ma / mb:.2f}x); master calls so far: "
                    f"{a.counters['framed_calls']} / {b.counters['framed_calls']}",
                    flush=True,
                )
