#!/usr/bin/env python3
"""A worked example of the KV-cache layer: an "engine" replaying a Mooncake request trace.

For each request of the trace (`hash_ids` are 512-token blocks; the tokens of each block are
synthesised from its hash id, so requests that share hash ids share token prefixes), the engine
hashes its full blocks into keys, asks the store for the longest cached prefix (one RPC), reads
that prefix into KV buffers, "computes" the rest (bytes derived from the key, so every read can
be checked) and writes the missing blocks back.  It prints the hit rate and the prefill saved.

    python scripts/kv_engine_example.py [TRACE.jsonl] [--requests 1000] [--hasher vllm-sha256-cbor]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xxhash

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store import Client, NoSpaceError  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402
from mooncake_store.kv import HASHERS, EngineIdentity, KVCache, KVLayout  # noqa: E402

TRACE_BLOCK_TOKENS = 512
DEFAULT_TRACE = ROOT / "data" / "traces" / "synthetic_trace.jsonl"  # see data/traces/README.md


def request_tokens(request: dict, index: int) -> np.ndarray:
    parts = [np.random.default_rng(h).integers(0, 32000, TRACE_BLOCK_TOKENS)
             for h in request["hash_ids"]]  # fmt: skip
    tail = request["input_length"] - TRACE_BLOCK_TOKENS * len(parts)
    if tail > 0:
        parts.append(np.random.default_rng(10**9 + index).integers(0, 32000, tail))
    return np.concatenate(parts)[: request["input_length"]]


def computed_block(key: str, layout: KVLayout) -> np.ndarray:
    """The KV bytes this engine computes for a block (derived from its key, so checkable)."""
    seed = xxhash.xxh3_64_intdigest(key.encode())
    raw = np.random.default_rng(seed).integers(0, 255, layout.block_bytes, dtype=np.uint8)
    return raw.view(np.float16).reshape(layout.block_shape)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--hasher", choices=sorted(HASHERS), default="xxh3")
    parser.add_argument("--dram", default="512MiB", help="DRAM per store node")
    parser.add_argument("--json", help="write the summary here")
    args = parser.parse_args()

    layout = KVLayout(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16",
                      tokens_per_block=TRACE_BLOCK_TOKENS)  # fmt: skip
    identity = EngineIdentity("example-model", layout, revision="demo")
    hasher = HASHERS[args.hasher](tokens_per_block=TRACE_BLOCK_TOKENS)
    with open(args.trace) as f:
        requests = [json.loads(line) for _, line in zip(range(args.requests), f, strict=False)]

    totals = {"requests": 0, "blocks": 0, "hit_blocks": 0, "written_blocks": 0,
              "unstored_blocks": 0, "verified_blocks": 0}  # fmt: skip
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mooncake-kv-example-") as tmp:
        with LocalCluster(tmp, nodes=2, dram=args.dram) as cluster:
            with Client(cluster.master_address) as store:
                kv = KVCache(store, identity, hasher=hasher)
                for i, request in enumerate(requests):
                    keys = kv.block_keys(request_tokens(request, i))
                    buffers = [layout.empty_block() for _ in keys]
                    hit = kv.get_prefix(keys, into=buffers).matched
                    for key, buf in zip(keys[:hit], buffers, strict=False):
                        # Compare bytes: random bytes viewed as float16 include NaNs.
                        if buf.tobytes() != computed_block(key, layout).tobytes():
                            raise SystemExit(f"request {i}: block {key} read back wrong bytes")
                    missing = [computed_block(k, layout) for k in keys[hit:]]
                    try:
                        written = kv.put_prefix(keys, buffers[:hit] + missing)
                    except NoSpaceError:
                        written = 0
                        totals["unstored_blocks"] += len(missing)
                    totals["requests"] += 1
                    totals["blocks"] += len(keys)
                    totals["hit_blocks"] += hit
                    totals["verified_blocks"] += hit
                    totals["written_blocks"] += written
    elapsed = time.perf_counter() - started
    hit_rate = totals["hit_blocks"] / max(1, totals["blocks"])
    saved_tokens = totals["hit_blocks"] * TRACE_BLOCK_TOKENS
    summary = {**totals, "hasher": hasher.name, "block_bytes": layout.block_bytes,
               "hit_rate": hit_rate, "prefill_tokens_saved": saved_tokens,
               "bytes_read": totals["hit_blocks"] * layout.block_bytes,
               "bytes_written": totals["written_blocks"] * layout.block_bytes,
               "elapsed_s": elapsed}  # fmt: skip
    print(f"requests {totals['requests']}, blocks {totals['blocks']}, "
          f"hit {totals['hit_blocks']} ({hit_rate:.1%}), written {totals['written_blocks']}, "
          f"not stored (pool full) {totals['unstored_blocks']}")  # fmt: skip
    print(f"prefill saved: {saved_tokens} tokens, {summary['bytes_read'] / 2**20:.1f} MiB of KV "
          f"read instead of recomputed; every hit verified byte for byte; {elapsed:.1f} s "
          f"({args.hasher} keys)")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
