"""How long the master's serving loop is held by big lookups (issue 11, master/batches.py).

An in-process master; a client thread sends `--rounds` BatchGetReplicaList calls of `--keys`
keys each; a probe on the master's loop measures how late a 1 ms sleep wakes up (the longest
time any other call, or the tick, would have waited).  `--slice 0` serves each batch in one go
(the behaviour before slicing), for comparison.

    python scripts/loop_lag.py                 # sliced (1024 keys between yields)
    python scripts/loop_lag.py --slice 0       # unsliced
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time

import mooncake_store.master.batches as batches
import mooncake_store.master.service as service
from mooncake_store.client.master_client import MasterClient
from mooncake_store.client.types import Retry
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.server import MasterServer


async def measure(keys: int, rounds: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as data_dir:
        config = MasterConfig(port=0, data_dir=data_dir, max_batch_items=max(keys, 1))
        server = MasterServer(config)
        port = await server.start()
        lags: list[float] = []
        done = threading.Event()
        elapsed = [0.0]

        def client() -> None:
            async def run() -> None:
                master = MasterClient(f"127.0.0.1:{port}", timeout_s=120, retry=Retry())
                names = [f"absent/{i}" for i in range(keys)]
                started = time.perf_counter()
                for _ in range(rounds):
                    await master.get_replica_list(names)
                elapsed[0] = time.perf_counter() - started
                await master.close()

            asyncio.run(run())
            done.set()

        thread = threading.Thread(target=client)
        thread.start()
        while not done.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - started - 0.001)
        thread.join()
        await server.stop(0.5)
    lags.sort()
    return {
        "max_lag_ms": lags[-1] * 1000,
        "p99_lag_ms": lags[int(len(lags) * 0.99)] * 1000,
        "client_s": elapsed[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slice", type=int, default=batches.SLICE_ITEMS,
                        help="keys between yields; 0: no slicing")  # fmt: skip
    parser.add_argument("--json", default="", help="also write the result here")
    args = parser.parse_args()
    slice_items = args.slice or sys.maxsize
    batches.SLICE_ITEMS = service.SLICE_ITEMS = slice_items
    result = {"keys": args.keys, "rounds": args.rounds, "slice": args.slice}
    result.update(asyncio.run(measure(args.keys, args.rounds)))
    print(
        f"{args.rounds} x {args.keys}-key BatchGetReplicaList, slice {args.slice or 'off'}: "
        f"master loop lag max {result['max_lag_ms']:.0f} ms, p99 {result['p99_lag_ms']:.0f} ms; "
        f"client {result['client_s']:.2f} s"
    )
    if args.json:
        with open(args.json, "w") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
