"""Liveness with real processes: a stalled master loop, SIGSTOP inside and outside the grace
window, two nodes under one --node-id, and daemons whose port is taken.

The rules under test: a node is dropped only when it really went silent (not because the
master was busy), a node that comes back within the grace window keeps every replica, an
identity conflict is refused without touching the live node, and a daemon that cannot bind its
port says so in one line and exits non-zero.
"""

from __future__ import annotations

import asyncio
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from mooncake_store import Client, ReplicaUnavailableError
from mooncake_store.admin.ops import nodes as admin_nodes
from mooncake_store.cluster import _NODE_READY, DaemonProcess, LocalCluster
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.server import MasterServer
from tests.conftest import wait_until


def value(key: str) -> bytes:
    return key.encode() * (4000 // len(key))


class InProcessMaster:
    """A MasterServer on its own loop and thread in the test process, so a test can stall
    the loop that serves clients."""

    def __init__(self, config: MasterConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = MasterServer(config)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self.call(self.server.start())

    def call(self, coro: object, timeout_s: float = 30.0) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)  # type: ignore[arg-type]

    def stall(self, seconds: float) -> None:
        """Keep the serving loop busy in Python code (like a huge batch) for `seconds`."""

        def busy() -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                sum(range(1000))

        self.loop.call_soon_threadsafe(busy)

    def close(self) -> None:
        self.call(self.server.stop(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def start_node(master: str, log_dir: Path, node_id: str, *extra: str) -> DaemonProcess:
    args = [sys.executable, "-m", "mooncake_store.node", "--master", master, "--host",
            "127.0.0.1", "--dram", "16MiB", "--node-id", node_id, *extra]  # fmt: skip
    return DaemonProcess(args, log_dir / f"{node_id}-{time.monotonic_ns()}.log", _NODE_READY, 30)


def test_a_busy_master_drops_no_node_and_deletes_no_object(tmp_path: Path) -> None:
    """A serving loop held for three heartbeat TTLs, then the issue's repro scaled: two clients
    sending 100k-key lookups back to back for two TTLs.  No grace window: only the heartbeat
    path keeps the nodes alive.  (With --liveness-port -1, heartbeats on the serving loop, and
    batches served in one go, the old master, both nodes are dropped in either phase.)"""
    from mooncake_store.client.master_client import MasterClient
    from mooncake_store.client.types import Retry

    config = MasterConfig(
        port=0, data_dir=str(tmp_path / "master"), heartbeat_interval_s=0.2,
        heartbeat_ttl_s=1.0, suspect_grace_s=0.0,
    )  # fmt: skip
    master = InProcessMaster(config)
    address = f"127.0.0.1:{master.port}"
    nodes = [start_node(address, tmp_path, f"n{i}") for i in range(2)]

    def nothing_dropped(store: Client, keys: list[str]) -> None:
        for _ in range(5):  # several ticks after the stall or the load
            assert store.stats().counters["nodes_expired"] == 0
            time.sleep(0.1)
        assert master.server.table.counters["nodes_suspected"] == 0
        assert store.stats().objects == len(keys)
        assert all(store.get(k) == value(k) for k in keys)

    try:
        with Client(address) as store:
            wait_until(lambda: len(store.list_nodes()) == 2, what="nodes to mount")
            keys = [f"busy/{i}" for i in range(20)]
            for key in keys:
                store.put(key, value(key))

            master.stall(3.0)  # three TTLs without serving a client call or a tick
            time.sleep(0.2)
            assert len(store.list_nodes()) == 2  # answered once the stall is over
            nothing_dropped(store, keys)

            lookups = [*keys, *(f"absent/{i}" for i in range(100_000 - len(keys)))]
            end = time.monotonic() + 2.0
            sent = [0, 0]

            def load(slot: int) -> None:
                async def run() -> None:
                    client = MasterClient(address, timeout_s=60, retry=Retry())
                    while time.monotonic() < end:
                        await client.get_replica_list(lookups)
                        sent[slot] += 1
                    await client.close()

                asyncio.run(run())

            threads = [threading.Thread(target=load, args=(i,)) for i in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            assert sum(sent) >= 2
            nothing_dropped(store, keys)
    finally:
        for node in nodes:
            node.stop()
        master.close()


@pytest.fixture
def graced(tmp_path: Path) -> Iterator[LocalCluster]:
    args = ["--heartbeat-interval", "200ms", "--heartbeat-ttl", "1s", "--suspect-grace", "3s"]
    with LocalCluster(tmp_path, nodes=3, dram="32MiB", master_args=args) as cluster:
        yield cluster


def node_ids(store: Client) -> set[str]:
    """The nodes offered to readers and writers (listed, and not suspect)."""
    return {n.node_id for n in store.list_nodes() if n.state != "suspect"}


def node_states(store: Client) -> dict[str, str]:
    return {n.node_id: n.state for n in store.list_nodes()}


def node_state_gauge(url: str) -> dict[str, float]:
    """mooncake_master_node_states{state=...} from the master's /metrics page."""
    page = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.findall(r'^mooncake_master_node_states\{state="(\w+)"\} (\S+)$', page, re.M)
    return {state: float(v) for state, v in found}


@pytest.mark.timeout(90)
def test_sigstop_inside_the_grace_window_keeps_every_replica_outside_drops_them(
    graced: LocalCluster,
) -> None:
    with Client(graced.master_address, local_shm=False) as store:
        keys = [f"grace/{i}" for i in range(60)]
        for key in keys:
            store.put(key, value(key))
        master = store._async.flows.master_client()
        on_node1 = [  # the keys whose one replica is on node-1
            k for k in keys
            if store._run(master.get_replica_list([k]))[0].replicas[0].node_id == "node-1"
        ]  # fmt: skip
        assert on_node1
        expired = store.stats().counters["nodes_expired"]

        graced.nodes[1].signal(signal.SIGSTOP)  # inside the window: stopped ~2 s
        wait_until(lambda: "node-1" not in node_ids(store), what="node-1 to be suspect")
        # Listed with its state (issue 11), on the client, in mooncake-admin and in /metrics.
        (row,) = [n for n in store.list_nodes() if n.node_id == "node-1"]
        assert row.state == "suspect" and 0 < row.drop_in_s <= 3.0, row
        assert node_states(store) == {"node-0": "valid", "node-1": "suspect", "node-2": "valid"}
        gauge = node_state_gauge(graced.master.metrics_url)  # type: ignore[union-attr]
        assert gauge == {"valid": 2, "suspect": 1, "draining": 0, "mounting": 0}
        out = CliRunner().invoke(admin_nodes, ["--master", graced.master_address])
        assert out.exit_code == 0, out.output
        (line,) = [ln for ln in out.output.splitlines() if ln.startswith("node-1 ")]
        assert "suspect (dropped in " in line, out.output
        assert store.stats().objects == len(keys)  # suspect: not offered, nothing deleted
        with pytest.raises(ReplicaUnavailableError):
            store.get(on_node1[0])
        graced.nodes[1].signal(signal.SIGCONT)
        wait_until(lambda: "node-1" in node_ids(store), what="node-1 to be offered again")
        assert node_states(store)["node-1"] == "valid"
        assert store.stats().counters["nodes_expired"] == expired
        assert all(store.get(k) == value(k) for k in keys)  # every replica valid again

        graced.nodes[1].signal(signal.SIGSTOP)  # outside the window: past TTL + grace
        try:
            wait_until(lambda: store.stats().counters["nodes_expired"] > expired,
                       timeout_s=20, what="node-1 to be dropped")  # fmt: skip
            assert store.stats().objects == len(keys) - len(on_node1)
        finally:
            graced.nodes[1].signal(signal.SIGCONT)
        # It mounts again (fresh) and the survivors still read back right.
        wait_until(lambda: "node-1" in node_ids(store), what="node-1 to mount again")
        assert all(store.get(k) == value(k) for k in keys if k not in on_node1)


@pytest.mark.timeout(60)
def test_a_second_node_under_a_live_node_id_is_refused_and_exits(tmp_path: Path) -> None:
    args = ["--heartbeat-interval", "200ms", "--heartbeat-ttl", "1500ms"]
    with LocalCluster(tmp_path, nodes=1, dram="32MiB", master_args=args) as cluster:
        with Client(cluster.master_address) as store:
            keys = [f"dup/{i}" for i in range(10)]
            for key in keys:
                store.put(key, value(key))
            first = store.list_nodes()[0]
            proc = subprocess.run(
                [sys.executable, "-m", "mooncake_store.node", "--master", cluster.master_address,
                 "--host", "127.0.0.1", "--dram", "16MiB", "--node-id", "node-0"],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert proc.returncode != 0
            lines = [line for line in proc.stderr.splitlines() if "node id" in line]
            assert len(lines) == 1, proc.stderr  # one line, naming both nodes
            assert lines[0].startswith("mooncake-store: "), lines[0]
            assert "node id 'node-0' is taken" in lines[0], lines[0]
            assert first.endpoint in lines[0] and "is refused" in lines[0], lines[0]
            # The live node keeps its id, its endpoint and every object, and stays mounted.
            time.sleep(1.0)
            assert [(n.node_id, n.endpoint) for n in store.list_nodes()] == [
                ("node-0", first.endpoint)
            ]
            assert store.stats().counters["nodes_expired"] == 0
            assert all(store.get(k) == value(k) for k in keys)


def taken_port() -> tuple[socket.socket, int]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock, sock.getsockname()[1]


@pytest.mark.timeout(60)
def test_a_second_master_on_a_taken_port_exits_and_the_first_keeps_serving(
    tmp_path: Path,
) -> None:
    with LocalCluster(tmp_path, nodes=1, dram="32MiB") as cluster:
        with Client(cluster.master_address) as store:
            store.put("first", b"served by the first master")
            proc = subprocess.run(
                [sys.executable, "-m", "mooncake_store.master", "--host", "127.0.0.1",
                 "--port", str(cluster.master_port), "--data-dir", str(tmp_path / "second")],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert proc.returncode == 1
            assert proc.stderr.strip().count("\n") == 0, proc.stderr
            assert "port in use" in proc.stderr and str(cluster.master_port) in proc.stderr
            for i in range(10):  # every new connection still reaches the first master
                with Client(cluster.master_address) as again:
                    assert again.get("first") == b"served by the first master"
                    again.put(f"more/{i}", b"x")
        # The framed endpoint and the node's ports the same way.
        holder, port = taken_port()
        try:
            for cmd in (
                ["mooncake_store.master", "--port", "0", "--framed-port", str(port)],
                ["mooncake_store.master", "--port", "0", "--liveness-port", str(port)],
                ["mooncake_store.node", "--master", cluster.master_address, "--dram", "16MiB",
                 "--port", str(port)],
                ["mooncake_store.node", "--master", cluster.master_address, "--dram", "16MiB",
                 "--control-port", str(port)],
            ):  # fmt: skip
                proc = subprocess.run(
                    [sys.executable, "-m", *cmd, "--host", "127.0.0.1",
                     *(["--data-dir", str(tmp_path / "third")] if "master" in cmd[0] else [])],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                assert proc.returncode == 1, (cmd, proc.stderr)
                assert proc.stderr.strip().count("\n") == 0, (cmd, proc.stderr)
                assert "port in use" in proc.stderr and str(port) in proc.stderr, proc.stderr
        finally:
            holder.close()
