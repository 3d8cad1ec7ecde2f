#!/usr/bin/env python3
"""GPU buffers through mooncake-store next to the machine's host<->device limits, in one run.

Starts a master and one store node on 127.0.0.1 (DRAM pool, and a GPU tier for the tier
reads), then for each size measures one client thread, median of --repeat, GB/s:
  get_into(cupy) gpu   same-host read into a cupy array (DMA from the registered pool), the
                       checksum computed on the GPU from the device buffer (verify "gpu")
  get_into(cupy) cpu   the same, the checksum hashed on CPU threads during the DMA ("cpu")
  get_into(numpy)      same-host read into a numpy array (CPU copy)
  put_from(cupy) gpu   same-host write from a cupy array (DMA into the registered pool),
                       checksum on the GPU; `cpu`: on CPU threads
  put_from(numpy)      same-host write from a numpy array
  tcp get_into(cupy)   the read over the TCP data path (local_shm=False): received into
                       pinned pieces, each copied up while the next is received
  gpu-tier get(cupy) a block promoted to the node's GPU tier, read same-host (CUDA IPC)
  pinned H2D/D2H     cudaMemcpy from/to cudaHostAlloc memory (the link's limit)
  pageable H2D/D2H   cupy set/get from/to ordinary numpy memory
Prints a table, writes JSON records (`--json`).  Without a GPU (or cupy) it says so and exits 0.

    python scripts/bench_gpu.py [--sizes 1M,4M,16M,64M] [--repeat 20] [--json OUT.json]
        [--no-leases] [--no-tier]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store import Client  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402
from mooncake_store.common.gpu import gpu_count  # noqa: E402
from mooncake_store.common.units import parse_size  # noqa: E402

LEASES = True  # the client's default (a steady put is one master round trip); --no-leases: off
COLUMNS = ["get_into(cupy) gpu", "get_into(cupy) cpu", "get_into(numpy)", "put_from(cupy) gpu",
           "put_from(cupy) cpu", "put_from(numpy)", "tcp get_into(cupy)", "gpu-tier get(cupy)",
           "pinned H2D", "pinned D2H", "pageable H2D", "pageable D2H"]  # fmt: skip
VERIFY_MODES = ("gpu", "cpu")


def timed(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> float:
    """Median seconds of `fn` over `repeat` runs (after one warm-up), device synced."""
    fn()
    sync()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def limits(cupy, size: int, repeat: int, sync) -> dict[str, float]:
    rt = cupy.cuda.runtime
    dev = cupy.empty(size, dtype=cupy.uint8)
    pinned_mem = cupy.cuda.alloc_pinned_memory(size)
    pinned = np.frombuffer(pinned_mem, dtype=np.uint8, count=size)
    pinned[:] = 1
    pageable = np.ones(size, dtype=np.uint8)
    out = {}
    out["pinned H2D"] = timed(lambda: rt.memcpy(dev.data.ptr, pinned.ctypes.data, size, 1),
                              repeat, sync)  # fmt: skip
    out["pinned D2H"] = timed(lambda: rt.memcpy(pinned.ctypes.data, dev.data.ptr, size, 2),
                              repeat, sync)  # fmt: skip
    out["pageable H2D"] = timed(lambda: dev.set(pageable), repeat, sync)
    out["pageable D2H"] = timed(lambda: dev.get(out=pageable), repeat, sync)
    return out


def store_cases(cupy, cluster: LocalCluster, size: int, repeat: int, sync) -> dict[str, float]:
    out: dict[str, float] = {}
    rng = np.random.default_rng(size)
    host = rng.integers(0, 256, size, dtype=np.uint8)
    dev = cupy.asarray(host)
    dest_dev = cupy.empty(size, dtype=cupy.uint8)
    dest_host = np.empty(size, dtype=np.uint8)
    counter = [0]

    def fresh_key(tag: str) -> str:
        counter[0] += 1
        return f"bench/{tag}/{size}/{counter[0]}"

    with (
        Client(cluster.master_address, leases=LEASES) as store,
        Client(cluster.master_address, local_shm=False, leases=LEASES) as tcp,
    ):
        from mooncake_store.client.cuda import cuda_path

        path = cuda_path()
        default_mode = path.verify
        store.put(f"bench/src/{size}", host)
        key = f"bench/src/{size}"
        store.get(key)  # maps the pool
        for mode in VERIFY_MODES:
            if not set_verify(path, mode):
                continue
            out[f"get_into(cupy) {mode}"] = timed(lambda: store.get_into(key, dest_dev), repeat,
                                                  sync)  # fmt: skip
            assert bool((dest_dev == dev).all()), f"get_into(cupy) {mode} returned wrong bytes"
            dest_dev.fill(0)
        path.verify = default_mode
        out["get_into(numpy)"] = timed(lambda: store.get_into(key, dest_host), repeat, sync)
        assert np.array_equal(dest_host, host)
        pipelined = tcp.counters.get("pipelined_reads", 0)
        out["tcp get_into(cupy)"] = timed(lambda: tcp.get_into(key, dest_dev), repeat, sync)
        assert bool((dest_dev == dev).all())
        assert tcp.counters.get("pipelined_reads", 0) > pipelined, "TCP read not pipelined"

        def put_dev() -> None:
            k = fresh_key("dev")
            store.put_from(k, dev)
            written.append(k)

        def put_host() -> None:
            k = fresh_key("host")
            store.put_from(k, host)
            written.append(k)

        cases = [(f"put_from(cupy) {mode}", put_dev, mode) for mode in VERIFY_MODES]
        for name, fn, mode in [*cases, ("put_from(numpy)", put_host, None)]:
            if mode is not None and not set_verify(path, mode):
                continue
            written: list[str] = []
            out[name] = timed(fn, repeat, sync)
            store.get_into(written[-1], dest_host)
            assert np.array_equal(dest_host, host), f"{name} stored wrong bytes"
            store.remove_many(written)
        path.verify = default_mode
        out["_counters"] = dict(path.counters)  # type: ignore[assignment]
    return out


def set_verify(path, mode: str) -> bool:
    """Switch the process's CUDA path to verifying on `mode`; False (and a message) when the
    GPU checksum cannot run here (it failed to build or its self-test)."""
    path.verify = mode
    try:
        path.gpu_checksum()
    except Exception as exc:
        print(f"  verify={mode}: not usable here: {exc!r}")
        path.verify = "cpu"
        return False
    if path.verify != mode:
        print(f"  verify={mode}: fell back to {path.verify}")
        return False
    return True


def gpu_tier_case(cupy, root: Path, size: int, repeat: int, sync) -> float | None:
    """Read a block served from the node's GPU tier (promoted by repeated reads)."""
    gpu_bytes = f"{max(4 * size, 64 << 20) >> 20}MiB"
    with LocalCluster(root, nodes=1, dram=f"{max(4 * size, 64 << 20) >> 20}MiB",
                      master_args=["--promote-after-reads", "1", "--hot-reads", "0"],
                      node_args=["--gpu-bytes", gpu_bytes]) as cluster:  # fmt: skip
        with Client(cluster.master_address) as store:
            host = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
            store.put("tier/hot", host)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                store.get("tier/hot")
                if any(n.tier == "GPU" and n.objects for n in store.list_nodes()):
                    break
                time.sleep(0.2)
            else:
                print(f"  gpu tier: block of {size} bytes was not promoted; skipped")
                return None
            dest = cupy.empty(size, dtype=cupy.uint8)
            before = store.counters.get("gpu_reads", 0)
            seconds = timed(lambda: store.get_into("tier/hot", dest), repeat, sync)
            assert bool((dest == cupy.asarray(host)).all()), "GPU-tier read returned wrong bytes"
            if store.counters.get("gpu_reads", 0) == before:
                print("  gpu tier: reads did not come from the GPU tier")
                return None
            return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1M,4M,16M,64M")
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-tier", action="store_true", help="skip the GPU-tier reads")
    parser.add_argument(
        "--leases",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="clients hold allocation leases (the default; --no-leases: two-phase)",
    )
    args = parser.parse_args()
    global LEASES
    LEASES = args.leases
    if gpu_count() == 0:
        print("bench_gpu: no CUDA GPU usable through cupy here (or cupy not installed); skipped")
        return 0
    import cupy

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    sync = cupy.cuda.Device().synchronize
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        dram = f"{max(8 * max(sizes), 256 << 20) >> 20}MiB"
        with LocalCluster(Path(tmp) / "c", nodes=1, dram=dram) as cluster:
            for size in sizes:
                row: dict[str, object] = {"size_bytes": size}
                seconds = limits(cupy, size, args.repeat, sync)
                seconds.update(store_cases(cupy, cluster, size, args.repeat, sync))
                row["counters"] = seconds.pop("_counters", {})
                for name, s in seconds.items():
                    row[name] = size / s / 1e9
                records.append(row)
                print(f"{size >> 20} MiB done", flush=True)
        if not args.no_tier:
            for row in records:
                size = int(row["size_bytes"])  # type: ignore[arg-type]
                try:
                    s = gpu_tier_case(cupy, Path(tmp) / f"tier{size}", size, args.repeat, sync)
                except Exception as exc:  # report, keep the rest of the table
                    print(f"  gpu tier at {size} bytes failed: {exc!r}")
                    s = None
                row["gpu-tier get(cupy)"] = None if s is None else size / s / 1e9
    print(f"\nGB/s, median of {args.repeat}, one client thread, node on the same host\n")
    print("| size | " + " | ".join(f"`{c}`" for c in COLUMNS) + " |")
    print("|---|" + "---|" * len(COLUMNS))
    for row in records:
        cells = [f"{row[c]:.1f}" if isinstance(row.get(c), float) else "-" for c in COLUMNS]
        print(f"| {int(row['size_bytes']) >> 20} MiB | " + " | ".join(cells) + " |")  # type: ignore[arg-type]
    ratios = []
    for row in records:
        h2d, d2h = row.get("pinned H2D"), row.get("pinned D2H")
        cells = []
        for name, limit in (("get_into(cupy) gpu", h2d), ("get_into(cupy) cpu", h2d),
                            ("tcp get_into(cupy)", h2d), ("put_from(cupy) gpu", d2h),
                            ("put_from(cupy) cpu", d2h)):  # fmt: skip
            got = row.get(name)
            if isinstance(got, float) and isinstance(limit, float):
                cells.append(f"{name} {got / limit:.2f}x")
        if cells:
            ratios.append(f"{int(row['size_bytes']) >> 20} MiB (x the pinned limit): "  # type: ignore[arg-type]
                          + ", ".join(cells))  # fmt: skip
    print("\n".join(ratios))
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
