"""The store node daemon's lifecycle: tiers, data server, shm hand-off, control, master link."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import signal
import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.common.addresses import join_host_port
from mooncake_store.common.auth import (
    ANY_NODE,
    RequestVerifier,
    Role,
    bearer,
    control_key,
    grant_key,
    node_secret_of,
    parse_claims,
)
from mooncake_store.common.credentials import discover_token
from mooncake_store.common.daemon import StartupError
from mooncake_store.common.errors import OK, AccessDeniedError, InvalidArgumentError
from mooncake_store.common.gpu import gpu_count
from mooncake_store.common.grant import WriteFence
from mooncake_store.common.grpc_options import bind_grpc, port_in_use, server_options
from mooncake_store.common.metrics import MetricsServer, start_metrics, url
from mooncake_store.common.shm_fence import FencePage
from mooncake_store.common.units import format_size
from mooncake_store.node.config import NodeConfig, resolve_node_token
from mooncake_store.node.control import NodeControl
from mooncake_store.node.data_server import DataAccess, start_data_server
from mooncake_store.node.gpu import GpuHandoff, GpuTier
from mooncake_store.node.grpc_data import DataServicer
from mooncake_store.node.master_clock import MasterClock
from mooncake_store.node.master_link import MasterLink
from mooncake_store.node.memory import available_memory_bytes, memory_problem, progress_logger
from mooncake_store.node.metrics import node_registry
from mooncake_store.node.nvme import NvmeTier
from mooncake_store.node.pool import SharedPool
from mooncake_store.node.shm_server import ShmServer
from mooncake_store.node.write_gate import OPEN

log = logging.getLogger("mooncake.node")


def _random_id() -> int:
    return int.from_bytes(os.urandom(8), "little") or 1


class StoreNode:
    """A running store node.  `start()` binds, mounts on the master and returns the data port."""

    def __init__(self, config: NodeConfig) -> None:
        if config.gpu_bytes and gpu_count() == 0:
            raise InvalidArgumentError(
                "--gpu-bytes needs a CUDA GPU and cupy (pip install 'mooncake-store[gpu]'); "
                "none is usable on this machine: start the node without --gpu-bytes"
            )
        self.config = config
        self.incarnation = _random_id()
        self.segment_id = _random_id()  # the DRAM segment: new with every process
        # Credentials: a node token's secret (grant and control keys are derived from it and
        # never sent), or, with no token (a master with --auth off), a random grant key sent
        # in the mount.
        self.token = resolve_node_token(config)
        self.secret = os.urandom(32)
        self.verifier: RequestVerifier | None = None
        self.pool: SharedPool | None = None
        self.nvme: NvmeTier | None = None
        self.gpu: GpuTier | None = None
        self.access: DataAccess | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.port: int | None = None
        self.control_port: int | None = None
        self.node_id = config.node_id
        self._io = ThreadPoolExecutor(max_workers=config.io_threads, thread_name_prefix="nvme-io")
        self._data_server: asyncio.Server | None = None
        self._shm: ShmServer | None = None
        # The write fences same-host clients check before copying (common/shm_fence.py).
        self.fence_page = FencePage()
        self._gpu_handoff: GpuHandoff | None = None
        self.control: NodeControl | None = None
        self._metrics: MetricsServer | None = None
        self.metrics_url = ""
        self._shm_name = ""
        self._grpc: grpc.aio.Server | None = None
        self._health: health.aio.HealthServicer | None = None
        self._link: MasterLink | None = None
        self._tracker: asyncio.Task[None] | None = None
        self.refused = asyncio.Event()  # the master refused this node's identity (`conflict`)
        self.conflict = ""

    async def start(self) -> int:
        if self.port is not None:
            return self.port
        cfg = self.config
        loop = asyncio.get_running_loop()
        # Pre-faulting a large pool and verifying NVMe blocks take a while: off the loop.
        problem = memory_problem(cfg.dram_bytes, available_memory_bytes())
        if problem:
            raise StartupError(problem)
        progress = progress_logger("DRAM pool", cfg.dram_bytes)
        self.pool = await loop.run_in_executor(
            None, lambda: SharedPool(cfg.dram_bytes, progress=progress)
        )
        self.access = DataAccess(self.secret, self._io)
        self.access.dram[self.segment_id] = self.pool.view
        page, segment_id = self.fence_page, self.segment_id
        self.access.gate.watcher = lambda seg, mount, pushed: (
            page.publish(mount, pushed) if seg == segment_id else None
        )  # same-host copies see every fence of the DRAM segment
        self.access.gate.clock.watcher = page.publish_clock  # and the master's clock
        self.access.gate.close(self.segment_id)  # no client writes until the mount's fence
        self._loop = loop
        inventory_note = ""
        if cfg.nvme_dir:
            self.nvme = await loop.run_in_executor(None, NvmeTier, cfg.nvme_dir, cfg.nvme_bytes)
            blocks = await loop.run_in_executor(None, self.nvme.load)
            self.access.nvme[self.nvme.segment_id] = self.nvme
            mode = "O_DIRECT" if self.nvme.direct else "buffered"
            inventory_note = f", {format_size(cfg.nvme_bytes)} NVMe ({mode}, {len(blocks)} blocks)"
        if cfg.gpu_bytes:
            self.gpu = await loop.run_in_executor(None, GpuTier, cfg.gpu_bytes)
            self.access.gpu[self.gpu.segment_id] = self.gpu
            inventory_note += f", {format_size(cfg.gpu_bytes)} GPU"
        tls = cfg.tls
        try:
            self._data_server = await start_data_server(
                self.access, cfg.host, cfg.port, tls.server_context() if tls.serves else None
            )
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
            raise port_in_use("node's data port", join_host_port(cfg.host, cfg.port)) from exc
        self.port = self._data_server.sockets[0].getsockname()[1]
        self.node_id = cfg.node_id or f"{socket.gethostname()}:{self.port}"
        if self.token:
            self._adopt_token(self.token)
        self._shm_name = f"mooncake-{os.getpid()}-{self.segment_id:016x}"
        self._shm = ShmServer(
            self._shm_name, self.pool.fd, self.segment_id, cfg.dram_bytes,
            group_gid=cfg.shm_group_gid, fence_fd=self.fence_page.fd,
        )  # fmt: skip
        self._shm.start()
        if self.gpu is not None:  # same-host readers copy GPU-tier blocks device to device
            self._gpu_handoff = GpuHandoff(self._shm_name, self.gpu, group_gid=cfg.shm_group_gid)

        self._grpc = grpc.aio.server(options=server_options(cfg.grpc_max_message_bytes))
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        control = self.control = NodeControl(
            self.access.dram, self.access.nvme, self.access.gpu, self._io,
            tls=tls.client_context() if tls.serves else None, gate=self.access.gate,
            verifier=self.verifier, fetch_timeout_s=cfg.fetch_timeout_s,
        )  # fmt: skip
        pb_grpc.add_NodeServiceServicer_to_server(control, self._grpc)
        self.data_service = DataServicer(self.access)  # issue 15: the data path over gRPC
        pb_grpc.add_DataServiceServicer_to_server(self.data_service, self._grpc)
        control_address = join_host_port(cfg.host, cfg.control_port)
        self.control_port = bind_grpc(self._grpc, control_address, tls, "node's control port")
        await self._grpc.start()
        await self._health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        self.description = (
            f"{format_size(cfg.dram_bytes)} DRAM{inventory_note}: "
            f"data {join_host_port(cfg.advertised_host, self.port)}, "
            f"control {join_host_port(cfg.advertised_host, self.control_port)}"
        )

        self._metrics = await start_metrics(node_registry(self), cfg.host, cfg.metrics_port, "node")
        self.metrics_url = url(cfg.host, self._metrics)
        token = bearer(self.token) if self.token else ""
        secret = node_secret_of(self.token) if self.token else b""
        self._link = MasterLink(
            cfg.master, self._mount_request, tls=tls, token=token, node_secret=secret,
            max_message_bytes=cfg.master_max_message_bytes,
            call_timeout_s=cfg.master_call_timeout_s,
            unmount_timeout_s=cfg.unmount_timeout_s, mount_timeout_s=cfg.mount_timeout_s,
            on_fences=self._take_fences, on_mounting=self._mounting,
            on_master_time=self.access.gate.clock.observe if self.access is not None else None,
            time_key=lambda: self.verifier.key if self.verifier is not None else None,
        )  # fmt: skip
        link = self._link
        self.control.master_run = lambda: link.master_run  # FenceWrites from that run only
        if self.token:  # found while the link built its first mount request
            self._link.set_token(bearer(self.token), node_secret_of(self.token))
        if not await loop.run_in_executor(None, self._link.mount, cfg.mount_timeout_s):
            refusal = self._link.refusal
            if refusal:
                await self.stop(unmount=False)
                raise StartupError(f"master {cfg.master} refused the mount: {refusal}")
            log.warning("master %s unreachable; will keep trying to mount", cfg.master)
        if self.access is not None:  # same-host clients see a stale reading at once
            self.access.gate.clock.start_watching()
        self._link.start()
        self._tracker = loop.create_task(self._track_mount())
        return self.port

    def _mounting(self, on: bool) -> None:
        """The master link's hook around a mount again: same-host copies stop meanwhile."""
        if self.access is not None:
            self.access.gate.mounting(self.segment_id, on)

    def _take_fences(self, fences: Sequence[pb.WriteFence] | None, signature: str) -> bool:
        """The master link's hook (on its thread): close the DRAM segment to writes before
        mounting afresh (None), or take the fence a mount reply gives it; the seals of the
        generations it ends are dropped on the event loop.  With a node token the fences must
        carry the master's signature (as FenceWrites must), or the segment stays closed; with
        none (--auth off) a reply without a fence for the segment opens it.  False: the fences
        were not taken (the link mounts again)."""
        access, loop = self.access, self._loop
        if access is None:
            return True
        if fences is None:
            access.gate.close(self.segment_id)
            return True
        mine = next((f for f in fences if f.segment_id == self.segment_id), None)
        if self.verifier is not None:
            body = pb.FenceWritesRequest(fences=fences).SerializeToString(deterministic=True)
            try:
                self.verifier.verify("MountFences", body, signature)
            except AccessDeniedError as exc:
                log.error("the mount reply's write fences are not the master's (%s): client "
                          "writes stay refused until a mount gives signed ones", exc)  # fmt: skip
                access.gate.close(self.segment_id)  # its master may hand the room out afresh
                return False
            if mine is None:
                log.error("the mount reply has no write fence for this node's DRAM segment: "
                          "client writes stay refused until a mount gives one")  # fmt: skip
                access.gate.close(self.segment_id)
                return False
        fence = OPEN if mine is None else WriteFence(mine.floor, frozenset(mine.open))
        access.gate.mounted(self.segment_id, fence)
        if loop is not None:
            try:
                loop.call_soon_threadsafe(
                    access.gate.prune, self.segment_id, access.gate.clock.now_ms()
                )
            except RuntimeError:  # the loop closed: the node is stopping
                pass
        return True

    def _adopt_token(self, token: str) -> None:
        """Take `token` as this node's credential: derive this incarnation's grant key (the
        data path checks grants with it) and control key (Fetch/Move/Release must be signed
        with it) from its node secret, and present its bearer part to the master.

        Raises:
            InvalidArgumentError: the token is bound to another node id.
        """
        claims = parse_claims(token)
        if claims.node_id not in (self.node_id, ANY_NODE):
            raise InvalidArgumentError(
                f"the node token is bound to node id {claims.node_id!r}, but this node runs "
                f"as {self.node_id!r}: pass --node-id {claims.node_id}"
            )
        node_secret = node_secret_of(token)
        self.token = token
        self.secret = grant_key(node_secret, self.node_id, self.incarnation)
        # Control requests are stamped with the master's wall clock: checked against the
        # master's clock as this node follows it (master_clock.py), not the node's own.
        clock = self.access.gate.clock if self.access is not None else MasterClock()
        self.verifier = RequestVerifier(
            control_key(node_secret, self.node_id, self.incarnation),
            clock=lambda: clock.now_ms() / 1000,
        )
        if self.access is not None:
            self.access.secret = self.secret
        if self.control is not None:
            self.control.verifier = self.verifier
        if self._link is not None:
            self._link.set_token(bearer(token), node_secret)

    def _find_token(self) -> None:
        """A node without a token that started before its master (on the master's host) looks
        again, before each mount, for the node token the master's local token file holds."""
        if self.token or self.config.token_file:
            return
        found = discover_token(self.config.master, Role.NODE)
        if not found:
            return
        try:
            self._adopt_token(found)
        except (AccessDeniedError, InvalidArgumentError) as exc:
            log.error("ignoring the node token found for %s: %s", self.config.master, exc)
            return
        log.info("found a node token for master %s", self.config.master)

    def _mount_request(self) -> pb.MountSegmentRequest:
        """What the node mounts: its DRAM segment, and its NVMe segment with the inventory."""
        self._find_token()
        cfg = self.config
        segments = [pb.SegmentSpec(segment_id=self.segment_id, tier="DRAM",
                                   size_bytes=cfg.dram_bytes)]  # fmt: skip
        if self.nvme is not None:
            inventory = [
                pb.InventoryItem(key=b.key, offset=b.offset, size_bytes=b.size_bytes,
                                 checksum=b.checksum, fingerprint=b.fingerprint,
                                 parent_key=b.parent_key, tag=b.tag)
                for b in self.nvme.load_index()
            ]  # fmt: skip
            segments.append(
                pb.SegmentSpec(
                    segment_id=self.nvme.segment_id,
                    tier="NVME",
                    size_bytes=self.nvme.size_bytes,
                    inventory=inventory,
                )
            )
        if self.gpu is not None:
            segments.append(pb.SegmentSpec(segment_id=self.gpu.segment_id, tier="GPU",
                                           size_bytes=self.gpu.size_bytes))  # fmt: skip
        return pb.MountSegmentRequest(
            node_id=self.node_id,
            incarnation=self.incarnation,
            endpoint=join_host_port(cfg.advertised_host, self.port or 0),
            shm_socket=self._shm_name,
            control_endpoint=join_host_port(cfg.advertised_host, self.control_port or 0),
            secret=b"" if self.token else self.secret,  # with a token: derived, never sent
            segments=segments,
            generation_seen=self.access.gate.generation_seen if self.access is not None else 0,
        )

    async def _track_mount(self) -> None:
        """Report SERVING on the health service once (and while) the node is mounted."""
        serving = None
        while self._link is not None and self._health is not None:
            if self._link.conflict:  # another live node took this id: stop, do not fight
                self.conflict = self._link.conflict
                self.refused.set()
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

    @property
    def shm(self) -> ShmServer | None:
        return self._shm

    @property
    def link(self) -> MasterLink | None:
        return self._link

    def tier_sizes(self) -> dict[str, int]:
        """Bytes of each tier this node serves."""
        sizes = {"DRAM": self.config.dram_bytes}
        if self.nvme is not None:
            sizes["NVME"] = self.nvme.size_bytes
        if self.gpu is not None:
            sizes["GPU"] = self.gpu.size_bytes
        return sizes

    async def wait_mounted(self) -> None:
        """Return once the node is mounted on the master (the link keeps retrying until then)."""
        warned = False
        while self._link is not None and not self._link.mounted.is_set():
            if not warned:
                log.warning("not serving yet: waiting to mount on master %s", self.config.master)
                warned = True
            await asyncio.sleep(0.05)

    async def drain(self, timeout_s: float) -> int | None:
        """Have the master copy the blocks whose only replica is on this node to other nodes,
        waiting up to `timeout_s` (the node keeps serving meanwhile: it is the copies' source).

        Returns how many such blocks are left (0: all saved), None when the master could not
        be asked.  Gives up early when nothing moves for --drain-stall (no other node can
        take the blocks).  Logs the outcome either way.
        """
        link, cfg = self._link, self.config
        if link is None or timeout_s <= 0 or not link.mounted.is_set():
            return None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        progress_at, last = loop.time(), (-1, -1)
        while True:
            try:
                reply = await loop.run_in_executor(None, link.drain, cfg.drain_call_timeout_s)
            except grpc.RpcError as exc:
                log.warning("drain: cannot ask the master (%s); blocks whose only replica is "
                            "here are lost with this node", exc.code().name)  # fmt: skip
                return None
            if reply.status.code != OK:
                log.warning("drain refused by the master: %s", reply.status.message)
                return None
            remaining, now = int(reply.remaining), loop.time()
            if remaining == 0:
                log.info("drained: %d blocks copied to other nodes, none left only here",
                         reply.saved)  # fmt: skip
                return 0
            if (remaining, reply.saved) != last or reply.copying:
                progress_at, last = now, (remaining, int(reply.saved))
            stalled = now - progress_at >= cfg.drain_stall_s
            if now >= deadline or stalled:
                why = (
                    "no other node can take them" if stalled else f"--drain-timeout {timeout_s:g}s"
                )
                log.warning("drain incomplete (%s): %d blocks whose only replica is here could not "
                            "be saved (%d copied)", why, remaining, reply.saved)  # fmt: skip
                return remaining
            await asyncio.sleep(0.1)

    async def stop(self, *, unmount: bool = True) -> None:
        """Unmount from the master, stop serving, release the tiers (idempotent)."""
        loop = asyncio.get_running_loop()
        link, self._link = self._link, None
        if self._tracker is not None:
            self._tracker.cancel()
            self._tracker = None
        if link is not None:
            await loop.run_in_executor(None, lambda: link.stop(unmount=unmount))
        if self.access is not None:
            await loop.run_in_executor(None, self.access.gate.clock.stop_watching)
        if self._metrics is not None:
            await self._metrics.stop()
            self._metrics = None
        if self._grpc is not None:
            await self._grpc.stop(0.5)
            self._grpc = None
        if self._shm is not None:
            self._shm.close()
            self._shm = None
        if self._gpu_handoff is not None:
            self._gpu_handoff.close()
            self._gpu_handoff = None
        if self._data_server is not None:
            self._data_server.close()
            await self._data_server.wait_closed()
            self._data_server = None
        self._io.shutdown(wait=True)
        if self.nvme is not None:
            self.nvme.close()
            self.nvme = None
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        self.fence_page.close()


async def serve(config: NodeConfig) -> None:
    """Run a store node until SIGTERM/SIGINT, then unmount and shut down gracefully."""
    node = StoreNode(config)
    await node.start()
    # Handlers first: a SIGTERM right after the start-up line must still stop us cleanly.
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopped = loop.create_task(stop.wait())
    mounted = loop.create_task(node.wait_mounted())
    await asyncio.wait([stopped, mounted], return_when="FIRST_COMPLETED")
    if not mounted.done():  # SIGTERM/SIGINT while still waiting for the master: nothing to drain
        mounted.cancel()
        log.info("stopped before mounting on master %s", config.master)
        await node.stop(unmount=False)
        return
    print(
        f"mooncake-store node {node.node_id} serving {node.description}, master {config.master}"
        f"{node.metrics_url}",
        flush=True,
    )
    refused = loop.create_task(node.refused.wait())
    await asyncio.wait([stopped, refused], return_when="FIRST_COMPLETED")
    if refused.done():  # another live node holds this node's id (after a master restart)
        await node.stop(unmount=False)
        raise StartupError(f"master {config.master} refused this node: {node.conflict}")
    log.info("shutting down")
    await node.drain(config.drain_timeout_s)
    await node.stop()
