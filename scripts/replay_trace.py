#!/usr/bin/env python3
"""Replay a Mooncake-format trace against a real cluster, next to LRU and Belady simulations.

Each trace line has `timestamp`, `input_length`, `output_length` and `hash_ids` (each hash id is
one 512-token block; requests that share a prefix share leading hash ids).  For every request
the replay reads the longest cached prefix in one batch call (`get_prefix_into`: one RPC finds
and leases the run, then the blocks are copied and checked byte for byte), then writes the
missing blocks with their parent keys (`put_many`: stored blocks deduplicate).  The store runs
one node whose DRAM holds exactly `--capacity-blocks` blocks (plus an NVMe tier with
`--nvme-blocks`), with the master's eviction policy set by `--policy`.

For the same capacity the script also simulates plain LRU, the master's own policy classes
driven without a cluster, and Belady's offline optimum (evict the block needed furthest in the
future), so the store's hit rate stands next to both.  Hit rate = blocks served from the cache
/ blocks requested, where a request is served its longest cached prefix.

    python scripts/replay_trace.py TRACE.jsonl --capacity-blocks 3000 [--policy weighted|lru]
        [--requests N] [--block-bytes 4096] [--nvme-blocks 0] [--json OUT.json]

`--capacity-blocks` also takes a list (1000,3000,6000) and then prints one row per capacity.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import tempfile
import time
from collections import OrderedDict, defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store import Client  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402
from mooncake_store.master.eviction import (  # noqa: E402
    LOST_PARENT,
    NO_PARENT,
    EvictionPolicy,
    make_policy,
)

DEFAULT_TRACE = ROOT / "data" / "traces" / "synthetic_trace.jsonl"


class Progress:
    """A progress line on stderr at most every `every_s` (a full replay takes over a minute)."""

    def __init__(self, what: str, total: int, every_s: float = 5.0) -> None:
        self.what, self.total, self.every_s = what, total, every_s
        self.started = self.last = time.monotonic()

    def update(self, done: int, stats: dict) -> None:
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        rate = stats["hits"] / max(stats["blocks"], 1)
        print(f"{self.what}: {done}/{self.total} requests, hit rate so far {rate:.3f}, "
              f"{now - self.started:.0f}s", file=sys.stderr, flush=True)  # fmt: skip


def load_trace(path: str, limit: int | None) -> list[list[int]]:
    requests = []
    with open(path) as f:
        for line in f:
            if line.strip():
                requests.append([int(h) for h in json.loads(line)["hash_ids"]])
            if limit is not None and len(requests) >= limit:
                break
    return requests


def key_of(hash_id: int) -> str:
    return f"blk-{hash_id}"


# ---- simulators ---------------------------------------------------------------------------


def simulate_lru(requests: list[list[int]], capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = total = 0
    for ids in requests:
        n = next((i for i, h in enumerate(ids) if h not in cache), len(ids))
        for h in ids[:n]:
            cache.move_to_end(h)
        hits, total = hits + n, total + len(ids)
        for h in ids[n:]:
            if h in cache:
                continue
            if len(cache) >= capacity:
                cache.popitem(last=False)
            cache[h] = None
    return hits / max(total, 1)


def simulate_policy(requests: list[list[int]], capacity: int, policy: EvictionPolicy) -> float:
    """The master's policy class on a one-segment cache of `capacity` blocks, with slots
    handed out (and reused) as the object table does."""
    segment = 1
    slots: dict[str, int] = {}  # cached key -> slot
    keys_of: dict[int, str] = {}
    free: list[int] = []
    hits = total = 0
    for ids in requests:
        keys = [key_of(h) for h in ids]
        n = next((i for i, k in enumerate(keys) if k not in slots), len(keys))
        for k in keys[:n]:
            policy.access(slots[k])
        hits, total = hits + n, total + len(keys)
        for i in range(n, len(keys)):
            if keys[i] in slots:
                continue
            while len(slots) >= capacity:
                victim = policy.pick(segment, lambda _: True)
                assert victim is not None
                key = keys_of.pop(victim)
                policy.discard(victim, segment, key)
                del slots[key]
                free.append(victim)
            slot = free.pop() if free else len(slots)
            slots[keys[i]], keys_of[slot] = slot, keys[i]
            parent = slots.get(keys[i - 1], LOST_PARENT) if i else NO_PARENT
            policy.insert(slot, segment, parent=parent, key=keys[i])
    return hits / max(total, 1)


def simulate_belady(requests: list[list[int]], capacity: int) -> float:
    uses: dict[int, list[int]] = defaultdict(list)
    for t, ids in enumerate(requests):
        for h in ids:
            uses[h].append(t)
    cursor: dict[int, int] = defaultdict(int)

    def next_use(h: int, now: int) -> int:
        times, i = uses[h], cursor[h]
        while i < len(times) and times[i] <= now:
            i += 1
        cursor[h] = i
        return times[i] if i < len(times) else 1 << 60

    cache: set[int] = set()
    heap: list[tuple[int, int]] = []  # (-next use, block): furthest first
    hits = total = 0
    for t, ids in enumerate(requests):
        n = next((i for i, h in enumerate(ids) if h not in cache), len(ids))
        hits, total = hits + n, total + len(ids)
        for h in ids:
            if h in cache:
                heapq.heappush(heap, (-next_use(h, t), h))
        for h in ids[n:]:
            if h in cache:
                continue
            while len(cache) >= capacity:
                neg, victim = heapq.heappop(heap)
                if victim in cache and -neg == next_use(victim, t):
                    cache.discard(victim)
            cache.add(h)
            heapq.heappush(heap, (-next_use(h, t), h))
    return hits / max(total, 1)


# ---- the real store -----------------------------------------------------------------------


def block_value(hash_id: int, block_bytes: int) -> np.ndarray:
    """Deterministic content of a block, so every read can be checked."""
    return np.random.default_rng(hash_id).integers(0, 255, block_bytes, dtype=np.uint8)


def replay_store(requests: list[list[int]], capacity: int, *, policy: str, block_bytes: int,
                 nvme_blocks: int, workdir: str) -> dict:  # fmt: skip
    # One engine whose prefill batch may be most of a tiny pool: let its pending puts evict
    # for up to 90% of it (the master's default bound is half a pool).
    master_args = ["--eviction-policy", policy, "--lease-ttl", "20ms", "--max-pending-share", "0.9"]
    node_args: list[str] = []
    if nvme_blocks:
        node_args = ["--nvme-dir", f"{workdir}/nvme", "--nvme", str(nvme_blocks * block_bytes)]
    else:
        master_args += ["--dram-high-watermark", "1.0", "--dram-low-watermark", "1.0"]
    dram = capacity * block_bytes
    stats = {"hits": 0, "blocks": 0, "wrong_bytes": 0, "bytes_read": 0, "bytes_written": 0,
             "put_failures": 0}  # fmt: skip
    started = time.perf_counter()
    with LocalCluster(workdir, nodes=1, dram=str(dram), master_args=master_args,
                      node_args=node_args) as cluster:  # fmt: skip
        with Client(cluster.master_address) as store:
            buffers = [np.empty(block_bytes, dtype=np.uint8) for _ in range(512)]
            progress = Progress(f"replay at {capacity} blocks ({policy})", len(requests))
            for done, ids in enumerate(requests):
                progress.update(done, stats)
                keys = [key_of(h) for h in ids]
                while len(buffers) < len(keys):
                    buffers.append(np.empty(block_bytes, dtype=np.uint8))
                read = store.get_prefix_into(keys, buffers[: len(keys)])
                n = read.matched
                for h, buf in zip(ids[:n], buffers, strict=False):
                    if not np.array_equal(buf, block_value(h, block_bytes)):
                        stats["wrong_bytes"] += block_bytes
                stats["hits"] += n
                stats["blocks"] += len(keys)
                stats["bytes_read"] += n * block_bytes
                missing = list(range(n, len(keys)))
                if not missing:
                    continue
                try:
                    results = store.put_many(
                        [(keys[i], block_value(ids[i], block_bytes)) for i in missing],
                        parents=[keys[i - 1] if i else None for i in missing],
                    )
                    written = sum(1 for r in results if not r.deduplicated)
                    stats["bytes_written"] += written * block_bytes
                except Exception as exc:
                    stats["put_failures"] += 1
                    stats.setdefault("last_put_error", repr(exc))
            tier_reads = {t: store.counters[f"{t.lower()}_reads"] for t in ("DRAM", "NVME")}
            counters = store.stats().counters
    stats["tier_hits"] = tier_reads
    stats["evictions"] = counters.get("evictions", 0)
    stats["demotions"] = counters.get("demotions", 0)
    stats["promotions"] = counters.get("promotions", 0)
    stats["elapsed_s"] = time.perf_counter() - started
    stats["hit_rate"] = stats["hits"] / max(stats["blocks"], 1)
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "trace", nargs="?", default=str(DEFAULT_TRACE),
        help="Mooncake-format JSONL trace (default: data/traces/synthetic_trace.jsonl)",
    )  # fmt: skip
    parser.add_argument(
        "--capacity-blocks",
        required=True,
        help="DRAM capacity in blocks (a comma-separated list runs each)",
    )
    parser.add_argument("--policy", choices=["weighted", "lru"], default="weighted")
    parser.add_argument("--requests", type=int, default=None, help="replay only the first N")
    parser.add_argument("--block-bytes", type=int, default=4096)
    parser.add_argument("--nvme-blocks", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--sim-only", action="store_true", help="skip the store replay")
    args = parser.parse_args()
    if args.block_bytes < 1 or args.block_bytes % 4096:
        parser.error("--block-bytes must be a positive multiple of 4096 (the allocation unit)")
    capacities = [int(c) for c in args.capacity_blocks.split(",")]
    if any(c < 1 for c in capacities):
        parser.error("--capacity-blocks must be >= 1")
    requests = load_trace(args.trace, args.requests)
    if not requests:
        parser.error(f"no requests in {args.trace}")

    runs = []
    for capacity in capacities:
        run: dict = {"requests": len(requests), "capacity_blocks": capacity,
                     "policy": args.policy, "block_bytes": args.block_bytes,
                     "nvme_blocks": args.nvme_blocks}  # fmt: skip
        run["lru_hit_rate"] = simulate_lru(requests, capacity)
        run["weighted_sim_hit_rate"] = simulate_policy(requests, capacity, make_policy("weighted"))
        run["belady_hit_rate"] = simulate_belady(requests, capacity)
        if not args.sim_only:
            with tempfile.TemporaryDirectory(prefix="mooncake-replay-") as tmp:
                run.update(replay_store(requests, capacity, policy=args.policy,
                                        block_bytes=args.block_bytes,
                                        nvme_blocks=args.nvme_blocks, workdir=tmp))  # fmt: skip
        runs.append(run)
        store = f"{run['hit_rate']:.3f}" if "hit_rate" in run else "-"
        ratio = "-"
        if "hit_rate" in run:
            lru = run["lru_hit_rate"]
            ratio = f"{run['hit_rate'] / lru:.2f}x" if lru else "inf"
        print(f"capacity {capacity:>6} blocks: store[{args.policy}] {store} ({ratio} LRU)  "
              f"LRU {run['lru_hit_rate']:.3f}  weighted(sim) {run['weighted_sim_hit_rate']:.3f}  "
              f"Belady {run['belady_hit_rate']:.3f}", flush=True)  # fmt: skip
        if "hit_rate" in run:
            print(f"    {run['blocks']} blocks requested, {run['hits']} hit "
                  f"(per tier {run['tier_hits']}), {run['bytes_read'] / 2**20:.1f} MiB read, "
                  f"{run['bytes_written'] / 2**20:.1f} MiB written, {run['evictions']} evictions, "
                  f"{run['demotions']} demotions, {run['promotions']} promotions, "
                  f"wrong bytes {run['wrong_bytes']}, put failures {run['put_failures']}, "
                  f"{run['elapsed_s']:.1f} s", flush=True)  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(runs[0] if len(runs) == 1 else runs, indent=2))


if __name__ == "__main__":
    main()
