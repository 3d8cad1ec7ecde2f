"""What authentication costs a control call: the same calls against a master with `--auth on`
and one with `--auth off`, side by side in one run, plus the token code on its own.

    python scripts/bench_auth.py [--calls 3000] [--rounds 5] [--json bench-results/auth.json]

Prints a table (median microseconds per call over the rounds, rounds alternating between the
two masters) and writes JSON.  Nothing here is asserted: numbers vary with the machine.
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

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.client.framed_channel import (
    BlockingFramedChannel,
    FramedEndpoint,
)
from mooncake_store.client.sync_client import Client
from mooncake_store.cluster import LocalCluster
from mooncake_store.common.auth import (
    RequestVerifier,
    Role,
    TokenAuthority,
    bearer,
    sign_request,
)
from mooncake_store.common.credentials import discover_token
from mooncake_store.master.access import AccessControl


def per_call_us(fn: Callable[[], object], calls: int, repeats: int = 1) -> float:
    """Microseconds per call: the best of `repeats` timed runs of `calls` calls."""
    fn()  # warm
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return best * 1e6


def token_code(calls: int) -> dict[str, float]:
    """The token functions alone (no network)."""
    authority = TokenAuthority(b"k" * 32)
    access = AccessControl(authority)
    token = authority.issue(Role.CLIENT, "team-a", ttl_s=3600)
    metadata = (("authorization", f"Bearer {bearer(token)}"),)
    fresh = [authority.issue(Role.CLIENT, "team-a", ttl_s=3600) for _ in range(calls)]
    it = iter(fresh)
    body = pb.ReleaseRequest(segment_id=1, offsets=list(range(16))).SerializeToString()
    key = b"c" * 32
    verifier = RequestVerifier(key)
    return {
        "verify a new token (first call of a connection)": per_call_us(
            lambda: authority.verify(next(it)), (calls - 1) // 5, 5
        ),
        "verify a known token (gRPC: every call)": per_call_us(
            lambda: access.from_metadata(metadata), calls, 5
        ),
        "sign + verify a node control request": per_call_us(
            lambda: verifier.verify(
                "Release", body, sign_request(key, "Release", body, time.time())
            ),
            calls,
            5,
        ),
    }


def measure(cluster: LocalCluster, calls: int) -> dict[str, float]:
    master = cluster.master_address
    token = discover_token(master, Role.CLIENT)  # "" when the master runs --auth off
    metadata = [("authorization", f"Bearer {bearer(token)}")] if token else None
    out: dict[str, float] = {}
    with Client(master) as client:
        client.put("bench-auth", b"x" * 4096)
        out["framed exists (sync Client)"] = per_call_us(lambda: client.exists("bench-auth"), calls)
        out["framed get 4 KiB (sync Client)"] = per_call_us(lambda: client.get("bench-auth"), calls)
    with grpc.insecure_channel(master) as channel:
        stub = pb_grpc.MasterServiceStub(channel)
        request = pb.KeyRequest(key="bench-auth")
        out["gRPC Exists"] = per_call_us(
            lambda: stub.Exists(request, timeout=5, metadata=metadata), calls // 3
        )
        hello = stub.Hello(pb.HelloRequest(), timeout=5, metadata=metadata)
    endpoint = FramedEndpoint("127.0.0.1", hello.framed_port)

    def connect() -> None:
        channel = BlockingFramedChannel.connect(
            endpoint, timeout_s=5, max_frame_bytes=1 << 20, token=bearer(token) if token else ""
        )
        channel.call("BatchExists", pb.KeysRequest(keys=["bench-auth"]))
        channel.close()

    out["new framed TCP connection + 1 call"] = per_call_us(connect, calls // 10)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="bench-results/auth.json")
    args = parser.parse_args()
    results: dict[str, dict[str, list[float]]] = {"on": {}, "off": {}}
    with tempfile.TemporaryDirectory() as tmp:
        on = LocalCluster(Path(tmp) / "on", nodes=1, dram="64MiB")
        off = LocalCluster(Path(tmp) / "off", nodes=1, dram="64MiB", master_args=["--auth", "off"])
        with on, off:
            for n in range(args.rounds):  # alternate which master goes first
                pair = [("on", on), ("off", off)]
                for mode, cluster in pair if n % 2 == 0 else pair[::-1]:
                    for name, value in measure(cluster, args.calls).items():
                        results[mode].setdefault(name, []).append(value)
    code = token_code(args.calls)
    rows = []
    print(f"{'us per call (best round; median)':44} {'auth on':>15} {'auth off':>15} {'cost':>8}")
    for name in results["on"]:
        a, b = min(results["on"][name]), min(results["off"][name])
        ma, mb = statistics.median(results["on"][name]), statistics.median(results["off"][name])
        rows.append({"call": name, "auth_on_us": a, "auth_off_us": b, "cost_us": a - b,
                     "auth_on_median_us": ma, "auth_off_median_us": mb})  # fmt: skip
        print(f"{name:44} {a:6.1f} ({ma:6.1f}) {b:6.1f} ({mb:6.1f}) {a - b:+8.1f}")
    print()
    for name, value in code.items():
        print(f"{name:56} {value:8.2f} us")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"calls": rows, "token_code_us": code, "rounds": args.rounds,
                               "calls_per_round": args.calls}, indent=1))  # fmt: skip
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
