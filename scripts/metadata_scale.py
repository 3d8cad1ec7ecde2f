#!/usr/bin/env python3
"""How much master memory a block costs, and how fast a 128-key prefix lookup is at scale.

Fills the master's real ObjectTable directly (no network, no bytes on nodes): fake nodes mount
big DRAM segments, then `--blocks` objects are put (PutStart + PutEnd on the table, through the
allocator and the eviction policy, exactly as the RPCs would) as prefix chains of `--chain`
blocks with 64-hex-character content-hash keys, like engine KV blocks.  Then it measures:

  rss_per_block   (RSS after the fill - RSS before) / blocks
  full_gc_ms      a full gc.collect() over the filled table, before and after the master's
                  periodic freeze of long-lived objects
  lookup_us       BatchGetReplicaList of 128 chained keys through the master's servicer, the
                  request parsed from bytes and the reply serialized (what one RPC costs the
                  master, without the socket), p50 / p99 over --lookups calls

Usage: python scripts/metadata_scale.py [--blocks 10000000] [--json OUT]
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.process import freeze_long_lived, map_large_allocations
from mooncake_store.master.segments import NodeInfo, SegmentInfo, Tier
from mooncake_store.master.server import MasterServer
from mooncake_store.master.service import MasterServicer

BLOCK_BYTES = 64 * 1024


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def run_sync(coro):  # type: ignore[no-untyped-def]
    """Run a servicer method that never waits (lookups don't), as the framed endpoint does."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("the lookup waited on something")


def chain_keys(chain_id: int, length: int) -> list[str]:
    keys = []
    parent = b"root-%d" % chain_id
    for _ in range(length):
        parent = hashlib.sha256(parent).digest()
        keys.append(parent.hex())
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=10_000_000)
    parser.add_argument("--chain", type=int, default=128, help="blocks per prefix chain")
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--lookups", type=int, default=2000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    for name in ("blocks", "chain", "nodes", "lookups"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    map_large_allocations()  # as the master's serve() does
    server = MasterServer(MasterConfig(port=0, data_dir="/nonexistent", hot_reads=0))
    table = server.table
    servicer = MasterServicer(table, None, server.config, server.tiering, server.replication)  # type: ignore[arg-type]
    per_node = (args.blocks * BLOCK_BYTES) // args.nodes + (1 << 30)
    for n in range(args.nodes):
        node = NodeInfo(
            f"node-{n}", 1, f"10.0.0.{n}:7000", f"mooncake-node-{n}", "", os.urandom(32)
        )
        table.mount(node, [(SegmentInfo(node, n + 1, Tier.DRAM, per_node), None)])

    gc.collect()
    gc.freeze()  # what a long-running master does not pay for: a full GC over millions of objects
    before = rss_bytes()
    chains = (args.blocks + args.chain - 1) // args.chain
    started = time.perf_counter()
    put = 0
    fingerprint = os.urandom(16)  # one engine identity, as in a deployment
    for c in range(chains):
        keys = chain_keys(c, min(args.chain, args.blocks - put))
        parent = ""
        for key in keys:
            # Fresh string objects, as protobuf decoding hands the master.
            table.put_start(
                key, BLOCK_BYTES, 1, parent_key=(parent + ".")[:-1],
                fingerprint=bytes(bytearray(fingerprint)),
            )  # fmt: skip
            table.put_end(key, 0x5EED ^ put)
            table.commit_put_end(key)
            parent = key
            put += 1
        if c % 2000 == 0 and c:
            rate = put / (time.perf_counter() - started)
            print(f"  {put:>10,} blocks, {(rss_bytes() - before) / put:.0f} B/block, "
                  f"{rate:,.0f} puts/s", flush=True)  # fmt: skip
    fill_s = time.perf_counter() - started
    t0 = time.perf_counter()
    gc.collect()
    full_gc_s = time.perf_counter() - t0  # what a full collection would stall the master
    freeze_long_lived()  # what the master does every few seconds
    t0 = time.perf_counter()
    gc.collect()
    frozen_gc_s = time.perf_counter() - t0
    after = rss_bytes()
    table.take_dirty()  # the fill's RocksDB mutations: not part of the resident cost

    rng = random.Random(1)
    samples = []
    for _ in range(args.lookups):
        c = rng.randrange(chains)
        keys = chain_keys(c, min(args.chain, args.blocks - c * args.chain))[:128]
        raw = pb.KeysRequest(keys=keys).SerializeToString()
        t0 = time.perf_counter()
        request = pb.KeysRequest.FromString(raw)
        reply = run_sync(servicer.BatchGetReplicaList(request, None))
        reply.SerializeToString()
        samples.append((time.perf_counter() - t0) * 1e6)
        assert len(reply.results) == len(keys) and all(r.status.code == 0 for r in reply.results)
    samples.sort()
    result = {
        "blocks": args.blocks,
        "objects_in_table": table.object_count(),
        "rss_before_bytes": before,
        "rss_after_bytes": after,
        "rss_per_block_bytes": round((after - before) / args.blocks, 1),
        "rss_total_gib": round(after / 2**30, 2),
        "fill_seconds": round(fill_s, 1),
        "full_gc_ms": round(full_gc_s * 1e3, 1),
        "full_gc_after_freeze_ms": round(frozen_gc_s * 1e3, 1),
        "lookup_keys": 128,
        "lookup_p50_us": round(statistics.median(samples), 1),
        "lookup_p99_us": round(samples[int(len(samples) * 0.99)], 1),
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
