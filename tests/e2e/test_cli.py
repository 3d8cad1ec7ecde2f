"""The console scripts: start, answer health checks, stop cleanly on SIGTERM, reject bad flags."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from mooncake_store import Client
from tests.conftest import wait_until

BIN = Path(sys.executable).parent


def script(name: str) -> str:
    path = BIN / name
    if not path.exists():
        pytest.fail(f"{name} is not installed next to {sys.executable}: run `make test`")
    return str(path)


def start(
    args: list[str], pattern: str, log: Path, cwd: Path | None = None
) -> tuple[subprocess.Popen, re.Match]:
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True, cwd=cwd
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(pattern, line)
    if not match:
        proc.kill()
        pytest.fail(f"unexpected start-up line {line!r}; log: {log.read_text()[-2000:]}")
    return proc, match


def health(address: str, service: str = "") -> str:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
        return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def test_daemons_start_serve_and_stop_on_sigterm(tmp_path):
    master, m = start(
        [script("mooncake-master"), "--port", "0", "--data-dir", str(tmp_path / "data")],
        r"listening on 127\.0\.0\.1:(\d+)",
        tmp_path / "master.log",
    )
    address = f"127.0.0.1:{m.group(1)}"
    node = None
    try:
        assert health(address) == "SERVING"
        assert health(address, "mooncake_store.v1.MasterService") == "SERVING"
        env = {**os.environ, "MOONCAKE_NODE_DRAM": "8MiB"}  # env config is honoured
        node = subprocess.Popen(
            [script("mooncake-store"), "--master", address, "--node-id", "cli-node"],
            stdout=subprocess.PIPE,
            stderr=open(tmp_path / "node.log", "wb"),
            text=True,
            env=env,
        )
        line = node.stdout.readline()
        n = re.search(
            r"node cli-node serving 8\.0 MiB DRAM: data \S+, control 127\.0\.0\.1:(\d+)", line
        )
        assert n, line
        wait_until(
            lambda: health(f"127.0.0.1:{n.group(1)}") == "SERVING",
            what="the node to report SERVING once mounted",
        )
        with Client(address) as store:
            store.put("cli", b"works")
            assert store.get("cli") == b"works"
            assert [x.node_id for x in store.list_nodes()] == ["cli-node"]
            node.send_signal(signal.SIGTERM)
            assert node.wait(15) == 0
            assert store.list_nodes() == []  # it unmounted on the way out
        master.send_signal(signal.SIGTERM)
        assert master.wait(15) == 0
        assert "shutting down" in (tmp_path / "master.log").read_text()
    finally:
        for proc in (master, node):
            if proc is not None and proc.poll() is None:
                proc.kill()


def test_master_uses_a_local_data_dir_by_default(tmp_path):
    master, _ = start(
        [script("mooncake-master"), "--port", "0"],
        r"listening on .* \(data in mooncake-data/master\)",
        tmp_path / "m.log",
        cwd=tmp_path,
    )
    master.send_signal(signal.SIGTERM)
    assert master.wait(15) == 0
    assert (tmp_path / "mooncake-data" / "master" / "rocksdb").is_dir()


@pytest.mark.parametrize(
    "args,message",
    [
        (["mooncake-store", "--dram", "12XB"], "like 512MiB"),
        (["mooncake-store", "--dram", "10"], "at least 1MiB"),
        (["mooncake-master", "--heartbeat-ttl", "1s", "--heartbeat-interval", "2s"], "must exceed"),
        (["mooncake-master", "--port", "70000"], "0-65535"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, message, tmp_path):
    result = subprocess.run(
        [script(args[0]), *args[1:]], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert result.returncode == 2
    assert message in result.stderr


def test_help_lists_main_flags():
    out = subprocess.run([script("mooncake-master"), "--help"], capture_output=True, text=True)
    assert "--data-dir" in out.stdout and "--port" in out.stdout
    out = subprocess.run([script("mooncake-store"), "--help"], capture_output=True, text=True)
    assert "--dram" in out.stdout and "--master" in out.stdout


def test_cluster_demo_runs_and_exits(tmp_path):
    result = subprocess.run(
        [
            script("mooncake-cluster"),
            "--data-dir",
            str(tmp_path / "c"),
            "--dram",
            "64MiB",
            "--exit",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "prefix hits: 12/34 blocks" in result.stdout
    assert "cluster stopped" in result.stdout


def test_kv_engine_example_reuses_shared_prefixes(tmp_path):
    # 40 requests of three 512-token blocks: the first two shared by all, the third unique.
    trace = tmp_path / "trace.jsonl"
    lines = [
        json.dumps({"timestamp": i, "input_length": 1536, "output_length": 1,
                    "hash_ids": [0, 1, i + 2]})
        for i in range(40)
    ]  # fmt: skip
    trace.write_text("\n".join(lines))
    out = tmp_path / "summary.json"
    script = Path(__file__).resolve().parents[2] / "scripts" / "kv_engine_example.py"
    result = subprocess.run(
        [sys.executable, str(script), str(trace), "--requests", "40", "--dram", "64MiB",
         "--hasher", "vllm-sha256-cbor", "--json", str(out)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "every hit verified byte for byte" in result.stdout
    summary = json.loads(out.read_text())
    assert summary["requests"] == 40 and summary["blocks"] == 120
    assert summary["hit_blocks"] == summary["verified_blocks"] == 39 * 2
    assert summary["written_blocks"] == 42


def test_replay_trace_weighted_beats_lru_through_the_store(tmp_path):
    # A hot 10-block prefix asked for every third request, between scans of unique blocks that
    # alone overflow the cache: LRU keeps flushing the prefix, recency + frequency keeps it.
    lines, next_id = [], 100
    for i in range(60):
        if i % 3 == 0:
            ids = list(range(10))
        else:
            ids, next_id = list(range(next_id, next_id + 20)), next_id + 20
        lines.append(json.dumps({"timestamp": i, "input_length": 512 * len(ids),
                                 "output_length": 1, "hash_ids": ids}))  # fmt: skip
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines))
    script = Path(__file__).resolve().parents[2] / "scripts" / "replay_trace.py"
    results = {}
    for policy in ("weighted", "lru"):
        out = tmp_path / f"{policy}.json"
        proc = subprocess.run(
            [sys.executable, str(script), str(trace), "--capacity-blocks", "30",
             "--policy", policy, "--block-bytes", "65536", "--json", str(out)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        results[policy] = json.loads(out.read_text())
    for run in results.values():
        assert run["requests"] == 60 and run["capacity_blocks"] == 30
        assert run["wrong_bytes"] == 0 and run["put_failures"] == 0
        assert {"hit_rate", "lru_hit_rate", "belady_hit_rate"} <= set(run)
    weighted, lru = results["weighted"], results["lru"]
    assert lru["hit_rate"] == pytest.approx(lru["lru_hit_rate"])  # the store's LRU = simulated LRU
    assert weighted["hit_rate"] > 1.5 * lru["hit_rate"]
    assert weighted["hit_rate"] == pytest.approx(weighted["weighted_sim_hit_rate"], abs=0.02)


def test_chaos_harness_reports_no_wrong_or_lost_blocks(tmp_path):
    out = tmp_path / "chaos.json"
    script = Path(__file__).resolve().parents[2] / "scripts" / "chaos.py"
    result = subprocess.run(
        [sys.executable, str(script), "--duration", "10", "--nodes", "3", "--clients", "2",
         "--fault-interval", "1.5", "--max-puts", "300", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["acked_blocks"] > 0 and report["reads"] >= report["acked_blocks"]
    assert report["wrong_bytes"] == 0 and report["lost_acked_blocks"] == 0
    assert sum(report["faults_injected"].values()) >= 2 and report["settled"]
    assert {"errors", "faults_injected", "acked_blocks"} <= set(report)
