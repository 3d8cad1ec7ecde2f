"""The GPU tier: one device allocation (cupy) holding a node's hottest blocks.

cupy is imported only here, and only when a node is started with --gpu-bytes.  Blocks reach
the GPU tier by promotion (the master copies the most-read DRAM blocks up) and leave it by
demotion back to DRAM at the tier's high watermark.  Reads from the GPU tier over TCP go
device-to-host into a staging buffer and out on the data path.  A client on the node's host
reads it device-to-device instead: the tier is one raw device allocation (not a pool
sub-allocation), whose CUDA IPC handle `GpuHandoff` gives to same-host processes that pass the
same credential check as the DRAM pool's hand-off (client/cuda.py opens it).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

import numpy as np

from mooncake_store.common.gpu import GPU_HELLO
from mooncake_store.common.shm_handoff import REFUSED, peer_allowed, peer_of
from mooncake_store.node.nvme import StagingBuffers

log = logging.getLogger("mooncake.node")


class GpuTier:
    def __init__(self, size_bytes: int, *, device: int = 0) -> None:
        import cupy  # the [gpu] extra; StoreNode checks gpu_count() before getting here

        self._cupy = cupy
        self.device = device
        self.size_bytes = size_bytes - size_bytes % 4096
        self.segment_id = int.from_bytes(os.urandom(8), "little") or 1
        with cupy.cuda.Device(device):
            # A raw cudaMalloc, so the IPC handle's base is the tier's offset 0.
            self._memory = cupy.cuda.memory.Memory(self.size_bytes)
            pointer = cupy.cuda.memory.MemoryPointer(self._memory, 0)
            self.array: Any = cupy.ndarray((self.size_bytes,), dtype=cupy.uint8, memptr=pointer)
            self.array.fill(0)
            self.stream = cupy.cuda.Stream(non_blocking=True)
            self.ipc_handle: bytes = bytes(cupy.cuda.runtime.ipcGetMemHandle(self._memory.ptr))
        self.staging = StagingBuffers()

    def read(self, dest: memoryview, offset: int) -> None:
        """Copy device bytes [offset, +len(dest)) into host memory `dest` (blocking)."""
        host = np.frombuffer(dest, dtype=np.uint8)
        with self._cupy.cuda.Device(self.device):
            self.array[offset : offset + len(host)].get(out=host, stream=self.stream)
            self.stream.synchronize()

    def write(self, source: memoryview, offset: int) -> None:
        """Copy host bytes `source` to the device at `offset` (blocking)."""
        host = np.frombuffer(source, dtype=np.uint8)
        with self._cupy.cuda.Device(self.device):
            self.array[offset : offset + len(host)].set(host, stream=self.stream)
            self.stream.synchronize()

    def close(self) -> None:
        self.array = None
        self._memory = None


class GpuHandoff:
    """Gives the GPU tier's CUDA IPC handle to same-host processes on `<shm name>.gpu`, under
    the DRAM hand-off's credential rule (common/shm_handoff.py)."""

    def __init__(self, shm_name: str, tier: GpuTier, *, group_gid: int | None = None) -> None:
        self._hello = GPU_HELLO.pack(tier.segment_id, tier.size_bytes, tier.device,
                                     tier.ipc_handle)  # fmt: skip
        self._uid = os.getuid()
        self._group_gid = group_gid
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + shm_name + ".gpu")
        self._sock.listen(64)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="gpu-handoff", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    allowed = peer_allowed(peer_of(conn), node_uid=self._uid,
                                           group_gid=self._group_gid)  # fmt: skip
                    conn.sendall(self._hello if allowed else REFUSED)
                except OSError as exc:
                    log.debug("GPU hand-off failed: %s", exc)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=2)
