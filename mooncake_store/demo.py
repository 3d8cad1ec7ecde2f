"""The demo workload of `make run`: an engine-like loop that reuses KV blocks across requests.

Each request is a token sequence; every 256-token block gets a prefix-chained content key
(xxh3_128 over the parent key and the block's token ids), so requests that share a prefix share
keys.  For each request the demo asks which leading blocks are cached (one batch call), reads
them into a KV buffer (one batch call), "computes" the missing blocks and writes them back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import xxhash

from mooncake_store.client.sync_client import Client

TOKENS_PER_BLOCK = 256
# A small model's KV per block: 4 layers x (K, V) x 8 heads x 64 dims x 256 tokens x fp16 = 2 MiB.
KV_SHAPE = (4, 2, 8, 64, TOKENS_PER_BLOCK)


def block_keys(tokens: np.ndarray, *, namespace: str = "demo-model") -> list[str]:
    """Prefix-chained keys of the full blocks of `tokens`."""
    keys, parent = [], xxhash.xxh3_128_digest(namespace.encode())
    for start in range(0, len(tokens) - TOKENS_PER_BLOCK + 1, TOKENS_PER_BLOCK):
        block = tokens[start : start + TOKENS_PER_BLOCK].astype("<u4").tobytes()
        parent = xxhash.xxh3_128_digest(parent + block)
        keys.append(parent.hex())
    return keys


def _fake_kv(key: str) -> np.ndarray:
    seed = int(key[:16], 16)
    return np.random.default_rng(seed).standard_normal(KV_SHAPE).astype(np.float16)


def run_demo(
    master: str, *, echo: Callable[[str], None] = print, requests: int = 6
) -> dict[str, int]:
    rng = np.random.default_rng(7)
    system_prompt = rng.integers(0, 32000, 4 * TOKENS_PER_BLOCK)
    totals = {"blocks": 0, "hits": 0, "bytes_read": 0, "bytes_written": 0}
    echo(f"{'request':>7} {'blocks':>6} {'cached':>6} {'read MiB':>8} {'wrote MiB':>9} {'ms':>7}")
    with Client(master) as store:
        for i in range(requests):
            user = rng.integers(0, 32000, (2 + i % 3) * TOKENS_PER_BLOCK)
            tokens = np.concatenate([system_prompt, user]) if i % 2 == 0 else user
            if i == requests - 1:
                tokens = np.concatenate([system_prompt, user])
            keys = block_keys(tokens)
            started = time.perf_counter()
            cached = store.exists_many(keys)
            hits = next((n for n, ok in enumerate(cached) if not ok), len(keys))
            kv = np.empty((len(keys), *KV_SHAPE), dtype=np.float16)
            if hits:
                store.get_many_into(keys[:hits], [kv[b] for b in range(hits)])
                for b in range(hits):  # the store returns exactly what was computed before
                    assert np.array_equal(kv[b], _fake_kv(keys[b]))
            for b in range(hits, len(keys)):
                kv[b] = _fake_kv(keys[b])
            store.put_many([(keys[b], kv[b]) for b in range(hits, len(keys))])
            elapsed_ms = (time.perf_counter() - started) * 1000
            block_bytes = kv[0].nbytes
            read, wrote = hits * block_bytes, (len(keys) - hits) * block_bytes
            echo(
                f"{i:>7} {len(keys):>6} {hits:>6} {read / 2**20:>8.1f} {wrote / 2**20:>9.1f} "
                f"{elapsed_ms:>7.1f}"
            )
            totals["blocks"] += len(keys)
            totals["hits"] += hits
            totals["bytes_read"] += read
            totals["bytes_written"] += wrote
        stats = store.stats()
    echo(
        f"prefix hits: {totals['hits']}/{totals['blocks']} blocks "
        f"({totals['bytes_read'] / 2**20:.0f} MiB of prefill reused); "
        f"store holds {stats.objects} objects on {stats.nodes} nodes, "
        f"{stats.used_bytes / 2**20:.0f}/{stats.capacity_bytes / 2**20:.0f} MiB used"
    )
    return totals
