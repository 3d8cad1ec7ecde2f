#!/usr/bin/env python3
"""Our store next to the real Mooncake Store, Redis and the machine's limits, in one run.

For each block size in turn (interleaved, so every system sees the same machine state) it
measures:
  ours-shm       put_from/get_into through a node's shared memory (client on the same host),
                 default client: it copies through shared memory, so it takes no allocation
                 leases and a put is two master round trips (PutStart, PutEnd)
  ours-tcp       the same over the TCP data path: the default client holds allocation leases,
                 so a steady put is one master round trip (BatchLeasedPut)
  memcpy, tcp    the physical limits (numpy copy between DRAM buffers; raw loopback TCP)
  mooncake-shm   Mooncake Store, dummy client -> real client over shared memory (put_from/get_into)
  mooncake-tcp   Mooncake Store, segment in a second process, TCP transport (put_from/get_into)
  redis          redis-server with redis-py + hiredis (SET/GET)
  memcpy-cold    numpy copy whose source and destination each rotate through 256 MiB
and, when asked for (not by default):
  ours-shm-lease, ours-tcp-lease   ours with leases asked for explicitly (Client(leases=True):
                 the same client as the default, to show that default == leased)
  ours-shm-2phase, ours-tcp-2phase ours with Client(leases=False): every put two master round
                 trips (PutStart, PutEnd)
  ours-shm-sync, ours-tcp-sync     ours against a second master run with --sync-commits (an
                 fsync per group commit; the default mode fsyncs in the background)
  ours-shm-busypoll, ours-tcp-busypoll  ours against a master run with --busy-poll 400us (it
                 keeps polling between requests that come close together; off by default)
Ours are measured here (one Client per thread); the peers run through the peer harness in
`scripts/peers/bench_peers.py` with the `.peers-venv` that `make peers` installs.  A peer
that is not installed is skipped, and the script says so.  Prints a table with our/peer ratios,
writes JSON records and, with matplotlib installed (`pip install '.[bench]'`), a PNG plot.

    python scripts/bench_compare.py [--sizes 64K,1M,4M,16M] [--threads 1,2,4]
        [--systems ours-shm,ours-tcp,mooncake-shm,mooncake-tcp,redis,memcpy,tcp]
        [--json OUT.json] [--plot OUT.png] [--runs N]

With --runs N the whole interleaved run is repeated N times and every cell is the median of
its N measurements (runs on these VMs differ by about 30%).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402  (scripts/bench.py: limits and the single-thread store case)

from mooncake_store import Client  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402
from mooncake_store.common.copyhash import KERNEL  # noqa: E402
from mooncake_store.common.units import parse_size  # noqa: E402

ALL = ["ours-shm", "ours-tcp", "mooncake-shm", "mooncake-tcp", "redis", "memcpy", "tcp",
       "memcpy-cold"]  # fmt: skip
LEASE = ["ours-shm-lease", "ours-tcp-lease"]  # opt-in (leases are the default already)
TWO_PHASE = ["ours-shm-2phase", "ours-tcp-2phase"]  # opt-in: Client(leases=False)
SYNC = ["ours-shm-sync", "ours-tcp-sync"]  # opt-in
BUSY = ["ours-shm-busypoll", "ours-tcp-busypoll"]  # opt-in: a master run with --busy-poll
BUSY_POLL = "400us"
KNOWN = ALL + LEASE + TWO_PHASE + SYNC + BUSY
PEERS = {"mooncake-shm": ("mc_dummy", "buf"), "mooncake-tcp": ("mc_remote", "buf"),
         "redis": ("redis", None)}  # fmt: skip
HARNESS = ROOT / "scripts" / "peers" / "bench_peers.py"  # see scripts/peers/README.md
PEERS_PY = ROOT / ".peers-venv" / "bin" / "python"


def ours(
    master: str, size: int, count: int, max_s: float, threads: int, shm: bool, system: str
) -> dict:
    """Our store with `threads` client threads sharing one Client (as the peers' harness shares
    one Mooncake client), each with its own buffers and keys; every phase starts together."""
    leases = not system.endswith("-2phase")  # "-lease" and plain: the default, leased
    if threads == 1:
        one = bench.bench_store(master, size, count, max_s, local_shm=shm, leases=leases,
                                system=system)  # fmt: skip
        one["copy_kernel"] = KERNEL  # same-host copies: the C kernel or numpy (common/copyhash)
        return one
    per = max(1, count // threads)
    with Client(master, local_shm=shm, leases=leases) as store:
        keys = [[f"cmp/{system}/{size}/{threads}/{t}/{i}" for i in range(per)]
                for t in range(threads)]  # fmt: skip
        ops = [bench.stamped_ops(store, size, keys[t]) for t in range(threads)]
        barrier = threading.Barrier(threads)

        def warm_up(t: int) -> None:  # this thread's sockets open, the pool mapped
            barrier.wait()
            warm = np.ones(size, dtype=np.uint8)
            store.put_from(f"warmup/{t}", warm)
            store.get_into(f"warmup/{t}", warm)
            store.remove(f"warmup/{t}")

        def phase(t: int, n: int, op_index: int) -> tuple[list[float], float]:
            barrier.wait()  # one task per pool thread, all starting together
            return bench.timed(n, max_s, ops[t][op_index])

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(warm_up, range(threads)))
            puts = list(pool.map(lambda t: phase(t, per, 0), range(threads)))
            done = [len(p[0]) for p in puts]
            gets = list(pool.map(lambda t: phase(t, done[t], 1), range(threads)))
        for t in range(threads):
            for i in range(0, done[t], max(1, done[t] // 4)):
                ops[t][2](i)
        bench.release(store, [k for t in range(threads) for k in keys[t][: done[t]]])
    put_s = [x for p in puts for x in p[0]]
    get_s = [x for g in gets for x in g[0]]
    rec = bench.record(system, size, put_s, get_s, max(p[1] for p in puts),
                       max(g[1] for g in gets))  # fmt: skip
    rec["threads"] = threads
    rec["copy_kernel"] = KERNEL
    return rec


def peers(names: list[str], size: int, threads: list[int], total_mib: int, max_s: float,
          workdir: str) -> list[dict]:  # fmt: skip
    """Run the peer harness for one size; [] (with a message) when it is not installed."""
    if not names:
        return []
    if not HARNESS.exists() or not PEERS_PY.exists():
        print(f"skipping {', '.join(names)}: run `make peers` (needs {PEERS_PY} and {HARNESS})",
              flush=True)  # fmt: skip
        return []
    out = Path(workdir) / f"peers-{size}.json"
    cmd = [str(PEERS_PY), str(HARNESS), "run", "--peers", ",".join(PEERS[n][0] for n in names),
           "--sizes", str(size), "--threads", ",".join(map(str, threads)), "--runs", "1",
           "--total-mib", str(total_mib), "--max-seconds", str(max_s), "--retry-noisy", "0",
           "--json-out", str(out), "--logdir", str(Path(workdir) / "peer-logs")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0 or not out.exists():
        print(f"peer harness failed ({proc.returncode}): {proc.stderr[-1500:]}", flush=True)
        return []
    rows = json.loads(out.read_text())["summary"]
    records = []
    for name in names:
        peer, api = PEERS[name]
        for t in threads:
            got = {r["op"]: r for r in rows if r["peer"] == peer and r["threads"] == t
                   and (api is None or r["api"] == api) and r["size"] == size}  # fmt: skip
            if "put" in got and "get" in got:
                records.append({
                    "system": name, "size_bytes": size, "threads": t,
                    "put_gbps": got["put"]["gbps"], "get_gbps": got["get"]["gbps"],
                    "put_p50_us": got["put"]["p50_us"], "get_p50_us": got["get"]["p50_us"],
                    "put_p99_us": got["put"]["p99_us"], "get_p99_us": got["get"]["p99_us"],
                })  # fmt: skip
    return records


def medians(records: list[dict]) -> list[dict]:
    """One record per (system, size, threads): each measure is the median over the runs, and
    `put_gbps_runs` / `get_gbps_runs` keep every run's throughput (one run: unchanged)."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["system"], r["size_bytes"], r["threads"]), []).append(r)
    out = []
    for runs in groups.values():
        merged = dict(runs[0])
        for name, value in runs[0].items():
            if isinstance(value, (int, float)) and name not in ("size_bytes", "threads"):
                merged[name] = statistics.median(r[name] for r in runs)
        merged["runs"] = len(runs)
        merged["put_gbps_runs"] = [r["put_gbps"] for r in runs]
        merged["get_gbps_runs"] = [r["get_gbps"] for r in runs]
        out.append(merged)
    return out


def table(records: list[dict]) -> str:
    lines = [f"{'size':>5} {'thr':>3} {'system':<16} {'put GB/s':>9} {'get GB/s':>9} "
             f"{'put p50us':>9} {'get p50us':>9}  ours/peer (put, get)"]  # fmt: skip
    index = {(r["system"], r["size_bytes"], r["threads"]): r for r in records}
    pairs = {"mooncake-shm": "ours-shm", "mooncake-tcp": "ours-tcp", "redis": "ours-shm",
             "memcpy": "ours-shm", "tcp": "ours-tcp", "memcpy-cold": "ours-shm"}  # fmt: skip
    peer_of = {"ours-shm-lease": "mooncake-shm", "ours-tcp-lease": "mooncake-tcp",
               "ours-shm-2phase": "mooncake-shm", "ours-tcp-2phase": "mooncake-tcp",
               "ours-shm-sync": "mooncake-shm", "ours-tcp-sync": "mooncake-tcp",
               "ours-shm-busypoll": "mooncake-shm",
               "ours-tcp-busypoll": "mooncake-tcp"}  # fmt: skip
    for r in sorted(
        records, key=lambda r: (r["size_bytes"], r["threads"], KNOWN.index(r["system"]))
    ):
        size = r["size_bytes"]
        label = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
        ratio = ""
        mine = index.get((pairs.get(r["system"], ""), size, r["threads"]))
        if mine is not None and r["put_gbps"] and r["get_gbps"]:
            ratio = (f"{mine['system']}: {mine['put_gbps'] / r['put_gbps']:.2f}x, "
                     f"{mine['get_gbps'] / r['get_gbps']:.2f}x")  # fmt: skip
        peer = index.get((peer_of.get(r["system"], ""), size, r["threads"]))
        if peer is not None and peer["put_gbps"] and peer["get_gbps"]:
            ratio = (f"vs {peer['system']}: {r['put_gbps'] / peer['put_gbps']:.2f}x, "
                     f"{r['get_gbps'] / peer['get_gbps']:.2f}x")  # fmt: skip
        if "master_calls_per_put" in r:  # ours, one thread: 1.0 leased, 2.0 two-phase
            ratio = f"{r['master_calls_per_put']:.2f} master calls/put  {ratio}"
        lines.append(f"{label:>5} {r['threads']:>3} {r['system']:<16} {r['put_gbps']:>9.2f} "
                     f"{r['get_gbps']:>9.2f} {r['put_p50_us']:>9.0f} {r['get_p50_us']:>9.0f}  "
                     f"{ratio}")  # fmt: skip
    return "\n".join(lines)


def plot(records: list[dict], path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install '.[bench]'): no plot", flush=True)
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, op in zip(axes, ("put", "get"), strict=True):
        for system in KNOWN:
            rs = sorted((r for r in records if r["system"] == system and r["threads"] == 1),
                        key=lambda r: r["size_bytes"])  # fmt: skip
            if rs:
                ax.plot([r["size_bytes"] for r in rs], [r[f"{op}_gbps"] for r in rs],
                        marker="o", label=system)  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_xlabel("block size (bytes)")
        ax.set_ylabel("GB/s")
        ax.set_title(f"{op}, one client thread")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M,16M")
    parser.add_argument("--threads", default="1,2,4")
    parser.add_argument("--systems", default=",".join(ALL))
    parser.add_argument("--total-mib", type=int, default=256, help="bytes per case")
    parser.add_argument("--max-ops", type=int, default=2000)
    parser.add_argument("--max-seconds", type=float, default=10.0, help="cap per phase")
    parser.add_argument("--json", default="bench-results/compare.json")
    parser.add_argument("--plot", default="bench-results/compare.png")
    parser.add_argument(
        "--runs", type=int, default=1, help="repeat the interleaved run; report medians"
    )
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in KNOWN]
    if unknown:
        parser.error(f"unknown systems {unknown}; choose from {','.join(KNOWN)}")
    total = args.total_mib << 20
    records: list[dict] = []
    started = time.time()
    print(f"same-host copy kernel: {KERNEL} (mooncake_store/native; numpy: not built or off)")
    with tempfile.TemporaryDirectory(prefix="mooncake-compare-") as tmp:
        dram = f"{max(2 * total + (64 << 20), max(sizes) * 16) >> 20}MiB"
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(
                LocalCluster(f"{tmp}/sync", nodes=1, dram=dram, master_args=["--lease-ttl", "1s"])
            )
            ours_systems = [(s, s.startswith("ours-shm"), cluster)
                            for s in ("ours-shm", "ours-tcp", *LEASE, *TWO_PHASE)]  # fmt: skip
            if any(s in systems for s in SYNC):
                synced = stack.enter_context(
                    LocalCluster(f"{tmp}/synced", nodes=1, dram=dram,
                                 master_args=["--lease-ttl", "1s", "--sync-commits"])
                )  # fmt: skip
                ours_systems += [(s, s == "ours-shm-sync", synced) for s in SYNC]
            if any(s in systems for s in BUSY):
                polling = stack.enter_context(
                    LocalCluster(f"{tmp}/polling", nodes=1, dram=dram,
                                 master_args=["--lease-ttl", "1s", "--busy-poll", BUSY_POLL])
                )  # fmt: skip
                ours_systems += [(s, s == "ours-shm-busypoll", polling) for s in BUSY]
            for run in range(args.runs):
                for size in sizes:
                    count = max(1, min(args.max_ops, total // size))
                    for t in threads:
                        for system, shm, where in ours_systems:
                            if system in systems:
                                records.append(ours(where.master_address, size, count,
                                                    args.max_seconds, t, shm, system))  # fmt: skip
                    if "memcpy" in systems:
                        records.append(bench.bench_memcpy(size, count, args.max_seconds))
                    if "memcpy-cold" in systems:
                        records.append(bench.bench_memcpy_cold(size, count, args.max_seconds))
                    if "tcp" in systems:
                        records.append(bench.bench_tcp(size, count, args.max_seconds))
                    records += peers([s for s in systems if s in PEERS], size, threads,
                                     args.total_mib, args.max_seconds, tmp)  # fmt: skip
                    print(f"run {run + 1}/{args.runs}, size {size}: done "
                          f"({time.time() - started:.0f} s)", flush=True)  # fmt: skip
                    partial = Path(args.json).with_suffix(".partial.json")
                    partial.parent.mkdir(parents=True, exist_ok=True)
                    partial.write_text(json.dumps(records, indent=2))  # a cut run keeps these
    for r in records:
        r.setdefault("threads", 1)
    records = medians(records)
    print(table(records))
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=2))
    print(f"wrote {out}")
    if args.plot:
        plot(records, args.plot)


if __name__ == "__main__":
    main()
