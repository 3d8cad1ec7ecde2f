#!/usr/bin/env python3
"""The copy-and-hash step of same-host puts and gets next to a plain memcpy, in one run.

Every case copies between cold buffers (source and destination each rotate through 512 MiB,
the `memcpy-cold` of bench_compare.py) and, except memcpy, returns the store's checksum of the
copy (client/steps.py `copy_checksum`, common/copyhash.py):
  memcpy         numpy's copy, no checksum: the limit the README's goals compare against
  native         the C kernel (mooncake_store/native), one thread
  native-split   the C kernel, the back half on the process's copy helper from 8 MiB
  numpy          numpy's copy then xxh3 of each 1 MiB chunk, one thread
  numpy-split    the same with the copy helper
Rounds are interleaved (every case once per round) and each cell is the median over rounds.

    python scripts/bench_copyhash.py [--sizes 64K,1M,4M,16M,64M] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store.client import steps  # noqa: E402
from mooncake_store.common import copyhash  # noqa: E402
from mooncake_store.common.units import parse_size  # noqa: E402

SPAN = 512 << 20


def cases() -> dict[str, tuple[object, int] | None]:
    """name -> (copy_digest, split threshold); None: plain memcpy."""
    never = 1 << 62
    out: dict[str, tuple[object, int] | None] = {"memcpy": None}
    if copyhash.KERNEL != "numpy":
        out["native"] = (copyhash.copy_digest, never)
        out["native-split"] = (copyhash.copy_digest, steps._SPLIT_COPY)
    out["numpy"] = (copyhash.numpy_copy_digest, never)
    out["numpy-split"] = (copyhash.numpy_copy_digest, steps._SPLIT_COPY)
    return out


def measure(size: int, case: tuple[object, int] | None, src: np.ndarray, dst: np.ndarray,
            ops: int) -> float:  # fmt: skip
    """Median microseconds of `ops` copies of `size` bytes at rotating offsets."""
    slots = SPAN // size
    saved = (steps.copy_digest, steps._SPLIT_COPY, steps._HELPER._copy)
    if case is not None:
        steps.copy_digest, steps._SPLIT_COPY = case  # type: ignore[assignment]
        steps._HELPER._copy = case[0]  # type: ignore[assignment]
    times = []
    try:
        for i in range(ops):
            a, b = (i * 7 % slots) * size, (i * 13 % slots) * size
            to, frm = dst[b : b + size], src[a : a + size]
            started = time.perf_counter()
            if case is None:
                np.copyto(to, frm)
            else:
                steps.copy_checksum(memoryview(to), memoryview(frm))
            times.append(time.perf_counter() - started)
    finally:
        steps.copy_digest, steps._SPLIT_COPY, steps._HELPER._copy = saved
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="64K,1M,4M,16M,64M")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="write the records here")
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    src = np.random.default_rng(0).integers(0, 256, SPAN, dtype=np.uint8)
    dst = np.ones(SPAN, dtype=np.uint8)  # touched: no page faults in the timings
    table = cases()
    runs: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for size in sizes:
            ops = max(8, min(200, (256 << 20) // size))
            for name, case in table.items():
                runs.setdefault((size, name), []).append(measure(size, case, src, dst, ops))
    print(f"kernel: {copyhash.KERNEL}; median of {args.rounds} rounds, microseconds and GB/s")
    print(f"{'size':>5} {'case':<13} {'us':>8} {'GB/s':>6}  vs memcpy")
    records = []
    for size in sizes:
        base = statistics.median(runs[(size, "memcpy")])
        for name in table:
            us = statistics.median(runs[(size, name)])
            label = f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"
            print(f"{label:>5} {name:<13} {us:8.0f} {size / us / 1e3:6.2f}  {base / us:.2f}x")
            records.append({"size_bytes": size, "case": name, "us": us,
                            "gbps": size / us / 1e3, "vs_memcpy": base / us,
                            "rounds_us": runs[(size, name)],
                            "kernel": copyhash.KERNEL})  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
