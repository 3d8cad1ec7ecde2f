#!/usr/bin/env python3
"""Chaos harness: a real cluster under load while processes, connections and clocks misbehave.

Starts a master and N store nodes as processes on 127.0.0.1 and drives a mixed put/get load
from several client processes.  Every block's content is derived from its key, so any read can
be checked; a client records a key only after its put was acknowledged.  Meanwhile faults are
injected, every kind once per round in a random order:

- kill_node: kill -9 of a node, restarted later under the same id (its DRAM gone);
- stop_node_in_grace: SIGSTOP of a node past its heartbeat TTL but inside the suspect grace
  window (it is suspect, then offered again with its replicas);
- stop_node_past_grace: SIGSTOP past TTL + grace (it is dropped; its blocks are repaired from
  their other replica);
- kill_master: kill -9 and restart of the master;
- drop_connections: TCP connections to a node's data port dropped mid-transfer (`ss -K`);
- master_stall: a heavy, legal read-only load (threads sending 20k-key lookups back to back);
- clock_forward / clock_backward: the master's wall clock stepped +11..30 s / -60 s and back
  (an NTP step), with libfaketime (Debian `faketime`; `scripts/install-deps.sh` installs it;
  without it these two are skipped and listed under `faults_skipped`);
- duplicate_node_id: a second node process started under a live node's id (must be refused).

With `--nvme`, each node also has an NVMe tier the size of its DRAM pool, and blocks go down
to it past a fifth of the DRAM pool (and up again when read), so blocks move between tiers
while the faults happen; with `--removes R`, each client removes an
acknowledged block of its own after each put with probability R.  A put that fails saying it
"may or may not have taken effect" is put again once, as an engine would (`put_retries`: how
those ended; `ObjectBusyError` there would be a retry refused by its own lost put).

The promise checked: an acknowledged block is never lost and a wrong byte is never returned;
and an acknowledged remove holds: a block removed is never visible again (`removed_visible`;
through node restarts, drops and returns with their NVMe index, and master restarts).
Puts ask for two replicas and a fault is only injected once the cluster has repaired the
previous one, so every acknowledged block keeps a surviving replica.  "Repaired" includes the
puts acknowledged short: one under way while a node fails, or placed while nodes mount again
after a master restart, is acknowledged with the replicas it has and only then counts as
under-replicated.  So a fault that may drop a node first waits out `--put-timeout` (a later
PutEnd is refused) from when every node was writable again after the last fault that can
shorten a put, and its health check must begin after the last short acknowledgement a client
logged.  Each client records the replica count its acknowledgements reported (`acked_short`:
fewer than asked; `lost_acked_short`: lost blocks among them).  The node pools are sized
from the workload and the node count so that nothing needs evicting even with a node down;
evictions (the master's counter, summed over its restarts) are reported apart from losses, and a
run with evictions says that an unreadable block may have been evicted rather than lost (it is
still counted in `lost_acked_blocks`: a loss is never hidden).  At the end the faults stop, the
cluster settles (every node mounted, nothing under-replicated), and every acknowledged block is
read back and compared.

    python scripts/chaos.py --duration 300 --nodes 3 --json OUT.json
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import math
import multiprocessing as mp
import os
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
from mooncake_store.cluster import _MASTER_READY, DaemonProcess, LocalCluster  # noqa: E402
from mooncake_store.common.credentials import TOKEN_DIR_ENV  # noqa: E402
from mooncake_store.common.errors import MasterUnavailableError  # noqa: E402

HEARTBEAT_TTL_S = 1.5
SUSPECT_GRACE_S = 3.0
PUT_TIMEOUT_S = 5.0
MASTER_ARGS = [
    "--heartbeat-interval", "200ms", "--heartbeat-ttl", f"{HEARTBEAT_TTL_S}s",
    "--suspect-grace", f"{SUSPECT_GRACE_S}s", "--put-timeout", f"{PUT_TIMEOUT_S:g}s",
    "--hot-reads", "0",
    "--max-copies-per-tick", "512",
]  # fmt: skip
KINDS = [
    "kill_node", "stop_node_in_grace", "stop_node_past_grace", "kill_master",
    "drop_connections", "master_stall", "clock_forward", "clock_backward", "duplicate_node_id",
]  # fmt: skip
# Faults that drop a node's segments (a restart under a new incarnation, or a drop past the
# grace window) with the replicas on them, those of puts still in flight included; a stop meant
# to end inside the grace window may overrun it on a loaded machine.
DROPS_REPLICAS = {"kill_node", "stop_node_past_grace", "stop_node_in_grace"}
# Faults during which a put can be acknowledged with fewer replicas than it asked for (a
# replica's node lost, unreachable or not writable yet): it is repaired from the one it has.
SHORTENS_PUTS = DROPS_REPLICAS | {"kill_master", "drop_connections"}
MIN_BLOCK, MAX_BLOCK = 4096, 4096 * 32
MEAN_BLOCK = (MIN_BLOCK + MAX_BLOCK) / 2
REPLICAS = 2
# A Python `time.sleep` under libfaketime with an unfaked monotonic clock fails (EINVAL from
# clock_nanosleep): the master under test sleeps through select() instead.
SLEEP_SHIM = (
    "import runpy, select, sys, time\n"
    "time.sleep = lambda s: select.select([], [], [], max(0.0, s))\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)\n"
)


def content(key: str, size: int) -> bytes:
    seed = hashlib.sha256(key.encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def size_of(key: str) -> int:
    return MIN_BLOCK * (1 + int(hashlib.sha256(key.encode()).digest()[0]) % 32)  # 4-128 KiB


def pool_bytes(clients: int, max_puts: int, nodes: int) -> int:
    """A node pool that holds its share of every block even with one node down, with room to
    spare (alignment, puts in flight, copies in flight): nothing needs evicting."""
    data = clients * max_puts * MEAN_BLOCK
    survivors = nodes - 1
    per_node = data * min(REPLICAS, survivors) / survivors
    mib = 1 << 20
    return max(64 * mib, math.ceil((per_node * 1.5 + 32 * mib) / mib) * mib)


def find_libfaketime() -> str | None:
    for pattern in ("/usr/lib/*/faketime/libfaketime.so.1", "/usr/lib/faketime/libfaketime.so.1",
                    "/usr/local/lib/faketime/libfaketime.so.1"):  # fmt: skip
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def private_token_dir(root: str) -> Path:
    """Keep the run's local token file (`master-<port>.json`) under `root`, not in the shared
    `~/.config/mooncake/`: the master, nodes and clients started from here inherit the setting.
    In the shared directory another process deleted every file mid-run (a chaos run then saw
    each new client and each restarted node refused for want of a token)."""
    directory = Path(root) / "tokens"
    os.environ[TOKEN_DIR_ENV] = str(directory)
    return directory


# ---- client processes ---------------------------------------------------------------------


def client_main(
    index: int, master: str, deadline: float, max_puts: int, out: str, remove_rate: float = 0.0
) -> None:
    rng = random.Random(index)
    acked: list[str] = []
    removed: list[str] = []  # acknowledged removes (none of these may be visible again)
    remove_unknown: list[str] = []  # a remove that failed: it may or may not have happened
    acked_at: list[float] = []  # wall clock of each acknowledgement (to place a loss in time)
    failed: dict[str, str] = {}  # key -> error class of a put that reported failure
    why: dict[str, str] = {}  # key -> when and what that error said
    errors: Counter[str] = Counter()
    retries: Counter[str] = Counter()  # outcomes of putting a key again after "may or may not"
    reads = wrong = 0
    patient = Retry(attempts=30, backoff_s=0.05, max_backoff_s=0.5)
    short: dict[str, int] = {}  # key -> replicas of an acknowledgement that had fewer than asked
    unknown: list[str] = []  # acknowledged as stored already (a retry): replica count unknown
    started = time.time()
    pace = max_puts / max(deadline - started, 1.0)  # puts per second, spread over the run
    # Client 0 moves its bytes over TCP (a client on another host: grants are checked by the
    # nodes), the others through the nodes' shared memory.  `short_log`: the time of each
    # short acknowledgement, as it happens, read by the fault injector (a block acknowledged
    # short is under-replicated until repaired).
    store = connect(master, deadline, retry=patient, local_shm=index != 0)
    with contextlib.closing(store), open(out + ".short", "a") as short_log:
        puts = 0
        while time.time() < deadline:
            due = puts < max_puts and puts < (time.time() - started) * pace + 1
            if due and (not acked or rng.random() < 0.5):
                key = f"c{index}/{puts}"
                puts += 1
                try:
                    try:
                        result = store.put(key, content(key, size_of(key)))
                    except Exception as exc:
                        if type(exc).__name__ not in OUTCOME_UNKNOWN:
                            raise
                        # It may or may not have happened: an engine puts the block again.
                        # That retry must not find its own lost put busy (put_attempts.py).
                        errors[f"put:{type(exc).__name__}"] += 1
                        try:
                            result = store.put(key, content(key, size_of(key)))
                        except Exception as again:
                            retries[type(again).__name__] += 1
                            raise
                        retries["ok"] += 1
                    if result.deduplicated or result.replicas < REPLICAS:
                        if result.deduplicated:
                            unknown.append(key)
                        else:
                            short[key] = result.replicas
                        short_log.write(f"{time.time()}\n")
                        short_log.flush()
                    acked.append(key)
                    acked_at.append(time.time())
                except Exception as exc:  # counted by type; not acknowledged
                    errors[f"put:{type(exc).__name__}"] += 1
                    failed[key] = type(exc).__name__
                    why[key] = f"{time.strftime('%H:%M:%S')} {str(exc)[:200]}"
                if acked and rng.random() < remove_rate:  # an acknowledged block, removed
                    i = rng.randrange(len(acked))
                    key = acked[i]
                    try:  # a block lost already is a loss, not a remove (remove() says False)
                        present = store.exists(key)
                    except Exception:  # the master may be restarting: not known
                        present = True
                    if not present:
                        continue  # left in `acked`: the final check counts it as lost
                    acked[i], acked_at[i] = acked[-1], acked_at[-1]  # not checked as stored
                    acked.pop()
                    acked_at.pop()
                    try:
                        (removed if store.remove(key) else remove_unknown).append(key)
                    except Exception as exc:
                        errors[f"remove:{type(exc).__name__}"] += 1
                        remove_unknown.append(key)
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
    Path(out).write_text(json.dumps({"acked": acked, "acked_at": acked_at, "reads": reads,
                                     "wrong_bytes": wrong, "errors": dict(errors),
                                     "failed": failed, "why": why, "removed": removed,
                                     "remove_unknown": remove_unknown, "short": short,
                                     "replicas_unknown": unknown,
                                     "put_retries": dict(retries)}))  # fmt: skip


def connect(master: str, deadline: float, **options: object) -> Client:
    """A client connected as an engine connects at its start: a master that is restarting
    (the first fault may come before every client is up) is waited for, until `deadline`."""
    while True:
        store = Client(master, replicas=REPLICAS, timeout_s=3, **options)  # type: ignore[arg-type]
        try:
            return store.connect()
        except MasterUnavailableError:
            store.close()
            if time.time() >= deadline:
                raise
            time.sleep(0.2)


# A put that failed with one of these may or may not have taken effect (the error says so);
# any other failure is definite, and its key must not become visible.
OUTCOME_UNKNOWN = {"MasterTimeoutError", "MasterUnavailableError", "RpcError"}


def failed_puts_check(
    store: Client,
    failed: dict[str, str],
    examples: list[str] | None = None,
    why: dict[str, str] | None = None,
) -> tuple[Counter[str], int]:
    """Look up every key whose put reported failure: (visible ones by error class, wrong
    bytes among them).  A definite failure that is visible is a misreported outcome; the
    first few are added to `examples` as "key (error class)"."""
    visible: Counter[str] = Counter()
    wrong = 0
    keys = list(failed)
    for start in range(0, len(keys), 1000):
        batch = keys[start : start + 1000]
        for key, there in zip(batch, store.exists_many(batch), strict=True):
            if not there:
                continue
            visible[failed[key]] += 1
            if examples is not None and failed[key] not in OUTCOME_UNKNOWN and len(examples) < 10:
                said = (why or {}).get(key, "")
                examples.append(f"{key} ({failed[key]}: {said})")
            try:
                data = store.get(key)
            except Exception:  # visible but unreadable: counted as visible
                continue
            if data != content(key, size_of(key)):
                wrong += 1
    return visible, wrong


def loss_windows(lost: list[tuple[str, float]], gap_s: float = 5.0) -> list[dict[str, object]]:
    """Group lost blocks by client (the key's `c<i>/` prefix) and by when their puts were
    acknowledged: one window per run of acknowledgements less than `gap_s` apart, with its
    first and last time (HH:MM:SS, as in the fault log) and its count, to set beside the
    faults injected then."""
    by_client: dict[str, list[float]] = {}
    for key, at in lost:
        by_client.setdefault(key.partition("/")[0], []).append(at)
    windows: list[dict[str, object]] = []
    for client, times in sorted(by_client.items()):
        times.sort()
        start = prev = times[0]
        count = 0
        for at in [*times, math.inf]:
            if at - prev > gap_s:
                first, last = (time.strftime("%H:%M:%S", time.localtime(t)) for t in (start, prev))
                windows.append({"client": client, "count": count, "first": first, "last": last})
                start, count = at, 0
            prev = at
            count += 1
    return windows


# ---- the cluster -----------------------------------------------------------------------------


class ChaosCluster(LocalCluster):
    """A LocalCluster whose master runs under libfaketime (when given), so that its wall clock
    can be stepped by writing `offset_file`; its monotonic clock is left alone."""

    def __init__(self, root: str, *, libfaketime: str | None, **kwargs: object) -> None:
        super().__init__(root, **kwargs)  # type: ignore[arg-type]
        self.libfaketime = libfaketime
        self.offset_file = Path(root) / "clock-offset"
        self.offset_file.write_text("+0\n")

    def start_master(self) -> DaemonProcess:
        if self.libfaketime is None:
            return super().start_master()
        args = [sys.executable, "-c", SLEEP_SHIM, "mooncake_store.master", "--host", "127.0.0.1",
                "--port", str(self.master_port), "--data-dir", str(self.data_dir),
                *self.master_args]  # fmt: skip
        env = {**os.environ, "LD_PRELOAD": self.libfaketime,
               "FAKETIME_TIMESTAMP_FILE": str(self.offset_file),
               "FAKETIME_DONT_FAKE_MONOTONIC": "1", "FAKETIME_NO_CACHE": "1"}  # fmt: skip
        self.master = DaemonProcess(
            args, self.log_dir / "master.log", _MASTER_READY, self.timeout_s, env=env
        )
        self.master_port = int(self.master.match.group(2))
        return self.master

    def step_clock(self, offset_s: float) -> None:
        """Step the master's wall clock to `offset_s` from real time (read on every call: with
        libfaketime's cache, a backward step would go unread until the fake clock caught up)."""
        staged = self.offset_file.with_suffix(".new")
        staged.write_text(f"{offset_s:+.0f}\n")
        os.replace(staged, self.offset_file)


# ---- faults ---------------------------------------------------------------------------------


class Chaos:
    def __init__(
        self, cluster: ChaosCluster, rng: random.Random, interval_s: float, kinds: list[str]
    ) -> None:
        self.cluster = cluster
        self.rng = rng
        self.interval_s = interval_s
        self.faults: Counter[str] = Counter()
        self.skipped: dict[str, str] = {}
        self.stop = threading.Event()
        self.log: list[str] = []
        # The master's counters summed over its lifetimes (they restart with it): evictions tell
        # eviction from loss; objects_corrupt, puts_revoked, replicas_dropped help explain one.
        self.totals: Counter[str] = Counter()
        self._counters_now: dict[str, int] = {}
        self.duplicates_refused = self.duplicates_accepted = 0
        self.kinds = list(kinds)
        self.short_logs: list[str] = []  # the clients' logs of short acknowledgements
        if "drop_connections" in self.kinds and shutil.which("ss") is None:
            self._skip("drop_connections", "`ss` (iproute2) is not installed")
        if cluster.libfaketime is None:
            for kind in ("clock_forward", "clock_backward"):
                self._skip(kind, "libfaketime is not installed (scripts/install-deps.sh)")

    def _skip(self, kind: str, why: str) -> None:
        if kind in self.kinds:
            self.kinds.remove(kind)
            self.skipped[kind] = why

    def note(self, text: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(self.log[-1], flush=True)

    def client(self, timeout_s: float = 2.0) -> Client:
        return Client(self.cluster.master_address, timeout_s=timeout_s, retry=Retry(attempts=2))

    def sample(self) -> dict[str, int] | None:
        """The master's counters now (and its eviction count, kept for the report)."""
        try:
            with self.client() as store:
                counters = store.stats().counters
        except Exception:  # the master may be restarting
            return None
        self._counters_now = dict(counters)
        return counters

    def healthy(self) -> bool:
        """Every node mounted and writable (not suspect, not mounting) and no block below its
        replica count."""
        try:
            with self.client() as store:
                rows = store.list_nodes()
                counters = store.stats().counters
        except Exception:  # the master may be restarting
            return False
        self._counters_now = dict(counters)
        nodes = {n.node_id for n in rows}
        return (
            len(nodes) == len(self.cluster.nodes)
            and all(n.state == "valid" for n in rows)
            and counters.get("under_replicated", 1) == 0
        )

    def last_short_ack(self) -> float:
        """When a client last had a put acknowledged short of replicas (or with an unknown
        count), from the clients' `.short` logs; -inf if never."""
        last = -math.inf
        for path in self.short_logs:
            with contextlib.suppress(OSError, ValueError):
                lines = Path(path).read_text().split()
                if lines:
                    last = max(last, float(lines[-1]))
        return last

    def wait_healthy(self, timeout_s: float, *, after_short_acks: bool = False) -> bool:
        """Wait until `healthy`; `after_short_acks`: as seen by a check that began after the
        last short acknowledgement (whose block counted as under-replicated from its commit,
        before it was acknowledged)."""
        deadline = time.monotonic() + timeout_s
        while True:
            began = time.time()
            if self.healthy() and (not after_short_acks or self.last_short_ack() < began):
                return True
            if time.monotonic() >= deadline or self.stop.is_set():
                return False
            time.sleep(0.2)

    def run(self) -> None:
        order: list[str] = []
        shortened_at = -math.inf  # when the last fault that can shorten a put ended
        while self.kinds and not self.stop.wait(self.interval_s):
            if not order:  # every kind once per round, in a random order
                order = self.rng.sample(self.kinds, len(self.kinds))
            kind = order[-1]
            dropping = kind in DROPS_REPLICAS
            if dropping:
                # A put acknowledged short counts as under-replicated only once it is: every
                # put under way during the last such fault must have ended (been committed,
                # or refused past --put-timeout) before `healthy` can say that each block
                # has its replicas again, and a node may be lost.
                settle = shortened_at + PUT_TIMEOUT_S + 0.5 - time.monotonic()
                if settle > 0 and self.stop.wait(settle):
                    break
            if not self.wait_healthy(30, after_short_acks=dropping):
                self.note("cluster not healthy yet; holding faults")
                continue
            order.pop()
            getattr(self, kind)()
            self.faults[kind] += 1
            if kind in SHORTENS_PUTS:
                # Counted from when every node is writable again (after a master restart the
                # nodes mount again, and take their first fences, after it is up).
                self.wait_healthy(30)
                shortened_at = time.monotonic()

    def _node(self) -> int:
        return self.rng.randrange(len(self.cluster.nodes))

    def kill_node(self) -> None:
        i = self._node()
        self.note(f"kill -9 node-{i}")
        self.cluster.nodes[i].signal(signal.SIGKILL)
        self.cluster.nodes[i].proc.wait()
        time.sleep(self.rng.uniform(0.5, 3.0))
        self.cluster.restart_node(i)
        self.note(f"node-{i} restarted")

    def _stop_node(self, seconds: float) -> None:
        i = self._node()
        self.note(f"SIGSTOP node-{i} for {seconds:.1f}s")
        self.cluster.nodes[i].signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.cluster.nodes[i].signal(signal.SIGCONT)
        self.note(f"SIGCONT node-{i}")

    def stop_node_in_grace(self) -> None:
        self._stop_node(
            self.rng.uniform(HEARTBEAT_TTL_S + 0.7, HEARTBEAT_TTL_S + SUSPECT_GRACE_S - 1)
        )

    def stop_node_past_grace(self) -> None:
        self._stop_node(self.rng.uniform(HEARTBEAT_TTL_S + SUSPECT_GRACE_S + 1.5,
                                         HEARTBEAT_TTL_S + SUSPECT_GRACE_S + 3))  # fmt: skip

    def kill_master(self) -> None:
        self.sample()  # its eviction count dies with it: keep the last one seen
        self.totals.update(self._counters_now)
        self._counters_now = {}
        self.note("kill -9 master")
        self.cluster.master.signal(signal.SIGKILL)  # type: ignore[union-attr]
        self.cluster.master.proc.wait()  # type: ignore[union-attr]
        time.sleep(self.rng.uniform(0.3, 2.0))
        self.cluster.start_master()
        self.note("master restarted")

    def drop_connections(self) -> None:
        i = self._node()
        port = self.cluster.node_endpoint(i).rpartition(":")[2]
        self.note(f"dropping TCP connections to node-{i} data port {port}")
        for _ in range(5):
            subprocess.run(["ss", "-K", "dst", "127.0.0.1", "dport", "=", port],
                           capture_output=True, check=False)  # fmt: skip
            time.sleep(0.1)

    def master_stall(self, seconds: float = 6.0, threads: int = 2, batch: int = 20_000) -> None:
        """Lookups of large batches back to back: legal load that used to stall the master's
        loop long enough for every node to be declared dead."""
        self.note(f"lookup storm: {threads} threads x {batch}-key lookups for {seconds:.0f}s")
        until = time.monotonic() + seconds
        keys = [f"c{c}/{i}" for c in range(4) for i in range(batch // 4)]
        calls = Counter[str]()

        def storm() -> None:
            try:
                with Client(self.cluster.master_address, timeout_s=30,
                            retry=Retry(attempts=1)) as store:  # fmt: skip
                    while time.monotonic() < until:
                        store.exists_many(keys)
                        calls["ok"] += 1
            except Exception as exc:  # reported, not fatal: the cluster is what is checked
                calls[type(exc).__name__] += 1

        workers = [threading.Thread(target=storm) for _ in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(seconds + 60)
        self.note(f"lookup storm over: {dict(calls)}")

    def _step(self, offset_s: float) -> None:
        self.note(f"master wall clock stepped to {offset_s:+.0f}s")
        self.cluster.step_clock(offset_s)
        time.sleep(self.rng.uniform(3.0, 5.0))
        self.cluster.step_clock(0)
        self.note("master wall clock stepped back")

    def clock_forward(self) -> None:
        self._step(self.rng.uniform(11, 30))

    def clock_backward(self) -> None:
        self._step(-60)

    def duplicate_node_id(self) -> None:
        i = self._node()
        self.note(f"starting a second node under node-{i}'s id")
        args = [sys.executable, "-m", "mooncake_store.node", "--master",
                self.cluster.master_address, "--host", "127.0.0.1", "--dram", "16MiB",
                "--node-id", f"node-{i}"]  # fmt: skip
        log_path = self.cluster.log_dir / f"duplicate-{self.faults['duplicate_node_id']}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
            try:
                code = proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
        if code not in (None, 0):
            self.duplicates_refused += 1
            self.note(f"the duplicate of node-{i} was refused (exit {code})")
        else:
            self.duplicates_accepted += 1
            self.note(f"the duplicate of node-{i} was NOT refused (killed after 15 s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration", type=float, required=True, help="seconds of load")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--fault-interval", type=float, default=3.0)
    parser.add_argument("--max-puts", type=int, default=4000, help="per client (bounds data)")
    parser.add_argument("--faults", default=",".join(KINDS), help="kinds to inject (comma list)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--nvme", action="store_true",
                        help="give each node an NVMe tier (and half the DRAM): blocks move "
                             "between tiers under the faults")  # fmt: skip
    parser.add_argument(
        "--removes",
        type=float,
        default=0.0,
        help="fraction of client steps that remove an acknowledged block",
    )
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--keep", help="run in this directory and keep it (logs, RocksDB)")
    args = parser.parse_args()
    if args.nodes < 2:
        parser.error("--nodes must be >= 2: blocks are written with two replicas")
    if args.duration <= 0 or args.duration > 3600:
        parser.error("--duration must be in (0, 3600] seconds")
    kinds = [k for k in args.faults.split(",") if k]
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        parser.error(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")

    if not 0.0 <= args.removes < 1.0:
        parser.error("--removes must be in [0, 1)")
    pool = pool_bytes(args.clients, args.max_puts, args.nodes)
    tiers: dict[str, object] = {"dram": f"{pool >> 20}MiB"}
    master_args = list(MASTER_ARGS)
    if args.nvme:  # blocks go down to NVMe past a fifth of the DRAM pool; nothing is evicted
        tiers = {"dram": f"{pool >> 20}MiB", "nvme": f"{pool >> 20}MiB"}
        master_args += ["--dram-high-watermark", "0.2", "--dram-low-watermark", "0.1"]
    report: dict = {}
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    place = (
        contextlib.nullcontext(args.keep)
        if args.keep
        else tempfile.TemporaryDirectory(prefix="mooncake-chaos-")
    )
    with place as tmp:
        private_token_dir(tmp)
        with ChaosCluster(tmp, libfaketime=find_libfaketime(), nodes=args.nodes,
                          master_args=master_args, **tiers) as cluster:  # fmt: skip
            chaos = Chaos(cluster, random.Random(args.seed), args.fault_interval, kinds)
            print(
                f"{args.nodes} nodes of {' + '.join(f'{v} {k.upper()}' for k, v in tiers.items())}"
                f"; faults: {', '.join(chaos.kinds)}"
                + (f"; skipped: {chaos.skipped}" if chaos.skipped else ""),
                flush=True,
            )
            deadline = time.time() + args.duration
            ctx = mp.get_context("spawn")
            outs = [f"{tmp}/client-{i}.json" for i in range(args.clients)]
            procs = [ctx.Process(target=client_main,
                                 args=(i, cluster.master_address, deadline, args.max_puts, o,
                                       args.removes))
                     for i, o in enumerate(outs)]  # fmt: skip
            for p in procs:
                p.start()
            chaos.short_logs = [o + ".short" for o in outs]
            injector = threading.Thread(target=chaos.run)
            injector.start()
            for p in procs:
                p.join(args.duration + 120)
            chaos.stop.set()
            injector.join(120)
            chaos.stop.clear()
            cluster.step_clock(0)
            for node in cluster.nodes:  # bring everything back
                node.signal(signal.SIGCONT)
            settled = chaos.wait_healthy(60)
            results = [json.loads(Path(o).read_text()) for o in outs if Path(o).exists()]
            clients_failed = len(outs) - len(results)  # died: their blocks go unchecked
            acked = [k for r in results for k in r["acked"]]
            acked_at = {
                k: t for r in results for k, t in zip(r["acked"], r["acked_at"], strict=True)
            }
            lost: list[str] = []
            wrong = 0
            unreadable_errors: Counter[str] = Counter()
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
                failed_puts = {k: e for r in results for k, e in r.get("failed", {}).items()}
                misreported: list[str] = []
                why = {k: w for r in results for k, w in r.get("why", {}).items()}
                failed_visible, failed_wrong = failed_puts_check(
                    store, failed_puts, misreported, why
                )
                wrong += failed_wrong
                removed = [k for r in results for k in r.get("removed", [])]
                removed_visible = [
                    k for start in range(0, len(removed), 1000)
                    for k, there in zip(removed[start : start + 1000],
                                        store.exists_many(removed[start : start + 1000]),
                                        strict=True)
                    if there
                ]  # fmt: skip
                counters = store.stats().counters
            chaos.totals.update(counters)
            evictions = int(chaos.totals.get("evictions", 0))
            errors: Counter[str] = Counter()
            for r in results:
                errors.update(r["errors"])
            report = {
                "duration_s": args.duration, "nodes": args.nodes, "clients": args.clients,
                "pool_bytes_per_node": pool, "tiers": tiers,
                "acked_blocks": len(acked),
                "reads": sum(r["reads"] for r in results) + len(acked),
                "wrong_bytes": sum(r["wrong_bytes"] for r in results) + wrong,
                "lost_acked_blocks": len(lost),
                "clients_failed": clients_failed,
                "acked_short": sum(len(r.get("short", {})) for r in results),
                "acked_replicas_unknown": sum(len(r.get("replicas_unknown", [])) for r in results),
                "lost_acked_short": sum(k in r.get("short", {}) for r in results for k in lost),
                "lost_examples": lost[:10],
                "lost_by_client": dict(Counter(k.partition("/")[0] for k in lost)),
                "lost_windows": loss_windows([(k, acked_at[k]) for k in lost]),
                "unreadable_errors": dict(unreadable_errors),
                "evictions": evictions,
                "loss_vs_eviction": (
                    "exact: nothing was evicted, so every unreadable acknowledged block is lost"
                    if evictions == 0 else
                    "evictions happened (pools too small for the workload): an unreadable block "
                    "may have been evicted; each is still counted as lost"
                ),
                "faults_injected": dict(chaos.faults),
                "faults_skipped": chaos.skipped,
                "duplicate_node_ids_refused": chaos.duplicates_refused,
                "duplicate_node_ids_accepted": chaos.duplicates_accepted,
                "errors": dict(errors),
                "failed_puts": len(failed_puts),
                "failed_puts_visible": dict(failed_visible),
                "misreported_puts": sum(
                    n for e, n in failed_visible.items() if e not in OUTCOME_UNKNOWN
                ),
                "misreported_examples": misreported,
                "put_retries": dict(
                    sum((Counter(r.get("put_retries", {})) for r in results), Counter())
                ),
                "removes_acked": len(removed),
                "removes_unknown": sum(len(r.get("remove_unknown", [])) for r in results),
                "removed_visible": len(removed_visible),
                "removed_visible_examples": removed_visible[:10],
                "settled": settled,
                "repairs": counters.get("repairs", 0),  # the last master lifetime's
                "master_counters": dict(chaos.totals),
                "fault_log": chaos.log,
            }  # fmt: skip
    summary = {k: v for k, v in report.items() if k not in ("fault_log", "master_counters")}
    print(json.dumps(summary, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    failed = (report["wrong_bytes"] or report["lost_acked_blocks"] or not report["settled"]
              or report["misreported_puts"] or report["removed_visible"]
              or report["clients_failed"])  # fmt: skip
    sys.exit(1 if failed or report["duplicate_node_ids_accepted"] else 0)


if __name__ == "__main__":
    main()
