"""The CUDA data path of a same-host client: DMA between a node's pool and device memory.

- **Pool <-> device.** A same-host client maps each node's DRAM pool (a memfd) once.  The first
  time a device buffer meets a pool, the mapping is registered as pinned memory
  (`cudaHostRegister`, once per pool, undone before the pool is unmapped), so `get_into` of a
  cupy array is one `cudaMemcpyAsync` pool -> device and `put_from` one device -> pool, at the
  PCIe limit (~45-53 GB/s on an H200 against ~13 from pageable memory).
- **Verification overlapped with the DMA.** A read hashes the pool's chunks of the object
  (common/checksum.py: 1 MiB chunks hashed independently) on a thread pool while the copy engine
  moves them; the bytes are under the read's lease, so the source the DMA reads is the source
  hashed, and the lease is checked to be still running when both are done (the extent cannot
  have been reused during the copy).  A write moves the value device -> pool in pieces, each
  followed by a CUDA event, and the threads hash each piece of the pool as soon as its event
  fires.
- **GPU tier over CUDA IPC.** A node with a GPU tier exports an IPC handle of the tier's
  device allocation on its hand-off socket (`<shm socket>.gpu`).  A same-host reader opens it
  once and copies device -> device; the delivered bytes are verified by copying them back to
  pinned host memory in pieces hashed on the thread pool as they land.

cupy is imported only when this module is used (a device buffer showed up); without a GPU
nothing here runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mooncake_store.common.checksum import CHUNK_BYTES, checksum_parallel, chunk_digest, combine
from mooncake_store.common.gpu import GPU_HELLO
from mooncake_store.common.grant import grant_expires_ms

log = logging.getLogger("mooncake.client")

_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind
_PIECE = 2 * CHUNK_BYTES  # DMA pieces verified as they land: the last one's hash is the tail


def _workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))


def _ptr(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class CudaPath:
    """Registered pools, opened GPU tiers and the verification threads of one client."""

    def __init__(self, workers: int | None = None) -> None:
        import cupy

        self._cupy = cupy
        self._rt = cupy.cuda.runtime
        self.workers = workers or _workers()
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="mooncake-verify")
        self._registered: dict[int, tuple[int, int]] = {}  # segment id -> (base, size)
        self._tiers: dict[int, int] = {}  # GPU segment id -> opened IPC base pointer
        self._no_tier: set[str] = set()  # hand-off sockets without a GPU tier to share
        self._lock = threading.Lock()
        self._local = threading.local()  # a CUDA stream per thread
        self.counters = {"dma_reads": 0, "dma_writes": 0, "ipc_reads": 0}

    # ---- pools ------------------------------------------------------------------------------

    def register(self, segment_id: int, pool: memoryview) -> int:
        """The base address of `pool`, registered with CUDA as pinned memory (once)."""
        entry = self._registered.get(segment_id)
        if entry is not None:
            return entry[0]
        with self._lock:
            entry = self._registered.get(segment_id)
            if entry is None:
                base = _ptr(pool)
                self._rt.hostRegister(base, len(pool), 0)  # cudaHostRegisterDefault
                entry = self._registered[segment_id] = (base, len(pool))
        return entry[0]

    def unregister(self, segment_id: int) -> None:
        """Undo `register` (call before the pool is unmapped)."""
        with self._lock:
            entry = self._registered.pop(segment_id, None)
        if entry is not None:
            try:
                self._rt.hostUnregister(entry[0])
            except Exception as exc:  # a dying context at exit: nothing left to undo
                log.debug("cudaHostUnregister failed: %s", exc)

    def _stream(self) -> Any:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            # A blocking stream: it waits for work queued on the legacy default stream (where
            # cupy puts the caller's kernels unless told otherwise) before copying a buffer.
            stream = self._local.stream = self._cupy.cuda.Stream(non_blocking=False)
        return stream

    def read_pool(
        self, dev: Any, segment_id: int, pool: memoryview, offset: int, size: int, grant: bytes
    ) -> int | None:
        """DMA pool[offset:+size] into device array `dev` and return the checksum of those
        bytes, hashed in parallel with the copy; None when the read lease ran out before the
        copy was done (then nothing can be said of the bytes: read again)."""
        base = self.register(segment_id, pool)
        stream = self._stream()
        self._rt.memcpyAsync(dev.data.ptr, base + offset, size, _H2D, stream.ptr)
        try:
            digest = checksum_parallel(pool[offset : offset + size], self._pool, self.workers)
        finally:
            stream.synchronize()
        expires_ms = grant_expires_ms(grant)
        if expires_ms is not None and time.time() * 1000 >= expires_ms:
            return None
        self.counters["dma_reads"] += 1
        return digest

    def write_pool(self, dev: Any, segment_id: int, pool: memoryview, offset: int) -> int:
        """DMA device array `dev` into pool[offset:] in pieces and return the checksum of the
        bytes that landed, each piece hashed on the thread pool once its copy is done."""
        size = int(dev.nbytes)
        base = self.register(segment_id, pool)
        stream = self._stream()
        dest = pool[offset : offset + size]
        if size <= _PIECE:
            self._rt.memcpyAsync(base + offset, dev.data.ptr, size, _D2H, stream.ptr)
            stream.synchronize()
            self.counters["dma_writes"] += 1
            return checksum_parallel(dest, self._pool, self.workers)
        pieces = []
        for start in range(0, size, _PIECE):
            n = min(_PIECE, size - start)
            self._rt.memcpyAsync(base + offset + start, dev.data.ptr + start, n, _D2H, stream.ptr)
            pieces.append((stream.record(), start, start + n))
        digests = self._hash_as_landed(pieces, dest)
        self.counters["dma_writes"] += 1
        return combine(digests, size)

    # ---- the GPU tier over CUDA IPC ---------------------------------------------------------

    def open_tier(self, shm_socket: str, segment_id: int) -> int | None:
        """The device address of a same-host node's GPU tier (opened once), or None."""
        base = self._tiers.get(segment_id)
        if base is not None or not shm_socket or shm_socket in self._no_tier:
            return base
        hello = _ask_tier(shm_socket)
        if hello is None:
            self._no_tier.add(shm_socket)
            return None
        got_segment, _size, device, handle = hello
        if got_segment != segment_id or device != self._cupy.cuda.Device().id:
            return None
        with self._lock:
            base = self._tiers.get(segment_id)
            if base is None:
                base = self._tiers[segment_id] = int(self._rt.ipcOpenMemHandle(handle))
        return base

    def read_tier(
        self, dev: Any, tier_base: int, offset: int, size: int, grant: bytes
    ) -> int | None:
        """Copy a GPU-tier block device -> device into `dev`, then verify what landed: copied
        back to pinned host memory in pieces, each hashed as soon as it is there.  Returns the
        checksum, or None when the lease ran out first."""
        stream = self._stream()
        self._rt.memcpyAsync(dev.data.ptr, tier_base + offset, size, _D2D, stream.ptr)
        host = self._pinned(size)
        pieces = []
        for start in range(0, size, _PIECE):
            n = min(_PIECE, size - start)
            self._rt.memcpyAsync(host.ctypes.data + start, dev.data.ptr + start, n, _D2H,
                                 stream.ptr)  # fmt: skip
            pieces.append((stream.record(), start, start + n))
        digests = self._hash_as_landed(pieces, memoryview(host.data)[:size])
        expires_ms = grant_expires_ms(grant)
        if expires_ms is not None and time.time() * 1000 >= expires_ms:
            return None
        self.counters["ipc_reads"] += 1
        return combine(digests, size)

    def _hash_as_landed(self, pieces: list[tuple[Any, int, int]], view: memoryview) -> list[int]:
        """Chunk digests of `view`, each chunk hashed on the thread pool as soon as the CUDA
        event of its piece fires.  Only this thread waits on events (a waiting thread spins)."""
        jobs = []
        try:
            for event, start, stop in pieces:
                event.synchronize()
                jobs += [self._pool.submit(chunk_digest, view[c : min(c + CHUNK_BYTES, stop)])
                         for c in range(start, stop, CHUNK_BYTES)]  # fmt: skip
        finally:
            self._stream().synchronize()
        return [job.result() for job in jobs]

    def _pinned(self, size: int) -> np.ndarray:
        buf = getattr(self._local, "pinned", None)
        if buf is None or buf.nbytes < size:
            memory = self._cupy.cuda.alloc_pinned_memory(max(size, CHUNK_BYTES))
            buf = self._local.pinned = np.frombuffer(memory, dtype=np.uint8)
        return buf

    def close(self) -> None:
        for segment_id in list(self._registered):
            self.unregister(segment_id)
        for base in self._tiers.values():
            try:
                self._rt.ipcCloseMemHandle(base)
            except Exception as exc:
                log.debug("cudaIpcCloseMemHandle failed: %s", exc)
        self._tiers.clear()
        self._pool.shutdown(wait=False)


def _ask_tier(shm_socket: str) -> tuple[int, int, int, bytes] | None:
    """The GPU tier a same-host node shares (segment id, size, device, IPC handle), or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    try:
        sock.connect("\0" + shm_socket + ".gpu")
        msg = b""
        while len(msg) < GPU_HELLO.size:
            piece = sock.recv(GPU_HELLO.size - len(msg))
            if not piece:
                return None
            msg += piece
    except OSError:
        return None
    finally:
        sock.close()
    segment_id, size, device, handle = GPU_HELLO.unpack(msg)
    return segment_id, size, device, handle


_PATH: CudaPath | None = None
_PATH_LOCK = threading.Lock()


def cuda_path() -> CudaPath:
    """The process's CudaPath (one set of registrations and threads for every client)."""
    global _PATH
    if _PATH is None:
        with _PATH_LOCK:
            if _PATH is None:
                _PATH = CudaPath()
    return _PATH


def forget_pool(segment_id: int) -> None:
    """What ShmMapper calls before it unmaps a pool: undo its CUDA registration, if any."""
    if _PATH is not None:
        _PATH.unregister(segment_id)
