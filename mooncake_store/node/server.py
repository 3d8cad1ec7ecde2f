"""The store node daemon's lifecycle: pool, data server, shm hand-off, health, master link."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.units import format_size
from mooncake_store.node.config import NodeConfig
from mooncake_store.node.data_server import DataAccess, start_data_server
from mooncake_store.node.master_link import MasterLink
from mooncake_store.node.pool import SharedPool
from mooncake_store.node.shm_server import ShmServer

log = logging.getLogger("mooncake.node")


class StoreNode:
    """A running store node.  `start()` binds, mounts on the master and returns the data port."""

    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.segment_id = int.from_bytes(os.urandom(8), "little") or 1
        self.secret = os.urandom(32)
        self.pool: SharedPool | None = None
        self.access: DataAccess | None = None
        self.port: int | None = None
        self.health_port: int | None = None
        self.node_id = config.node_id
        self._data_server: asyncio.Server | None = None
        self._shm: ShmServer | None = None
        self._health_server: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._link: MasterLink | None = None
        self._tracker: asyncio.Task[None] | None = None

    async def start(self) -> int:
        if self.port is not None:
            return self.port
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Pre-faulting a large pool takes a while: keep the loop responsive meanwhile.
        self.pool = await loop.run_in_executor(None, SharedPool, cfg.dram_bytes)
        self.access = DataAccess(self.pool.view, self.segment_id, self.secret)
        self._data_server = await start_data_server(self.access, cfg.host, cfg.port)
        self.port = self._data_server.sockets[0].getsockname()[1]
        self.node_id = cfg.node_id or f"{socket.gethostname()}:{self.port}"
        shm_name = f"mooncake-{os.getpid()}-{self.segment_id:016x}"
        self._shm = ShmServer(shm_name, self.pool.fd, self.segment_id, cfg.dram_bytes)
        self._shm.start()

        self._health_server = grpc.aio.server()
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._health_server)
        self.health_port = self._health_server.add_insecure_port(f"{cfg.host}:{cfg.health_port}")
        await self._health_server.start()
        await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)

        mount = pb.MountSegmentRequest(
            node_id=self.node_id,
            segment_id=self.segment_id,
            endpoint=f"{cfg.host}:{self.port}",
            shm_socket=shm_name,
            size_bytes=cfg.dram_bytes,
            secret=self.secret,
            tier="DRAM",
        )
        self._link = MasterLink(cfg.master, mount)
        if not await loop.run_in_executor(None, self._link.mount, cfg.mount_timeout_s):
            log.warning("master %s unreachable; will keep trying to mount", cfg.master)
        self._link.start()
        self._tracker = loop.create_task(self._track_mount())
        return self.port

    async def _track_mount(self) -> None:
        """Report SERVING on the health service once (and while) the segment is mounted."""
        serving = None
        while self._link is not None and self._health is not None:
            now = self._link.mounted.is_set()
            if now != serving:
                status = (
                    health_pb2.HealthCheckResponse.SERVING
                    if now
                    else health_pb2.HealthCheckResponse.NOT_SERVING
                )
                await self._health.set("", status)
                serving = now
            await asyncio.sleep(0.2)

    async def stop(self, *, unmount: bool = True) -> None:
        """Unmount from the master, stop serving, release the pool (idempotent)."""
        loop = asyncio.get_running_loop()
        link, self._link = self._link, None
        if self._tracker is not None:
            self._tracker.cancel()
            self._tracker = None
        if link is not None:
            await loop.run_in_executor(None, lambda: link.stop(unmount=unmount))
        if self._health_server is not None:
            await self._health_server.stop(0.5)
            self._health_server = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if self._data_server is not None:
            self._data_server.close()
            await self._data_server.wait_closed()
            self._data_server = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None


async def serve(config: NodeConfig) -> None:
    """Run a store node until SIGTERM/SIGINT, then unmount and shut down gracefully."""
    node = StoreNode(config)
    port = await node.start()
    print(
        f"mooncake-store node {node.node_id} serving {format_size(config.dram_bytes)} DRAM: "
        f"data {config.host}:{port}, health {config.host}:{node.health_port}, "
        f"master {config.master}",
        flush=True,
    )
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await node.stop()
