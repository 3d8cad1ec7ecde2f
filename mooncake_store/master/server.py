"""The master daemon's lifecycle: RocksDB load, gRPC server, health service, background ticks."""

from __future__ import annotations

import asyncio
import functools
import logging
import signal
import time
from asyncio import Task
from collections.abc import Collection, Coroutine, Iterable
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mooncake_store.common.addresses import join_host_port
from mooncake_store.common.auth import TokenAuthority, load_or_create_cluster_key
from mooncake_store.common.credentials import remove_local_tokens, write_local_tokens
from mooncake_store.common.grpc_options import bind_grpc, server_options
from mooncake_store.common.metrics import MetricsServer, start_metrics, url
from mooncake_store.master.access import AccessControl, AuthInterceptor
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.drain import Drains
from mooncake_store.master.eviction import make_policy
from mooncake_store.master.framed_server import FramedServer
from mooncake_store.master.generations import GenerationFloor
from mooncake_store.master.grpc_admission import Admission, ConnectionCapInterceptor, hard_limit
from mooncake_store.master.grpc_owners import read_established
from mooncake_store.master.liveness import LivenessServer
from mooncake_store.master.metrics import InstrumentedServicer, master_registry
from mooncake_store.master.mover import NodeMover
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.persistence import MetadataStore
from mooncake_store.master.process import (
    GC_FREEZE_INTERVAL_S,
    freeze_long_lived,
    map_large_allocations,
    open_metadata,
)
from mooncake_store.master.releases import BlockName
from mooncake_store.master.replication import CopyTask, Replication
from mooncake_store.master.service import MasterServicer, add_to_server
from mooncake_store.master.tenancy import TenantServicer
from mooncake_store.master.tiering import MoveTask, Tiering

log = logging.getLogger("mooncake.master")

SERVICE_NAME = "mooncake_store.v1.MasterService"
# A node's first fence of this run (membership.py `awaiting_first_fence`) goes out this long
# after its mount, so that the mount reply gets there first, and is given up after
# FIRST_FENCE_TIMEOUT_S (the tick's pushes go on trying).
FIRST_FENCE_DELAY_S = 0.02
FIRST_FENCE_TIMEOUT_S = 1.0
FIRST_FENCE_RETRY_S = 0.25  # a node that did not take it is pushed again after this (ticks)


class MasterServer:
    """A running master.  `start()` returns the bound port; `stop()` drains and closes.

    Example:
        server = MasterServer(MasterConfig(port=0, data_dir=tmp))
        port = await server.start()
        ...
        await server.stop()
    """

    def __init__(self, config: MasterConfig) -> None:
        self.config = config
        self.generations = GenerationFloor(Path(config.data_dir))  # put generations' floor
        self.table = ObjectTable(config, clock=time.monotonic, policy=make_policy(
            config.eviction_policy,
            **({"depth_cost": config.eviction_depth_cost,
                "ghost_entries": config.eviction_ghost_entries}
               if config.eviction_policy == "weighted" else {}),
        ), first_generation=self.generations.start(time.time_ns() // 1000),
        fence_writes=True)  # fmt: skip
        self.tiering = Tiering(self.table, config)
        self.replication = Replication(self.table, config, clock=time.monotonic)
        self.mover = NodeMover(
            self.table, self.tiering, timeout_s=config.node_call_timeout_s, tls=config.tls
        )
        # Nodes about to stop: no puts or copies onto them, their single-copy objects copied off.
        self.drains = Drains(self.table, self.replication)
        self.table.draining = self.replication.avoid = self.drains.draining
        self._copying: dict[str, asyncio.Task[None]] = {}
        self._releases: set[asyncio.Task[None]] = set()
        self._first_fencing: dict[str, Task[None]] = {}  # node id -> its first fence's push
        self._first_fence_after: dict[str, float] = {}  # node id -> no new push before (mono)
        self._fencing: asyncio.Task[None] | None = None  # the write-fence push in flight
        self._servicer: MasterServicer | None = None
        self._moving: dict[str, asyncio.Task[None]] = {}
        self.port: int | None = None
        self._grpc_owners_checked_s = 0.0
        self._store: MetadataStore | None = None
        self._server: grpc.aio.Server | None = None
        self._framed: FramedServer | None = None
        self._liveness: LivenessServer | None = None
        self.framed_port = 0
        self._metrics_server: MetricsServer | None = None
        self.metrics_url = ""
        self._health: health.aio.HealthServicer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self.access = AccessControl(None)
        #: Which gRPC client connections may call (--max-connections; grpc_admission.py).
        self.admission = Admission(config.max_connections, clock=time.monotonic)
        #: The local token file written at start (auth on), deleted at stop.
        self.token_file: Path | None = None

    async def start(self) -> int:
        if self.port is not None:
            return self.port
        data_dir = Path(self.config.data_dir)
        self._store = open_metadata(data_dir, self.config)
        restored = self.table.restore(self._store.load())
        owed = self.table.releases.restore(self._store.load_releases())
        self.table.restore_persistent(self._store.load_segments())
        self.table.detached.restore(self._store.load_detached())
        freeze_long_lived()
        self._store.start()
        if restored or owed:
            log.info("restored %d committed objects and %d releases owed to nodes from %s",
                     restored, owed, data_dir)  # fmt: skip
        if self.config.auth == "on":
            self.access = AccessControl(TokenAuthority(load_or_create_cluster_key(data_dir)))
            self.access.revoked.load(self._store.load_revocations())
        else:
            log.warning("authentication is OFF (--auth off): anyone who reaches %s may call",
                        self.config.host)  # fmt: skip
        cfg = self.config
        # Authentication first: a call refused for its token takes no connection place.
        interceptors: list[grpc.aio.ServerInterceptor] = [
            *([AuthInterceptor(self.access)] if self.access.enabled else []),
            ConnectionCapInterceptor(self.admission),  # --max-connections (grpc_admission.py)
        ]
        server = grpc.aio.server(
            options=[
                *server_options(cfg.max_message_bytes),
                ("grpc.max_concurrent_streams", cfg.max_calls_per_connection),
                *([("grpc.max_connection_idle_ms", int(cfg.idle_timeout_s * 1000))]
                  if cfg.idle_timeout_s > 0 else []),
                ("grpc.max_allowed_incoming_connections", hard_limit(cfg.max_connections)),
            ],
            interceptors=interceptors,
        )  # fmt: skip
        self._servicer = MasterServicer(
            self.table, self._store, self.config, self.tiering, self.replication,
            drains=self.drains, access=self.access,
        )  # fmt: skip
        registry, self.metrics = master_registry(self.table, self.tiering, self.replication)
        self._servicer.extra_counters = self.metrics.totals
        tenants = TenantServicer(
            self._servicer, self.access
        )  # each caller's keys: master/tenancy.py
        add_to_server(InstrumentedServicer(tenants, self.metrics, "grpc"), server)  # type: ignore[arg-type]
        self.mover.control_keys = self._servicer.control_keys
        self.mover.master_run = self._servicer.master_run  # nodes take fences of that run only
        self._servicer.verify_extents = self.mover.verify  # corrupt reports are checked
        self._servicer.fence_now = self._fence_now  # puts wait for released leases' room
        self._servicer.fence_soon = self._fence_soon  # a node just mounted takes its first fence
        self._servicer.first_fences = self._await_first_fences  # puts wait for it (ms)
        self._servicer.generation_floor = self.generations
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        address = join_host_port(self.config.host, self.config.port)
        tls = self.config.tls
        port = bind_grpc(server, address, tls, "master")
        self.admission.local_port = port
        await server.start()
        if self.config.liveness_port >= 0:
            self._liveness = LivenessServer(self.table.heartbeats, tls=tls, access=self.access)
            self._liveness.control_keys = self._servicer.control_keys
            self._servicer.liveness_port = self._liveness.start_remembered(
                self.config.host, self.config.liveness_port,
                Path(self.config.data_dir) / "liveness-port",
            )  # fmt: skip
        if self.config.framed_port >= 0:
            self._framed = FramedServer(
                InstrumentedServicer(tenants, self.metrics, "framed"),
                max_frame_bytes=self.config.max_message_bytes,
                tls=tls,
                max_calls_per_connection=cfg.max_calls_per_connection,
                idle_timeout_s=cfg.idle_timeout_s,
                max_connections=cfg.max_connections,
                access=self.access,
                busy_poll_s=cfg.busy_poll_s,
            )
            self.framed_port = self._servicer.framed_port = await self._framed.start(
                self.config.host, self.config.framed_port
            )
            self._servicer.framed_socket = self._framed.unix_name
            self._servicer.drop_token_connections = self._framed.drop_token
        for name in ("", SERVICE_NAME):
            await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self._metrics_server = await start_metrics(
            registry, self.config.host, self.config.metrics_port, "master"
        )
        self.metrics_url = url(self.config.host, self._metrics_server)
        self._server = server
        self._ticker = asyncio.get_running_loop().create_task(self._tick_loop())
        self.port = port
        if self.access.authority is not None:
            try:
                self.token_file = write_local_tokens(
                    self.access.authority, self.config.host, port, self.config.data_dir
                )
            except OSError as exc:
                log.warning("cannot write the local token file (%s): same-host clients need "
                            "MOONCAKE_TOKEN", exc)  # fmt: skip
        return port

    async def stop(self, grace_s: float = 2.0) -> None:
        """Stop serving (in-flight calls get `grace_s`), flush metadata, close RocksDB."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self.token_file is not None and self.port is not None:
            remove_local_tokens(self.port, self.config.data_dir)
        if self._health is not None:
            await self._health.enter_graceful_shutdown()
        if self._framed is not None:
            await self._framed.stop(grace_s)
        await server.stop(grace_s)
        if self._liveness is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._liveness.stop)
            self._liveness = None
        if self._ticker is not None:
            self._ticker.cancel()
            try:
                await self._ticker
            except asyncio.CancelledError:
                pass
        pending = [*self._moving.values(), *self._copying.values(), *self._releases]
        await asyncio.gather(*pending, return_exceptions=True)
        await self.mover.close()
        if self._store is not None:
            await self._store.close()
        if self._metrics_server is not None:
            await self._metrics_server.stop()
        self._stopped.set()

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def _tick_loop(self) -> None:
        assert self._store is not None and self._servicer is not None
        frozen_at = time.monotonic()
        while True:
            await asyncio.sleep(self.config.tick_interval_s)
            try:
                await self._tick()
            except Exception:
                log.exception("master tick failed")
            if time.monotonic() - frozen_at >= GC_FREEZE_INTERVAL_S:
                freeze_long_lived()
                frozen_at = time.monotonic()

    def _revoke_closed_grpc_owners(self) -> None:
        """Pending puts of gRPC connections the kernel no longer lists end now, as a framed
        connection's do when it closes (master/grpc_owners.py).  Once a second at most."""
        assert self._servicer is not None
        owners = self._servicer.grpc_owners
        now = time.monotonic()
        if not len(owners) or self.port is None or now < self._grpc_owners_checked_s + 1.0:
            return
        self._grpc_owners_checked_s = now
        established = read_established(self.port)
        if established is None:
            return  # no /proc/net/tcp here: those puts end by the put timeout
        for owner in owners.closed(established):
            self._servicer.connection_closed(owner)

    async def _tick(self) -> None:
        assert self._store is not None and self._servicer is not None
        result = self.table.tick()
        for info in result.suspect_nodes:
            log.warning("node %s missed heartbeats for %.1fs: suspect, not offered; its "
                        "replicas are kept for %.1fs more", info.node_id,
                        self.config.heartbeat_ttl_s, self.config.suspect_grace_s)  # fmt: skip
        for info in result.revived_nodes:
            log.warning("node %s heartbeats again: offered again, its replicas valid",
                        info.node_id)  # fmt: skip
        for info in result.dead_nodes:
            log.warning("node %s missed heartbeats for %.1fs: dropped", info.node_id,
                        self.config.heartbeat_ttl_s + self.config.suspect_grace_s)  # fmt: skip
        if result.reclaimed_puts:
            log.info("reclaimed %d puts that never ended", len(result.reclaimed_puts))
        self._revoke_closed_grpc_owners()
        self._servicer.prune_lease_stock()
        if expired := self.access.revoked.expired():  # refused as expired from now on
            await self._store.write(unrevoked=expired)
        if result.deleted_keys:
            shown = ", ".join(repr(k) for k in result.deleted_keys[:5])
            more = (
                f" and {len(result.deleted_keys) - 5} more" if len(result.deleted_keys) > 5 else ""
            )
            log.warning("deleted %d objects whose last replica was on dropped nodes: %s%s",
                        len(result.deleted_keys), shown, more)  # fmt: skip
            await self._store.write(deletes=result.deleted_keys)
        # Work per node runs in the background; a node still busy (or stalled) gets no new
        # batch, and the others are not held up by it.  A copy into NVMe is asked for, and a
        # release goes out, only once the records they rest on are durable: this tick's, and
        # those other tasks are writing now (detached.py and releases.py: a node must never
        # index what a restarted master would not know of, nor forget a block it would still
        # name).  Whatever was planned is started or called off, even if this tick fails.
        moves: list[MoveTask] = []
        copies: list[CopyTask] = []
        released: dict[int, list[tuple[int, BlockName]]] = {}
        generations: dict[int, int] = {}  # the mount each segment's releases are taken for
        failures = self._servicer.persist_failures
        durable = False
        try:
            moves = self.tiering.plan(busy=set(self._moving))
            copies = self.replication.plan(busy=set(self._copying))
            copies += self.drains.plan(busy=set(self._copying))  # nodes about to stop
            released = self.table.take_released()
            for segment_id in released:
                seg = self.table.mounted_segment(segment_id)
                generations[segment_id] = seg.generation if seg is not None else -1
            await self._servicer.persist_dirty()
            durable = await self._servicer.persisted(failures)
        finally:
            if durable:
                self._start(self._moving, self.mover.run(moves))
                self._start(self._copying, self.mover.copy(copies, self.replication))
            else:  # planned again, and sent again, at a later tick
                self._call_off(moves, copies, released, generations)
        if released and durable:  # in the background: a stalled node must not hold up the tick
            task = asyncio.get_running_loop().create_task(self.mover.release(released, generations))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)
        awaiting = self.table.awaiting_nodes()  # mounted, their first fence not taken yet
        for node_id in [n for n in self._first_fence_after if n not in awaiting]:
            del self._first_fence_after[node_id]
        if awaiting:
            self._first_fences(awaiting)
        # Write grants of puts that ended: the nodes refuse them from now on.  One push at a
        # time (a stalled node must not pile them up); what ends meanwhile goes in the next.
        fences = self.table.take_fences() if self._fencing is None else []
        if fences:
            task = asyncio.get_running_loop().create_task(self.mover.fence(fences))
            self._fencing = task
            self._releases.add(task)
            task.add_done_callback(self._fenced)

    async def _fence_now(self) -> None:
        """Push the write fences now, after the push in flight, and wait for the nodes (a put
        that gave unused allocation leases back waits for their room: service_puts.py)."""
        while self._fencing is not None:
            await asyncio.shield(self._fencing)
        fences = self.table.take_fences()
        if fences:
            task = asyncio.get_running_loop().create_task(self.mover.fence(fences))
            self._fencing = task
            self._releases.add(task)
            task.add_done_callback(self._fenced)
            await asyncio.shield(task)

    def _fence_soon(self, node_id: str) -> None:
        """Push `node_id` its first fence of this run a moment from now (a mount asks)."""
        self._first_fences([node_id], FIRST_FENCE_DELAY_S, force=True)

    def _first_fences(
        self, node_ids: Iterable[str], delay_s: float = 0.0, *, force: bool = False
    ) -> list[Task[None]]:
        """Push each of `node_ids` that awaits one its first fence of this run, on its own:
        not behind the push in flight, which one stalled node holds for seconds, and with a
        short deadline.  One in flight per node, and (unless `force`: a mount, or a put that
        found no room) none within FIRST_FENCE_RETRY_S of one the node did not take; returns
        those in flight for `node_ids`.  Two pushes in flight
        to one node are safe: it keeps the later (node/write_gate.py)."""
        tasks = []
        now = time.monotonic()
        for node_id in node_ids:
            task = self._first_fencing.get(node_id)
            if task is None and not force and now < self._first_fence_after.get(node_id, 0.0):
                continue
            if task is None:
                task = asyncio.get_running_loop().create_task(
                    self._push_first_fence(node_id, delay_s)
                )
                self._first_fencing[node_id] = task
                self._releases.add(task)
                task.add_done_callback(self._releases.discard)
                task.add_done_callback(functools.partial(self._first_fenced, node_id))
            tasks.append(task)
        return tasks

    def _first_fenced(self, node_id: str, task: Task[None]) -> None:
        if self._first_fencing.get(node_id) is task:
            del self._first_fencing[node_id]

    async def _push_first_fence(self, node_id: str, delay_s: float) -> None:
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        fences = self.table.first_fences([node_id])
        if fences:
            await self.mover.fence(fences, timeout_s=FIRST_FENCE_TIMEOUT_S)
        if self.table.awaiting_first_fence([node_id]):  # not taken: the tick pushes again
            self._first_fence_after[node_id] = time.monotonic() + FIRST_FENCE_RETRY_S
        else:
            self._first_fence_after.pop(node_id, None)

    async def _await_first_fences(
        self, node_ids: Collection[str], push: bool, *, fresh_only: bool = False
    ) -> bool:
        """Wait (FIRST_FENCE_TIMEOUT_S at most) for the first fences in flight to `node_ids`;
        `push`: push one to each that has none in flight first; `fresh_only`: only for nodes
        that let no push of it go untaken yet (one that did may be stalled: not worth a wait).
        True when there was one to wait for."""
        if fresh_only:
            node_ids = [n for n in node_ids if n not in self._first_fence_after]
        if push:
            tasks = self._first_fences(node_ids, force=True)
        else:
            tasks = [t for n in node_ids if (t := self._first_fencing.get(n)) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=FIRST_FENCE_TIMEOUT_S + FIRST_FENCE_DELAY_S)
        return bool(tasks)

    def _fenced(self, task: asyncio.Task[None]) -> None:
        self._releases.discard(task)
        if self._fencing is task:
            self._fencing = None

    def _call_off(
        self,
        moves: list[MoveTask],
        copies: list[CopyTask],
        released: dict[int, list[tuple[int, BlockName]]],
        generations: dict[int, int],
    ) -> None:
        """The records a tick's moves, copies and releases rest on did not become durable:
        none of them is asked of a node (the moves and copies end as failed, which gives
        their room back; the releases are sent at a later tick)."""
        for move in moves:
            self.tiering.complete(move, ok=False)
        for copy in copies:
            self.replication.complete(copy, ok=False)
        for segment_id, blocks in released.items():
            offsets = [offset for offset, _ in blocks]
            self.table.release_again(segment_id, offsets, generations.get(segment_id, -1))

    def _start(self, running: dict[str, asyncio.Task[None]],
               work: dict[str, Coroutine[Any, Any, None]]) -> None:  # fmt: skip
        for node_id, coro in work.items():
            task = asyncio.get_running_loop().create_task(self._then_persist(coro))
            running[node_id] = task

            def finished(done: asyncio.Task[None], node_id: str = node_id) -> None:
                if running.get(node_id) is done:
                    del running[node_id]

            task.add_done_callback(finished)

    async def _then_persist(self, coro: Coroutine[Any, Any, None]) -> None:
        assert self._servicer is not None
        await coro
        await self._servicer.persist_dirty()


async def serve(config: MasterConfig) -> None:
    """Run a master until SIGTERM/SIGINT, then shut down gracefully."""
    map_large_allocations()  # the master process holds the metadata columns: keep them compact
    server = MasterServer(config)
    port = await server.start()
    # Handlers first: a SIGTERM right after the start-up line must still stop us cleanly.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(
        f"mooncake-master listening on {config.host}:{port} (data in {config.data_dir})"
        f"{server.metrics_url}",
        flush=True,
    )
    if server.token_file is not None:
        print(
            f"auth on: processes of this uid on this host find their token in {server.token_file};"
            f" others: mooncake-admin token create --role client --tenant NAME "
            f"--data-dir {config.data_dir}",
            flush=True,
        )
    if server.framed_port:
        log.info("framed control endpoint on %s:%d", config.host, server.framed_port)
    await stop.wait()
    log.info("shutting down")
    await server.stop(config.stop_grace_s)
