#!/usr/bin/env python3
"""Put latency and master round trips per put, two-phase against leased (the default),
interleaved put by put on one cluster.

One master and one node on 127.0.0.1; two clients (`leases=False` / the default, which holds
allocation leases) put the same values in turn, so both see the same machine state, single
thread, same host then TCP.  Prints the p50 of each and the master calls each put made (a
steady leased put is one: `BatchLeasedPut`; a two-phase put two: `PutStart`, `PutEnd`).

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


def master_calls(client: Client) -> int:
    return client.counters["framed_calls"] + client.counters["grpc_calls"]


sizes = [int(s) for s in sys.argv[1].split(",")]
n = int(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, nodes=1, dram="512MiB") as c:
    for shm in (True, False):
        with (
            Client(c.master_address, local_shm=shm, leases=False) as a,
            Client(c.master_address, local_shm=shm) as b,
        ):
            for size in sizes:
                v = np.ones(size, dtype=np.uint8)
                ta: list[float] = []
                tb: list[float] = []
                calls = {"a": 0, "b": 0}
                for i in range(n):
                    for cl, t, tag in ((a, ta, "a"), (b, tb, "b")):
                        k = f"ab/{shm}/{size}/{tag}/{i}"
                        before = master_calls(cl)
                        s = time.perf_counter()
                        cl.put_from(k, v)
                        t.append(time.perf_counter() - s)
                        calls[tag] += master_calls(cl) - before
                    if i % 50 == 49:
                        a.remove_many([f"ab/{shm}/{size}/a/{j}" for j in range(i - 49, i + 1)])
                        b.remove_many([f"ab/{shm}/{size}/b/{j}" for j in range(i - 49, i + 1)])
                ma, mb = statistics.median(ta[5:]) * 1e6, statistics.median(tb[5:]) * 1e6
                path = "shm" if shm else "tcp"
                print(
                    f"{path} {size >> 10:>6} KiB put p50: two-phase {ma:.0f} us, "
                    f"leased (default) {mb:.0f} us ({ma / mb:.2f}x); master calls per put: "
                    f"{calls['a'] / n:.2f} / {calls['b'] / n:.2f} "
                    f"(leased puts {b.counters['leased_puts']})",
                    flush=True,
                )
