#!/usr/bin/env python3
"""Put and get latency with busy polling off and on (`Client(busy_poll_us=)`), interleaved op
by op on one cluster.

One master and one node on 127.0.0.1; two sync clients (`busy_poll_us=0` / the default) put
and then read back the same values in turn, so both see the same machine state; one thread,
same host then TCP.  Prints the p50 of each and their ratio, and writes JSON.

    python scripts/bench_busy_poll.py --sizes 64K,1M,4M --ops 300
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

from mooncake_store import Client
from mooncake_store.client.sync_client import DEFAULT_BUSY_POLL_US
from mooncake_store.cluster import LocalCluster
from mooncake_store.common.units import parse_size


def p50_us(samples: list[float]) -> float:
    return statistics.median(samples[5:] or samples) * 1e6


def run(address: str, shm: bool, size: int, ops: int) -> dict:
    clients = {
        "off": Client(address, local_shm=shm, busy_poll_us=0),
        "on": Client(address, local_shm=shm),
    }
    values = [np.random.randint(0, 255, size, dtype=np.uint8) for _ in range(8)]
    out = np.empty(size, dtype=np.uint8)
    puts: dict[str, list[float]] = {"off": [], "on": []}
    gets: dict[str, list[float]] = {"off": [], "on": []}
    path = "shm" if shm else "tcp"
    try:
        for i in range(ops):
            for tag, client in clients.items():
                value = values[i % len(values)]
                value[:8] = np.frombuffer(np.int64(i).tobytes(), np.uint8)  # a new key's value
                start = time.perf_counter()
                client.put_from(f"bp/{path}/{size}/{tag}/{i}", value)
                puts[tag].append(time.perf_counter() - start)
        for i in range(ops):
            for tag, client in clients.items():
                start = time.perf_counter()
                client.get_into(f"bp/{path}/{size}/{tag}/{i}", out)
                gets[tag].append(time.perf_counter() - start)
        polls = clients["on"].counters
        for tag, client in clients.items():
            client.remove_many_outcomes([f"bp/{path}/{size}/{tag}/{i}" for i in range(ops)])
    finally:
        for client in clients.values():
            client.close()
    return {
        "path": path, "size_bytes": size, "ops": ops, "busy_poll_us": DEFAULT_BUSY_POLL_US,
        "put_p50_us_off": p50_us(puts["off"]), "put_p50_us_on": p50_us(puts["on"]),
        "get_p50_us_off": p50_us(gets["off"]), "get_p50_us_on": p50_us(gets["on"]),
        "busy_polls": polls["busy_polls"], "busy_poll_hits": polls["busy_poll_hits"],
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M")
    parser.add_argument("--ops", type=int, default=300,
                        help="puts (and gets) per client, fewer for big sizes")  # fmt: skip
    parser.add_argument("--json", default="bench-results/busy-poll.json")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    records = []
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(tmp, nodes=1, dram="4GiB") as c:
        for shm in (True, False):
            for size in sizes:  # both clients' values of one case fit in 512 MiB: no eviction
                ops = min(args.ops, max(20, (256 << 20) // size))
                records.append(run(c.master_address, shm, size, ops))
    print(f"{'path':4} {'size':>6}  {'put p50 off / on (us)':>22}  {'get p50 off / on (us)':>22}  "
          "busy poll hits")  # fmt: skip
    for r in records:
        put = f"{r['put_p50_us_off']:.0f} / {r['put_p50_us_on']:.0f}"
        get = f"{r['get_p50_us_off']:.0f} / {r['get_p50_us_on']:.0f}"
        print(f"{r['path']:4} {r['size_bytes'] >> 10:>5}K  {put:>14} "
              f"({r['put_p50_us_off'] / r['put_p50_us_on']:.2f}x)  {get:>14} "
              f"({r['get_p50_us_off'] / r['get_p50_us_on']:.2f}x)  "
              f"{r['busy_poll_hits']}/{r['busy_polls']}")  # fmt: skip
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
