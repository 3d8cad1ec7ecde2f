#!/usr/bin/env python3
"""Chaos harness: a real cluster under load while processes and connections are killed.

Starts a master and N store nodes as processes on 127.0.0.1 and drives a mixed put/get load
from several client processes.  Every block's content is derived from its key, so any read can
be checked; a client records a key only after its put was acknowledged.  Meanwhile faults are
injected on a schedule: kill -9 of a node (restarted later under the same id, its DRAM gone),
SIGSTOP of a node for longer than the heartbeat TTL (alive but silent), kill -9 and restart of
the master, and TCP connections to a node's data port dropped mid-transfer (`ss -K`).

The promise checked: a committed block with a surviving replica is never lost and a wrong byte
is never returned.  So that every acknowledged block has a surviving replica, puts ask for two
replicas and a node fault is only injected once the cluster has repaired the previous one (no
block below its replica count).  At the end the faults stop, the cluster settles, and every
acknowledged block is read back and compared.

    python scripts/chaos.py --duration 180 [--nodes 4] [--clients 3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mooncake_store import Client, Retry  # noqa: E402
from mooncake_store.cluster import LocalCluster  # noqa: E402

MASTER_ARGS = [
    "--heartbeat-interval", "200ms", "--heartbeat-ttl", "1500ms", "--put-timeout", "5s",
    "--hot-reads", "0", "--max-copies-per-tick", "512",
]  # fmt: skip


def content(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def size_of(key: str) -> int:
    return 4096 * (1 + int(hashlib.sha256(key.encode()).digest()[0]) % 32)  # 4-128 KiB


# ---- client processes ---------------------------------------------------------------------


def client_main(index: int, master: str, deadline: float, max_puts: int, out: str) -> None:
    rng = random.Random(index)
    acked: list[str] = []
    errors: Counter[str] = Counter()
    reads = wrong = 0
    patient = Retry(attempts=30, backoff_s=0.05, max_backoff_s=0.5)
    started = time.time()
    pace = max_puts / max(deadline - started, 1.0)  # puts per second, spread over the run
    with Client(master, replicas=2, retry=patient, timeout_s=3) as store:
        puts = 0
        while time.time() < deadline:
            due = puts < max_puts and puts < (time.time() - started) * pace + 1
            if due and (not acked or rng.random() < 0.5):
                key = f"c{index}/{puts}"
                puts += 1
                try:
                    store.put(key, content(key, size_of(key)))
                    acked.append(key)
                except Exception as exc:  # counted by type; not acknowledged
                    errors[f"put:{type(exc).__name__}"] += 1
            elif acked:
                key = rng.choice(acked)
                try:
                    data = store.get(key)
                    reads += 1
                    if data != content(key, size_of(key)):
                        wrong += sum(a != b for a, b in zip(data, content(key, len(data)),
                                                            strict=False)) or 1  # fmt: skip
                except Exception as exc:  # errors are allowed, wrong bytes are not
                    errors[f"get:{type(exc).__name__}"] += 1
            else:
                time.sleep(0.05)
    Path(out).write_text(json.dumps({"acked": acked, "reads": reads, "wrong_bytes": wrong,
                                     "errors": dict(errors)}))  # fmt: skip


# ---- faults ---------------------------------------------------------------------------------


class Chaos:
    def __init__(self, cluster: LocalCluster, rng: random.Random, interval_s: float) -> None:
        self.cluster = cluster
        self.rng = rng
        self.interval_s = interval_s
        self.faults: Counter[str] = Counter()
        self.stop = threading.Event()
        self.can_drop = shutil.which("ss") is not None
        self.log: list[str] = []

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(self.log[-1], flush=True)

    def healthy(self) -> bool:
        """Every node mounted and no block below its replica count."""
        try:
            with Client(self.cluster.master_address, timeout_s=2,
                        retry=Retry(attempts=2)) as store:  # fmt: skip
                nodes = {n.node_id for n in store.list_nodes()}
                return (len(nodes) == len(self.cluster.nodes)
                        and store.stats().counters.get("under_replicated", 1) == 0)  # fmt: skip
        except Exception:  # the master may be restarting
            return False

    def wait_healthy(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and not self.stop.is_set():
            if self.healthy():
                return True
            time.sleep(0.2)
        return self.healthy()

    def run(self) -> None:
        kinds = ["kill_node", "stop_node", "kill_master", "drop_connections"]
        if not self.can_drop:
            kinds.remove("drop_connections")
        order: list[str] = []
        while not self.stop.wait(self.interval_s):
            if not self.wait_healthy(30):
                self.note("cluster not healthy yet; holding faults")
                continue
            if not order:  # every kind once per round, in a random order
                order = self.rng.sample(kinds, len(kinds))
            kind = order.pop()
            getattr(self, kind)()
            self.faults[kind] += 1

    def kill_node(self) -> None:
        i = self.rng.randrange(len(self.cluster.nodes))
        self.note(f"kill -9 node-{i}")
        self.cluster.nodes[i].signal(signal.SIGKILL)
        self.cluster.nodes[i].proc.wait()
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.cluster.restart_node(i)
        self.note(f"node-{i} restarted")

    def stop_node(self) -> None:
        i = self.rng.randrange(len(self.cluster.nodes))
        self.note(f"SIGSTOP node-{i}")
        self.cluster.nodes[i].signal(signal.SIGSTOP)
        time.sleep(self.rng.uniform(2.0, 4.0))  # longer than the 1.5 s heartbeat TTL
        self.cluster.nodes[i].signal(signal.SIGCONT)
        self.note(f"SIGCONT node-{i}")

    def kill_master(self) -> None:
        self.note("kill -9 master")
        self.cluster.master.signal(signal.SIGKILL)  # type: ignore[union-attr]
        self.cluster.master.proc.wait()  # type: ignore[union-attr]
        time.sleep(self.rng.uniform(0.3, 2.0))
        self.cluster.start_master()
        self.note("master restarted")

    def drop_connections(self) -> None:
        i = self.rng.randrange(len(self.cluster.nodes))
        port = self.cluster.node_endpoint(i).rpartition(":")[2]
        self.note(f"dropping TCP connections to node-{i} data port {port}")
        for _ in range(5):
            subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", port],
                           capture_output=True, check=False)  # fmt: skip
            time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of load")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--fault-interval", type=float, default=3.0)
    parser.add_argument("--max-puts", type=int, default=4000, help="per client (bounds data)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be >= 2: blocks are written with two replicas")
    if args.duration <= 0 or args.duration > 3600:
        parser.error("--duration must be in (0, 3600] seconds")

    report: dict = {}
    with tempfile.TemporaryDirectory(prefix="mooncake-chaos-") as tmp:
        # Pools large enough that nothing is evicted: a lost block would then be a real loss.
        with LocalCluster(tmp, nodes=args.nodes, dram="512MiB",
                          master_args=MASTER_ARGS) as cluster:  # fmt: skip
            chaos = Chaos(cluster, random.Random(args.seed), args.fault_interval)
            deadline = time.time() + args.duration
            ctx = mp.get_context("spawn")
            outs = [f"{tmp}/client-{i}.json" for i in range(args.clients)]
            procs = [ctx.Process(target=client_main,
                                 args=(i, cluster.master_address, deadline, args.max_puts, o))
                     for i, o in enumerate(outs)]  # fmt: skip
            for p in procs:
                p.start()
            injector = threading.Thread(target=chaos.run)
            injector.start()
            for p in procs:
                p.join(args.duration + 120)
            chaos.stop.set()
            injector.join(120)
            chaos.stop.clear()
            for node in cluster.nodes:  # bring everything back
                node.signal(signal.SIGCONT)
            settled = chaos.wait_healthy(60)
            results = [json.loads(Path(o).read_text()) for o in outs if Path(o).exists()]
            acked = [k for r in results for k in r["acked"]]
            lost, wrong, unreadable_errors = [], 0, Counter()
            with Client(cluster.master_address, timeout_s=5,
                        retry=Retry(attempts=20, backoff_s=0.1)) as store:  # fmt: skip
                for key in acked:
                    try:
                        data = store.get(key)
                    except Exception as exc:  # reported by type
                        lost.append(key)
                        unreadable_errors[type(exc).__name__] += 1
                        continue
                    if data != content(key, size_of(key)):
                        wrong += 1
                counters = store.stats().counters
            errors: Counter[str] = Counter()
            for r in results:
                errors.update(r["errors"])
            report = {
                "duration_s": args.duration, "nodes": args.nodes, "clients": args.clients,
                "acked_blocks": len(acked),
                "reads": sum(r["reads"] for r in results) + len(acked),
                "wrong_bytes": sum(r["wrong_bytes"] for r in results) + wrong,
                "lost_acked_blocks": len(lost),
                "lost_examples": lost[:10],
                "unreadable_errors": dict(unreadable_errors),
                "faults_injected": dict(chaos.faults),
                "errors": dict(errors),
                "settled": settled,
                "evictions": counters.get("evictions", 0),
                "repairs": counters.get("repairs", 0),
                "fault_log": chaos.log,
            }  # fmt: skip
    summary = {k: v for k, v in report.items() if k != "fault_log"}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    if report["wrong_bytes"] or report["lost_acked_blocks"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
