"""An in-process cluster for tests: the real master and store nodes, each on its own thread and
event loop inside the calling process, on 127.0.0.1 with free ports.

`InProcessCluster` takes `LocalCluster`'s arguments (the daemons' command-line flags in
`master_args` and `node_args`, parsed by the daemons' own command lines, so the same settings,
environment variables and defaults apply) and offers the members tests use: `master_address`,
`nodes`, `node_endpoint`, `add_node`, `restart_node`, `wait_for_nodes`, `stop`.  It starts in
well under a second, where a subprocess cluster pays an interpreter start-up per daemon.

What differs from daemons in their own processes, by design:

- No signal handlers and no process-wide settings (the daemons' `serve()` installs SIGTERM
  handlers and tunes malloc; here `MasterServer` and `StoreNode` are started directly).
  Each daemon's metrics are in its own registry (common/metrics.py), so nothing collides.
- A same-host client is the nodes' own process: the shared-memory hand-off still runs for
  real (the client connects to the node's abstract unix socket, the node checks SO_PEERCRED
  and passes the memfd, the client maps it a second time).
- Process-level faults (SIGSTOP, kill -9, a crash, another uid, faked clocks) need
  `LocalCluster`: an in-process node can only stop gracefully (`stop()`, as after SIGTERM:
  drain, unmount, close) or abruptly without telling the master (`halt()`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

import click

from mooncake_store.cluster import METRICS_URL as _METRICS
from mooncake_store.cluster import ClusterBase
from mooncake_store.common.addresses import join_host_port
from mooncake_store.common.config import load_config
from mooncake_store.common.loop import new_event_loop

T = TypeVar("T")


def parse_flags(command: click.Command, config_cls: type[T], env_prefix: str,
                args: Sequence[str]) -> T:  # fmt: skip
    """A daemon's config from its command-line flags, as its `main()` builds it."""
    with command.make_context(command.name or "daemon", list(args)) as ctx:
        params = dict(ctx.params)
    params.pop("log_level", None)
    config_file = params.pop("config_file", None)
    return load_config(config_cls, env_prefix=env_prefix, config_file=config_file,
                       overrides=params)  # fmt: skip


class LoopThread:
    """An event loop running on a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        """Run `coro` on the loop and wait for its result (cancelled after `timeout_s`)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"{self._thread.name}: no answer within {timeout_s:g}s") from None

    def close(self) -> None:
        """Cancel what still runs on the loop, stop it and join the thread."""
        if self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.loop.shutdown_asyncgens()
            await self.loop.shutdown_default_executor()

        try:
            self.run(cancel_all(), 10.0)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10.0)
            if not self._thread.is_alive():
                self.loop.close()


class InProcessDaemon:
    """One daemon (a `MasterServer` or a `StoreNode`) on its own loop thread."""

    def __init__(self, name: str, server: Any, timeout_s: float) -> None:
        self.name = name
        self.server = server
        self.timeout_s = timeout_s
        self._thread: LoopThread | None = LoopThread(f"mooncake-{name}")

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run `coro` on this daemon's loop (e.g. one of its server's methods)."""
        if self._thread is None:
            coro.close()
            raise RuntimeError(f"{self.name} is stopped")
        return self._thread.run(coro, timeout_s or self.timeout_s)

    def alive(self) -> bool:
        return self._thread is not None

    @property
    def metrics_url(self) -> str | None:
        """The daemon's /metrics URL, if it serves one (as `DaemonProcess.metrics_url`)."""
        found = _METRICS.search(getattr(self.server, "metrics_url", "") or "")
        return found.group(1) if found else None

    def _end(self, coro: Coroutine[Any, Any, None], timeout_s: float) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            coro.close()
            return
        try:
            thread.run(coro, timeout_s)
        finally:
            thread.close()


class InProcessMaster(InProcessDaemon):
    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop serving and close RocksDB, as the master does on SIGTERM."""
        self._end(self.server.stop(self.server.config.stop_grace_s), timeout_s)
        gc.unfreeze()  # the master freezes the heap (master/server.py); give it back here


class InProcessNode(InProcessDaemon):
    @property
    def node_id(self) -> str:
        return str(self.server.node_id)

    @property
    def control_port(self) -> int:
        return int(self.server.control_port)

    def stop(self, timeout_s: float = 30.0) -> None:
        """As on SIGTERM: copy off the blocks only this node holds, unmount, close."""

        async def graceful() -> None:
            await self.server.drain(self.server.config.drain_timeout_s)
            await self.server.stop()

        self._end(graceful(), timeout_s)

    def halt(self, timeout_s: float = 10.0) -> None:
        """Stop serving without draining or unmounting: the master learns it from the missed
        heartbeats, as after a crash (the pool's memory is released)."""
        self._end(self.server.stop(unmount=False), timeout_s)


class InProcessCluster(ClusterBase[InProcessMaster, InProcessNode]):
    """A master and `nodes` store nodes in this process (see the module docstring).

    Example:
        with InProcessCluster(tmp_path, nodes=2, dram="64MiB") as cluster:
            with Client(cluster.master_address) as store:
                store.put("k", b"v")
    """

    DEFAULT_METRICS_PORT = -1  # no /metrics servers (0: free ports)
    POLL_S = 0.02

    def start_master(self) -> InProcessMaster:
        """Start the master (again, on the same port and data directory after a stop)."""
        from mooncake_store.master import cli
        from mooncake_store.master.config import MasterConfig
        from mooncake_store.master.server import MasterServer

        config = parse_flags(cli.main, MasterConfig, cli.ENV_PREFIX, self._master_flags())
        master = InProcessMaster("master", None, self.timeout_s)
        try:
            master.server = master.call(_construct(MasterServer, config))
            self.master_port = master.call(master.server.start())
        except BaseException:
            master._end(_nothing(), 5.0)
            raise
        self.master = master
        return master

    def _start_node(self, index: int, extra_args: Sequence[str],
                    dram: str | None) -> InProcessNode:  # fmt: skip
        from mooncake_store.node import cli
        from mooncake_store.node.config import NodeConfig
        from mooncake_store.node.server import StoreNode

        args = self._node_flags(index, extra_args, dram)
        config = parse_flags(cli.main, NodeConfig, cli.ENV_PREFIX, args)
        node = InProcessNode(f"node-{index}", None, self.timeout_s)
        try:
            node.server = node.call(_construct(StoreNode, config))
            node.call(node.server.start())
            node.call(node.server.wait_mounted())
        except BaseException:
            server = node.server
            node._end(server.stop(unmount=False) if server is not None else _nothing(), 10.0)
            raise
        return node

    def node_endpoint(self, index: int) -> str:
        server = self.nodes[index].server
        return join_host_port(server.config.advertised_host, server.port)

    def stop(self) -> None:
        """Stop the whole cluster: the master first (as LocalCluster does), then the nodes
        without a drain (there is no master to take their blocks)."""
        errors: list[BaseException] = []
        if self.master is not None and self.master.alive():
            try:
                self.master.stop()
            except BaseException as exc:  # the nodes must stop all the same
                errors.append(exc)
        for node in self.nodes:
            if node.alive():
                try:
                    node.halt()
                except BaseException as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]


async def _construct(cls: Callable[[Any], T], config: Any) -> T:
    """`cls(config)` on the daemon's loop (its constructor may bind asyncio objects)."""
    return cls(config)


async def _nothing() -> None:
    return None
