"""Scatter-gather against contiguous batch puts and gets, in one run (issue 13).

Each batch is 64 objects of 2 x 256 KiB (a K part and a V part, as vLLM and SGLang store a
block).  Scatter-gather stores each object from its two buffers and reads it back into two
buffers (`put_many_from_parts` / `get_many_into_parts`; Mooncake's
`batch_put_from_multi_buffers` / `batch_get_into_multi_buffers`); contiguous moves the same
bytes from one 512 KiB buffer per object (`put_many` / `get_many_into`; `batch_put_from` /
`batch_get_into`).  Both run interleaved against the same cluster, on the same-host shared
memory path and on the TCP path, through the SDK and through the Mooncake-compatible API.
Puts use fresh keys each round (a put of a stored key writes nothing); the removal after each
round is not timed.

    python scripts/bench_sg.py [--rounds 30] [--json out.json]
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable

import click
import numpy as np

from mooncake_store.client.sync_client import Client
from mooncake_store.cluster import LocalCluster
from mooncake_store.compat import MooncakeDistributedStore

OBJECTS, PART = 64, 256 * 1024
BYTES = OBJECTS * 2 * PART


def ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


class Case:
    """The four timed operations of one API on one data path."""

    def __init__(self, name: str, client: Client | None, compat: MooncakeDistributedStore | None):
        self.name = name
        self.client = client
        self.compat = compat
        rng = np.random.default_rng(0)
        self.parts = [[rng.integers(0, 256, PART, dtype=np.uint8) for _ in range(2)]
                      for _ in range(OBJECTS)]  # fmt: skip
        self.whole = [np.concatenate(p) for p in self.parts]
        self.out_parts = [
            [np.zeros(PART, dtype=np.uint8) for _ in range(2)] for _ in range(OBJECTS)
        ]
        self.out_whole = [np.zeros(2 * PART, dtype=np.uint8) for _ in range(OBJECTS)]
        self.round = 0

    def keys(self, kind: str) -> list[str]:
        return [f"bench/{self.name}/{kind}/{self.round}/{i}" for i in range(OBJECTS)]

    def put(self, kind: str, keys: list[str]) -> None:
        if self.client is not None:
            if kind == "sg":
                self.client.put_many_from_parts(list(zip(keys, self.parts, strict=True)))
            else:
                self.client.put_many(list(zip(keys, self.whole, strict=True)))
            return
        assert self.compat is not None
        if kind == "sg":
            res = self.compat.batch_put_from_multi_buffers(
                keys, [[ptr(a), ptr(b)] for a, b in self.parts], [[PART, PART]] * OBJECTS
            )
        else:
            res = self.compat.batch_put_from(
                keys, [ptr(w) for w in self.whole], [2 * PART] * OBJECTS
            )
        assert res == [0] * OBJECTS, res

    def get(self, kind: str, keys: list[str]) -> None:
        if self.client is not None:
            if kind == "sg":
                self.client.get_many_into_parts(keys, self.out_parts)
            else:
                self.client.get_many_into(keys, self.out_whole)
            return
        assert self.compat is not None
        if kind == "sg":
            res = self.compat.batch_get_into_multi_buffers(
                keys, [[ptr(a), ptr(b)] for a, b in self.out_parts], [[PART, PART]] * OBJECTS
            )
        else:
            res = self.compat.batch_get_into(
                keys, [ptr(w) for w in self.out_whole], [2 * PART] * OBJECTS
            )
        assert res == [2 * PART] * OBJECTS, res

    def check(self) -> None:
        for want, got in zip(self.parts, self.out_parts, strict=True):
            assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))
        for want, got in zip(self.whole, self.out_whole, strict=True):
            assert np.array_equal(want, got)

    def remove(self, keys: list[str]) -> None:
        if self.client is not None:
            self.client.remove_many(keys)
        else:
            assert self.compat is not None
            self.compat.batch_remove(keys, True)


def timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_case(case: Case, rounds: int) -> dict[str, float]:
    samples: dict[str, list[float]] = {
        f"{op}_{k}": [] for op in ("put", "get") for k in ("sg", "contig")
    }
    read_keys = {k: case.keys(f"read-{k}") for k in ("sg", "contig")}
    for kind, keys in read_keys.items():
        case.put(kind, keys)
    for r in range(rounds + 2):  # two warm-up rounds, not recorded
        case.round = r
        order = ("sg", "contig") if r % 2 else ("contig", "sg")  # interleaved, alternating
        for kind in order:
            keys = case.keys(kind)
            put_s = timed(lambda: case.put(kind, keys))  # noqa: B023
            get_s = timed(lambda: case.get(kind, read_keys[kind]))  # noqa: B023
            case.remove(keys)
            if r >= 2:
                samples[f"put_{kind}"].append(put_s)
                samples[f"get_{kind}"].append(get_s)
    case.check()
    return {name: statistics.median(values) for name, values in samples.items()}


@click.command()
@click.option("--rounds", default=30, show_default=True, help="Timed rounds per operation.")
@click.option("--json", "json_path", default=None, help="Write the results here.")
def main(rounds: int, json_path: str | None) -> None:
    results = []
    with (
        tempfile.TemporaryDirectory() as root,
        LocalCluster(root, nodes=2, dram="512MiB") as cluster,
    ):
        master = cluster.master_address
        compat = MooncakeDistributedStore()
        assert compat.setup("127.0.0.1", "", 0, 0, "tcp", "", master) == 0
        with Client(master, local_shm=True) as shm, Client(master, local_shm=False) as tcp:
            cases = [Case("sdk-shm", shm, None), Case("sdk-tcp", tcp, None),
                     Case("compat-shm", None, compat)]  # fmt: skip
            for case in cases:
                medians = run_case(case, rounds)
                results.append({"case": case.name, **medians})
        compat.close()
    click.echo(f"{OBJECTS} objects x 2 x {PART // 1024} KiB per batch ({BYTES >> 20} MiB), "
               f"median of {rounds} rounds")  # fmt: skip
    click.echo(
        f"{'case':<12} {'op':<4} {'scatter-gather':>16} {'contiguous':>16} {'sg/contig':>10}"
    )
    for row in results:
        for op in ("put", "get"):
            sg, contig = row[f"{op}_sg"], row[f"{op}_contig"]
            row[f"{op}_ratio"] = sg / contig
            click.echo(
                f"{row['case']:<12} {op:<4} {sg * 1e3:8.2f} ms {BYTES / sg / 1e9:5.2f}GB/s "
                f"{contig * 1e3:8.2f} ms {BYTES / contig / 1e9:5.2f}GB/s {sg / contig:9.3f}x"
            )
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"objects": OBJECTS, "part_bytes": PART, "rounds": rounds,
                       "results": results}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
