"""A local cluster of real daemons (one master, N store nodes) as subprocesses on 127.0.0.1.

Used by `make run` (`mooncake-cluster --demo`), by the benchmarks and by the integration tests:
every process is the real `python -m mooncake_store.master` / `mooncake_store.node` with its
own port (bound to port 0 and read back from the daemon's start-up line) and logs under the
cluster's directory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Generic, TypeVar

import click

from mooncake_store.common.daemon import OneLineErrors, fail
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.units import format_size, parse_size
from mooncake_store.master.config import DEFAULT_MASTER_PORT
from mooncake_store.node.memory import available_memory_bytes

_MASTER_READY = re.compile(r"mooncake-master listening on (\S+):(\d+)")
NODE_READY = _NODE_READY = re.compile(
    r"mooncake-store node (\S+) serving .* data (\S+):(\d+), control \S+:(\d+)"
)
METRICS_URL = _METRICS = re.compile(r"metrics (http://\S+/metrics)")

# `make run` serves the master's /metrics here and node i's on the next ports.
DEFAULT_METRICS_PORT = 9150


class DaemonStartError(RuntimeError):
    """A daemon of the cluster exited or stayed silent at start; the message is one line."""


class DaemonProcess:
    """One daemon subprocess whose start-up line has been read."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: Path,
        ready: re.Pattern[str],
        timeout_s: float,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            self.args,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
        )
        self.match = self._wait_ready(ready, timeout_s)
        threading.Thread(target=self._drain, daemon=True).start()

    def _wait_ready(self, ready: re.Pattern[str], timeout_s: float) -> re.Match[str]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        result: list[re.Match[str]] = []

        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                self._log.write(raw)
                self._log.flush()
                m = ready.search(line)
                if m:
                    result.append(m)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(max(0.0, deadline - time.monotonic()))
        if not result:
            code = self.proc.poll()
            if code is None and not reader.is_alive():  # its output ended: it is exiting
                try:
                    code = self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
            lines = [x for x in self.log_path.read_text(errors="replace").splitlines() if x.strip()]
            last = lines[-1].strip() if lines else ""
            what = self.log_path.stem
            if code is not None:
                cause = f"{what} exited with code {code} at start"
            else:
                cause = f"{what} did not start within {timeout_s:g}s"
            detail = f": {last}" if last else " and logged nothing"
            raise DaemonStartError(f"{cause}{detail} (log: {self.log_path})")
        return result[0]

    @property
    def metrics_url(self) -> str | None:
        """The daemon's /metrics URL from its start-up line, if it serves one."""
        m = _METRICS.search(self.match.string)
        return m.group(1) if m else None

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._log.write(raw)
            self._log.flush()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.kill(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> int:
        """SIGTERM, wait for a graceful exit, SIGKILL if it does not come; return the exit code."""
        self.signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.proc.wait()

    def kill(self) -> None:
        if self.alive():
            self.proc.kill()
        self.proc.wait()
        self._log.close()


M = TypeVar("M")  # the master handle of a cluster
N = TypeVar("N")  # a node handle


class ClusterBase(Generic[M, N]):
    """What a local cluster is, however its daemons run: its settings (the daemons' own flags
    in `master_args` and `node_args`), the flags each daemon is started with, its members, and
    waiting for the nodes.  `LocalCluster` runs them as subprocesses, `InProcessCluster`
    (cluster_inprocess.py) on threads of the calling process."""

    DEFAULT_METRICS_PORT = 0  # the master's /metrics; -1: none
    POLL_S = 0.05  # how often wait_for_nodes asks the master

    def __init__(
        self,
        root: str | Path,
        *,
        nodes: int = 2,
        dram: str = "64MiB",
        master_args: Sequence[str] = (),
        node_args: Sequence[str] = (),
        nvme: str | None = None,
        start_timeout_s: float = 30.0,
        client_options: dict[str, Any] | None = None,
        metrics_port: int | None = None,
    ) -> None:
        self.root = Path(root)
        # Client(...) options of the cluster's own probes (e.g. tls= for a TLS cluster).
        self.client_options = dict(client_options or {})
        self.nvme = nvme  # per-node NVMe tier size; each node gets root/nvme-<index>
        self.data_dir = self.root / "master"
        self.node_count = nodes
        self.dram = dram
        self.master_args = list(master_args)
        self.node_args = list(node_args)
        self.timeout_s = start_timeout_s
        # The master's; node i gets metrics_port + 1 + i when > 0.
        self.metrics_port = self.DEFAULT_METRICS_PORT if metrics_port is None else metrics_port
        self.master: M | None = None
        self.master_port = 0
        self.nodes: list[N] = []

    @property
    def master_address(self) -> str:
        return f"127.0.0.1:{self.master_port}"

    def start(self) -> Any:
        self.start_master()
        for _ in range(self.node_count):
            self.add_node()
        self.wait_for_nodes(self.node_count)
        return self

    def start_master(self) -> M:
        raise NotImplementedError

    def _start_node(self, index: int, extra_args: Sequence[str], dram: str | None) -> N:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def _master_flags(self) -> list[str]:
        """The master's flags (again on the same port and data directory after a stop)."""
        return [
            "--host", "127.0.0.1", "--port", str(self.master_port),
            "--data-dir", str(self.data_dir), "--metrics-port", str(self.metrics_port),
            *self.master_args,
        ]  # fmt: skip

    def _node_flags(self, index: int, extra_args: Sequence[str], dram: str | None) -> list[str]:
        """Node `index`'s flags: its id is node-<index>, so a restart keeps it."""
        port = self.metrics_port + 1 + index if self.metrics_port > 0 else self.metrics_port
        args = [
            "--master", self.master_address, "--host", "127.0.0.1", "--dram", dram or self.dram,
            "--node-id", f"node-{index}", "--metrics-port", str(port),
            *self.node_args, *extra_args,
        ]  # fmt: skip
        if self.nvme:
            args += ["--nvme-dir", str(self.root / f"nvme-{index}"), "--nvme", self.nvme]
        return args

    def add_node(self, *extra_args: str, dram: str | None = None) -> N:
        node = self._start_node(len(self.nodes), extra_args, dram)
        self.nodes.append(node)
        return node

    def restart_node(self, index: int, *extra_args: str) -> N:
        """Start node `index` again under the same node id (after it stopped or was killed)."""
        if self.nodes[index].alive():  # type: ignore[attr-defined]
            raise RuntimeError(f"node-{index} is still running")
        self.nodes[index] = self._start_node(index, extra_args, None)
        return self.nodes[index]

    def metrics_lines(self) -> list[str]:
        """`metrics: <daemon> <url>` for every daemon that serves /metrics."""
        daemons: list[tuple[str, Any]] = [("master", self.master)]
        daemons += [(f"node-{i}", n) for i, n in enumerate(self.nodes)]
        return [f"metrics: {name} {d.metrics_url}" for name, d in daemons
                if d is not None and d.metrics_url]  # fmt: skip

    def wait_for_nodes(self, count: int, timeout_s: float | None = None) -> None:
        """Poll the master until exactly `count` nodes are mounted and offered (a suspect
        node, silent past its heartbeat TTL, does not count, nor one still "mounting": it
        takes no puts until it took the master's first write fence)."""
        from mooncake_store.client.sync_client import Client

        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        with Client(self.master_address, **self.client_options) as client:
            while True:
                nodes = client.list_nodes()
                mounted = len({n.node_id for n in nodes if n.state not in ("suspect", "mounting")})
                if mounted == count:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{mounted} nodes mounted, expected {count}")
                time.sleep(self.POLL_S)

    def __enter__(self) -> Any:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


class LocalCluster(ClusterBase[DaemonProcess, DaemonProcess]):
    """A master and `nodes` store nodes on 127.0.0.1, all real processes.

    Example:
        with LocalCluster(tmp_path, nodes=2, dram="64MiB") as cluster:
            with Client(cluster.master_address) as store:
                store.put("k", b"v")
    """

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    def start_master(self) -> DaemonProcess:
        """Start the master (again, on the same port and data directory after a stop)."""
        args = [sys.executable, "-m", "mooncake_store.master", *self._master_flags()]
        self.master = DaemonProcess(
            args, self.log_dir / "master.log", _MASTER_READY, self.timeout_s
        )
        self.master_port = int(self.master.match.group(2))
        return self.master

    def _start_node(self, index: int, extra_args: Sequence[str], dram: str | None) -> DaemonProcess:
        args = [sys.executable, "-m", "mooncake_store.node",
                *self._node_flags(index, extra_args, dram)]  # fmt: skip
        return DaemonProcess(args, self.log_dir / f"node-{index}.log", _NODE_READY, self.timeout_s)

    def node_endpoint(self, index: int) -> str:
        m = self.nodes[index].match
        return f"{m.group(2)}:{m.group(3)}"

    def stop(self) -> None:
        """Stop the whole cluster: the master first, so that the nodes do not drain their
        blocks onto each other on the way out (a node alone drains on SIGTERM)."""
        if self.master is not None and self.master.alive():
            self.master.stop()
        for node in self.nodes:
            if node.alive():
                node.stop()


def connect_hint(cluster: LocalCluster) -> str:
    """How a second process connects to `cluster` (printed at start)."""
    from mooncake_store.common.credentials import local_token_path

    master = cluster.master_address
    return (
        f"connect: Client({master!r}) in a process of this user on this host finds its token "
        f"in {local_token_path(cluster.master_port)}; anyone else needs one: "
        f"mooncake-admin token create --role client --tenant NAME --data-dir {cluster.data_dir}"
        " (then Client(master, token=...) or MOONCAKE_TOKEN)"
    )


@click.command(
    "mooncake-cluster", cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.option(
    "--data-dir",
    default="mooncake-data",
    show_default=True,
    help="Directory for the master's RocksDB and the logs.",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="The master's gRPC port; 0 picks a free one.  [default: 50051, or 0 with --exit]",
)
@click.option(
    "--metrics-port",
    type=click.IntRange(-1, 65535),
    default=None,
    help="The master's /metrics port; node i serves on this + 1 + i; 0: free ports, -1: off.  "
    "[default: 9150, or 0 with --exit]",
)
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True,
              help="Store nodes to start (at least 1).")  # fmt: skip
@click.option("--dram", default="256MiB", show_default=True, help="DRAM pool per node.")
@click.option(
    "--nvme", default=None, help="Give each node an NVMe tier of this size.  [default: none]"
)
@click.option(
    "--demo/--no-demo",
    default=True,
    show_default=True,
    help="Run the demo workload once the cluster is up.",
)
@click.option("--exit", "exit_after", is_flag=True, help="Stop after the demo instead of serving.")
def main(
    data_dir: str,
    port: int | None,
    metrics_port: int | None,
    nodes: int,
    dram: str,
    nvme: str | None,
    demo: bool,
    exit_after: bool,
) -> None:
    """Start a local cluster (master + store nodes) on 127.0.0.1 and serve until Ctrl-C."""
    from mooncake_store.demo import run_demo

    name = "mooncake-cluster"
    try:
        dram_bytes = parse_size(dram)
    except InvalidArgumentError as exc:
        fail(name, f"bad value for --dram: {exc}", 2)
    available = available_memory_bytes()
    if available is not None and dram_bytes * nodes > available:
        fail(name, f"{nodes} nodes x --dram {format_size(dram_bytes)} is more than the "
                   f"{format_size(available)} of memory available: pass a smaller --dram or "
                   "fewer --nodes", 2)  # fmt: skip
    if port is None:
        port = 0 if exit_after else DEFAULT_MASTER_PORT
    if metrics_port is None:
        metrics_port = 0 if exit_after else DEFAULT_METRICS_PORT
    cluster = LocalCluster(data_dir, nodes=nodes, dram=dram, nvme=nvme, metrics_port=metrics_port)
    cluster.master_port = port
    try:
        try:
            cluster.start()
        except DaemonStartError as exc:
            fail(name, str(exc), 1)
        except TimeoutError as exc:
            fail(name, f"{exc}; see the logs in {cluster.log_dir}", 1)
        tiers = f"{dram} DRAM" + (f" + {nvme} NVMe" if nvme else "")
        click.echo(
            f"cluster up: master {cluster.master_address}, {nodes} nodes x {tiers} "
            f"(logs in {cluster.log_dir})"
        )
        for line in cluster.metrics_lines():
            click.echo(line)
        click.echo(connect_hint(cluster))
        if demo:
            run_demo(cluster.master_address, echo=click.echo)
        if not exit_after:
            click.echo(f"serving on {cluster.master_address}; Ctrl-C to stop")
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
        click.echo("cluster stopped")


if __name__ == "__main__":
    main()
