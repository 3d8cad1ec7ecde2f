#!/usr/bin/env python3
"""Put/get throughput and latency of mooncake-store, next to the machine's limits.

Starts its own cluster (a master and one store node on 127.0.0.1), then for each block size
measures, one client thread:
  ours-shm   put_from / get_into through the node's shared memory (client on the same host)
  ours-tcp   the same calls over the TCP data path (local_shm=False)
  ours-tcp-tls  the same over TLS (--tls: a second cluster with a throwaway CA, mutual TLS)
  memcpy     numpy.copyto between two warm buffers in one process (upper bound, same host)
  tcp        raw loopback TCP to another process, recv_into a warm buffer (upper bound, TCP)
  ours-shm-batchN / ours-tcp-batchN   put_many / get_many_into of N keys per call (opt-in)
Each case writes --total-mib of distinct keys (capped at --max-seconds), reads them all back,
then removes them.  Like the peers' harness (scripts/peers), each client thread puts from one
pre-faulted source buffer and gets into one destination buffer (an engine's KV buffers are
reused the same way), while the store side moves through fresh extents; every value carries its
index in its first 8 bytes, checked on every get.  memcpy copies one buffer to and from slots
of a 256 MiB ring.  Prints a table and writes JSON records.

    python scripts/bench.py [--sizes 64K,1M,4M,16M] [--total-mib 256] [--json OUT.json] [--tls]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store import Client  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402
from mooncake_store.common.tls import TlsConfig  # noqa: E402
from mooncake_store.common.units import parse_size  # noqa: E402

TCP_SERVER = r"""
import socket, struct, sys
buf = bytearray(int(sys.argv[1]))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept()
conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
view = memoryview(buf)
while True:
    head = conn.recv(9, socket.MSG_WAITALL)
    if len(head) < 9:
        break
    op, n = struct.unpack("<BQ", head)
    if op == 1:            # put: read n bytes into the buffer, ack
        got = 0
        while got < n:
            got += conn.recv_into(view[got:n])
        conn.sendall(b"k")
    else:                  # get: send n bytes
        conn.sendall(view[:n])
"""


def percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def record(
    system: str, size: int, put_s: list[float], get_s: list[float], put_wall: float, get_wall: float
) -> dict:
    return {
        "system": system,
        "size_bytes": size,
        "threads": 1,
        "put_gbps": len(put_s) * size / put_wall / 1e9 if put_wall else 0.0,
        "get_gbps": len(get_s) * size / get_wall / 1e9 if get_wall else 0.0,
        "put_p50_us": percentile(put_s, 0.5) * 1e6,
        "put_p99_us": percentile(put_s, 0.99) * 1e6,
        "get_p50_us": percentile(get_s, 0.5) * 1e6,
        "get_p99_us": percentile(get_s, 0.99) * 1e6,
        "ops": len(put_s),
    }


def timed(count: int, max_s: float, op) -> tuple[list[float], float]:
    samples: list[float] = []
    start = time.perf_counter()
    for i in range(count):
        t0 = time.perf_counter()
        op(i)
        samples.append(time.perf_counter() - t0)
        if t0 - start > max_s:
            break
    return samples, time.perf_counter() - start


WORKING_SET = 256 << 20  # the memcpy ring: the store side of a copy never runs from cache


def stamped_ops(store: Client, size: int, keys: list[str]) -> tuple:
    """put(i) / get(i) closures over one source and one destination buffer; each value
    carries its index in its first 8 bytes, and every get checks it."""
    src = np.random.default_rng(size).integers(0, 255, max(size, 8), dtype=np.uint8)
    dst = np.ones(max(size, 8), dtype=np.uint8)  # pre-faulted
    src_stamp = src[:8].view(np.uint64)
    dst_stamp = dst[:8].view(np.uint64)

    def put(i: int) -> None:
        src_stamp[0] = i
        store.put_from(keys[i], src[:size])

    def get(i: int) -> None:
        store.get_into(keys[i], dst[:size])
        if dst_stamp[0] != i:
            raise SystemExit(f"{keys[i]}: read back the bytes of another key")

    def verify(i: int) -> None:
        src_stamp[0] = i
        get(i)
        if not np.array_equal(src[:size], dst[:size]):
            raise SystemExit(f"{keys[i]}: bytes read back differ from bytes written")

    return put, get, verify


def release(store: Client, keys: list[str]) -> None:
    """Remove a case's keys and wait until their extents are free (read leases must end
    first), so the next case starts on an empty pool and never measures eviction."""
    for start in range(0, len(keys), 256):
        store.remove_many(keys[start : start + 256])
    deadline = time.monotonic() + 30
    while store.stats().used_bytes and time.monotonic() < deadline:
        time.sleep(0.1)
    evictions = store.stats().counters.get("evictions", 0)
    if evictions:
        raise SystemExit(f"the store evicted {evictions} blocks: give the node a bigger pool")


def bench_store(
    master: str,
    size: int,
    count: int,
    max_s: float,
    *,
    local_shm: bool,
    tls: TlsConfig | None = None,
    leases: bool = True,
    system: str | None = None,
) -> dict:
    system = system or (
        "ours-shm" if local_shm else "ours-tcp-tls" if tls is not None else "ours-tcp"
    )
    with Client(master, local_shm=local_shm, tls=tls or TlsConfig(), leases=leases) as store:
        keys = [f"bench/{system}/{size}/{i}" for i in range(count)]
        warm = np.ones(size, dtype=np.uint8)
        store.put_from("warmup", warm)  # maps the pool, opens connections
        store.get_into("warmup", warm)
        store.remove("warmup")
        put, get, verify = stamped_ops(store, size, keys)
        calls = store.counters["framed_calls"] + store.counters["grpc_calls"]
        put_s, put_wall = timed(count, max_s, put)
        calls = store.counters["framed_calls"] + store.counters["grpc_calls"] - calls
        written = keys[: len(put_s)]
        get_s, get_wall = timed(len(written), max_s, get)
        for i in range(0, len(written), max(1, len(written) // 8)):
            verify(i)
        release(store, written)
        path_used = store.counters["shm_reads" if local_shm else "tcp_reads"]
        assert path_used >= len(get_s), "the benchmark did not use the intended data path"
    out = record(system, size, put_s, get_s, put_wall, get_wall)
    out["master_calls_per_put"] = round(calls / max(1, len(put_s)), 3)  # 1: leased, 2: two-phase
    return out


def bench_batch(
    master: str, size: int, count: int, max_s: float, *, local_shm: bool, batch: int
) -> dict:
    """put_many / get_many_into of `batch` keys per call (p50s are per call)."""
    system = f"ours-{'shm' if local_shm else 'tcp'}-batch{batch}"
    calls = max(1, count // batch)
    src = np.random.default_rng(size).integers(0, 255, size * batch, dtype=np.uint8)
    dst = np.ones(size * batch, dtype=np.uint8)
    srcs = [src[i * size : (i + 1) * size] for i in range(batch)]
    dsts = [dst[i * size : (i + 1) * size] for i in range(batch)]
    with Client(master, local_shm=local_shm) as store:
        keys = [[f"bench/{system}/{size}/{c}/{i}" for i in range(batch)] for c in range(calls)]
        store.put_from("warmup", srcs[0])
        store.get_into("warmup", dsts[0])
        store.remove("warmup")
        put_s, put_wall = timed(
            calls, max_s, lambda c: store.put_many(zip(keys[c], srcs, strict=True))
        )
        done = len(put_s)
        get_s, get_wall = timed(done, max_s, lambda c: store.get_many_into(keys[c], dsts))
        if not np.array_equal(src, dst):
            raise SystemExit(f"{system}: bytes read back differ from bytes written")
        release(store, [k for c in range(done) for k in keys[c]])
    rec = record(system, size * batch, put_s, get_s, put_wall, get_wall)
    rec["size_bytes"], rec["batch"] = size, batch
    return rec


def bench_memcpy(size: int, count: int, max_s: float) -> dict:
    buf = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
    slots = max(1, WORKING_SET // size)
    ring = np.ones(slots * size, dtype=np.uint8)  # pre-faulted

    def slot(i: int) -> np.ndarray:
        start = (i % slots) * size
        return ring[start : start + size]

    put_s, put_wall = timed(count, max_s, lambda i: np.copyto(slot(i), buf))
    get_s, get_wall = timed(count, max_s, lambda i: np.copyto(buf, slot(i)))
    return record("memcpy", size, put_s, get_s, put_wall, get_wall)


def bench_memcpy_cold(size: int, count: int, max_s: float) -> dict:
    """A copy whose source and destination each rotate through their own 256 MiB, so neither
    side runs from cache: the limit of a read out of (or a write into) a pool (issue 14)."""
    slots = max(1, WORKING_SET // size)
    src = np.ones(slots * size, dtype=np.uint8)  # pre-faulted
    dst = np.ones(slots * size, dtype=np.uint8)

    def slot(ring: np.ndarray, i: int) -> np.ndarray:
        start = (i % slots) * size
        return ring[start : start + size]

    put_s, put_wall = timed(count, max_s, lambda i: np.copyto(slot(dst, i), slot(src, i + 7)))
    get_s, get_wall = timed(count, max_s, lambda i: np.copyto(slot(src, i), slot(dst, i + 3)))
    return record("memcpy-cold", size, put_s, get_s, put_wall, get_wall)


def bench_tcp(size: int, count: int, max_s: float) -> dict:
    server = subprocess.Popen(
        [sys.executable, "-c", TCP_SERVER, str(size)], stdout=subprocess.PIPE, text=True
    )
    try:
        port = int(server.stdout.readline())
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        src = memoryview(bytearray(os.urandom(size)))
        dst = memoryview(bytearray(size))

        def put(_: int) -> None:
            sock.sendall(struct.pack("<BQ", 1, size))
            sock.sendall(src)
            sock.recv(1)

        def get(_: int) -> None:
            sock.sendall(struct.pack("<BQ", 2, size))
            got = 0
            while got < size:
                got += sock.recv_into(dst[got:])

        put(0), get(0)
        put_s, put_wall = timed(count, max_s, put)
        get_s, get_wall = timed(count, max_s, get)
        sock.close()
    finally:
        server.kill()
        server.wait()
    return record("tcp", size, put_s, get_s, put_wall, get_wall)


def start_tls_cluster(
    stack: contextlib.ExitStack, tmp: Path, dram: str, master_args: list[str]
) -> tuple[LocalCluster, TlsConfig]:
    """A second cluster whose every connection is TLS (mutual), from a throwaway CA."""
    from tests.tls_certs import TestCA  # needs the [test] extra (cryptography)

    ca = TestCA(tmp / "ca")
    client_tls = ca.config("client")
    cluster = stack.enter_context(
        LocalCluster(
            tmp / "tls",
            nodes=1,
            dram=dram,
            master_args=[*master_args, *ca.daemon_args("master")],
            node_args=ca.daemon_args("node"),
            client_options={"tls": client_tls},
        )
    )
    return cluster, client_tls


def print_table(records: list[dict]) -> None:
    header = (
        f"{'system':<14} {'size':>6} {'ops':>5} {'put GB/s':>9} {'get GB/s':>9} "
        f"{'put p50 us':>10} {'put p99 us':>10} {'get p50 us':>10} {'get p99 us':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in records:
        size = r["size_bytes"]
        label = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
        print(
            f"{r['system']:<14} {label:>6} {r['ops']:>5} {r['put_gbps']:>9.2f} "
            f"{r['get_gbps']:>9.2f} {r['put_p50_us']:>10.0f} {r['put_p99_us']:>10.0f} "
            f"{r['get_p50_us']:>10.0f} {r['get_p99_us']:>10.0f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M,16M")
    parser.add_argument("--systems", default="ours-shm,ours-tcp,memcpy,tcp")
    parser.add_argument(
        "--total-mib", type=int, default=256, help="bytes written per case (default 256 MiB)"
    )
    parser.add_argument("--max-ops", type=int, default=2000, help="cap on calls per case")
    parser.add_argument("--max-seconds", type=float, default=10.0, help="cap per phase")
    parser.add_argument("--json", default="bench-results/bench.json")
    parser.add_argument(
        "--no-sync-commits",
        action="store_true",
        help="run the master with --no-sync-commits (commits not fsync'd); systems get -nosync",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also run ours-tcp-tls: the TCP path of a second cluster with TLS (same run)",
    )
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    systems = args.systems.split(",")
    if args.tls and "ours-tcp-tls" not in systems:
        systems.insert(systems.index("ours-tcp") + 1 if "ours-tcp" in systems else 0,
                       "ours-tcp-tls")  # fmt: skip
    total = args.total_mib << 20
    records = []
    with tempfile.TemporaryDirectory(prefix="mooncake-bench-") as tmp:
        dram = f"{max(total + (64 << 20), max(sizes) * 8) >> 20}MiB"
        # A short read lease: each case waits for its removed blocks to be freed.
        master_args = ["--lease-ttl", "1s"]
        if args.no_sync_commits:
            master_args.append("--no-sync-commits")
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(
                LocalCluster(Path(tmp) / "plain", nodes=1, dram=dram, master_args=master_args)
            )
            tls_cluster, client_tls = None, None
            if "ours-tcp-tls" in systems:
                tls_cluster, client_tls = start_tls_cluster(stack, Path(tmp), dram, master_args)
            for size in sizes:
                count = max(1, min(args.max_ops, total // size))
                for system in systems:
                    if system == "ours-tcp-tls":
                        assert tls_cluster is not None
                        master = tls_cluster.master_address
                        rec = bench_store(master, size, count, args.max_seconds, local_shm=False,
                                          tls=client_tls)  # fmt: skip
                        if args.no_sync_commits:
                            rec["system"] += "-nosync"
                        records.append(rec)
                    elif system in ("ours-shm", "ours-tcp"):
                        shm = system == "ours-shm"
                        master = cluster.master_address
                        rec = bench_store(master, size, count, args.max_seconds, local_shm=shm)
                        if args.no_sync_commits:
                            rec["system"] += "-nosync"
                        records.append(rec)
                    elif system.startswith(("ours-shm-batch", "ours-tcp-batch")):
                        suffix = system.rsplit("batch", 1)[1]
                        if not suffix.isdigit() or int(suffix) < 1:
                            raise SystemExit(f"{system!r}: write the batch size, e.g. {system}128")
                        batch = int(suffix)
                        master = cluster.master_address
                        shm = system.startswith("ours-shm")
                        records.append(
                            bench_batch(
                                master, size, count, args.max_seconds, local_shm=shm, batch=batch
                            )
                        )
                    elif system == "memcpy":
                        records.append(bench_memcpy(size, count, args.max_seconds))
                    elif system == "tcp":
                        records.append(bench_tcp(size, count, args.max_seconds))
                    else:
                        raise SystemExit(f"unknown system {system!r}")
    print_table(records)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": {"cpus": os.cpu_count()}, "records": records}, indent=2))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
