#!/usr/bin/env python3
"""Markdown tables for the README from bench_compare.py's JSON (put/get GB/s per system).

python scripts/perf_tables.py bench-results/compare.json [--threads 1]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ORDER = ["ours-shm", "mooncake-shm", "ours-tcp", "mooncake-tcp", "redis", "memcpy", "tcp"]


def label(size: int) -> str:
    return f"{size >> 20}M" if size >= 1 << 20 else f"{size >> 10}K"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path)
    parser.add_argument("--threads", default="1")
    args = parser.parse_args()
    if not args.json.is_file():
        parser.error(f"{args.json} does not exist: run scripts/bench_compare.py --json {args.json}")
    data = json.loads(args.json.read_text())
    records = data["records"] if isinstance(data, dict) else data
    for threads in (int(t) for t in args.threads.split(",")):
        rows = [r for r in records if r["threads"] == threads]
        systems = [s for s in ORDER if any(r["system"] == s for r in rows)]
        sizes = sorted({r["size_bytes"] for r in rows})
        print(f"\n{threads} client thread(s), put / get GB/s\n")
        print("| size | " + " | ".join(systems) + " |")
        print("|---|" + "---|" * len(systems))
        for size in sizes:
            cells = []
            for system in systems:
                got = [r for r in rows if r["system"] == system and r["size_bytes"] == size]
                cells.append(f"{got[0]['put_gbps']:.2f} / {got[0]['get_gbps']:.2f}" if got else "-")
            print(f"| {label(size)} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
