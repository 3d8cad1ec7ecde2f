"""The CUDA data path of a same-host client: DMA between a node's pool and device memory.

- **Pool <-> device.** A same-host client maps each node's DRAM pool (a memfd) once.  The first
  time a device buffer meets a pool, the mapping is registered as pinned memory
  (`cudaHostRegister`, once per pool, undone before the pool is unmapped), so `get_into` of a
  cupy array is one `cudaMemcpyAsync` pool -> device and `put_from` one device -> pool, at the
  PCIe limit (~45-53 GB/s on an H200 against ~13 from pageable memory).
- **Verification on the GPU** (`verify="gpu"`, the default where it passes its self-test).
  A read DMAs pool -> device, then the GPU computes the chunk digests of the *device* buffer
  (client/gpu_checksum.py, client/xxh3_gpu.cu) on the same stream; the host combines them and
  compares with the stored checksum.  A write launches the same kernels over the device value
  on a second stream while the copy engine moves it device -> pool.  The lease is checked to
  be still running when the copy and the check are done (the extent cannot have been reused).
- **Verification on CPU threads** (`verify="cpu"`, the fallback, and where the kernels cannot
  be built or disagree with xxhash on this device).  A read hashes the pool's chunks of the
  object (common/checksum.py: 1 MiB chunks hashed independently) on a thread pool while the
  copy engine moves them; the bytes are under the read's lease, so the source the DMA reads is
  the source hashed.  A write moves the value device -> pool in pieces, each followed by a CUDA
  event, and the threads hash each piece of the pool as soon as its event fires.
  `MOONCAKE_GPU_VERIFY=auto|gpu|cpu` picks the mode for the process (`auto`: the GPU when its
  self-test passes); `cuda_path().verify` can be set at run time (scripts/bench_gpu.py).
- **GPU tier over CUDA IPC.** A node with a GPU tier exports an IPC handle of the tier's
  device allocation on its hand-off socket (`<shm socket>.gpu`).  A same-host reader opens it
  once and copies device -> device; the delivered bytes are verified on the GPU (or, on CPU
  threads, by copying them back to pinned host memory in pieces hashed as they land).

cupy is imported only when this module is used (a device buffer showed up); without a GPU
nothing here runs.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from mooncake_store.client.gpu_checksum import GpuChecksum
from mooncake_store.common.checksum import CHUNK_BYTES, checksum_parallel, chunk_digest, combine
from mooncake_store.common.gpu import GPU_HELLO
from mooncake_store.common.grant import grant_expires_ms

log = logging.getLogger("mooncake.client")

_H2D, _D2H, _D2D = 1, 2, 3  # cudaMemcpyKind
_PIECE = 2 * CHUNK_BYTES  # DMA pieces verified as they land: the last one's hash is the tail
VERIFY_MODES = ("auto", "gpu", "cpu")


def _wall_ms() -> float:
    return time.time() * 1000


def verify_mode_from_env() -> str:
    """MOONCAKE_GPU_VERIFY (auto, gpu or cpu; auto when unset)."""
    mode = os.environ.get("MOONCAKE_GPU_VERIFY", "auto").strip().lower() or "auto"
    if mode not in VERIFY_MODES:
        raise ValueError(f"MOONCAKE_GPU_VERIFY must be one of {', '.join(VERIFY_MODES)}, "
                         f"not {mode!r}")  # fmt: skip
    return mode


def _workers() -> int:
    return max(1, min(16, (os.cpu_count() or 2) - 1))


def _ptr(view: memoryview) -> int:
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


class CudaPath:
    """Registered pools, opened GPU tiers and the verification threads of one client."""

    def __init__(self, workers: int | None = None, verify: str = "auto") -> None:
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
        self.counters = {"dma_reads": 0, "dma_writes": 0, "ipc_reads": 0, "gpu_verified": 0}
        if verify not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {verify!r}")
        self._mode = verify
        self._gpu: GpuChecksum | None = None

    # ---- which side verifies ----------------------------------------------------------------

    @property
    def verify(self) -> str:
        """Who computes the checksum of a device buffer: "gpu" or "cpu" (see the module
        docstring); "auto" until the first device buffer settles it."""
        return self._mode

    @verify.setter
    def verify(self, mode: str) -> None:
        if mode not in VERIFY_MODES:
            raise ValueError(f"verify must be one of {', '.join(VERIFY_MODES)}, not {mode!r}")
        self._mode = mode

    def gpu_checksum(self) -> GpuChecksum | None:
        """The GPU checksum when this path verifies on the GPU, built and self-tested once."""
        if self._mode == "cpu":
            return None
        if self._gpu is None:
            with self._lock:
                if self._gpu is None:
                    try:
                        gpu = GpuChecksum()
                        gpu.self_test()
                    except Exception as exc:
                        if self._mode == "gpu":
                            raise
                        log.warning("checksums of device buffers stay on CPU threads: the GPU "
                                    "checksum is not usable here (%s)", exc)  # fmt: skip
                        self._mode = "cpu"
                        return None
                    self._gpu = gpu
                    self._mode = "gpu"
        return self._gpu

    def _hash_stream(self) -> Any:
        stream = getattr(self._local, "hash_stream", None)
        if stream is None:
            stream = self._local.hash_stream = self._cupy.cuda.Stream(non_blocking=False)
        return stream

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

    def stream(self) -> Any:
        """This thread's CUDA stream for copies (a blocking one, see `_stream`)."""
        return self._stream()

    def _stream(self) -> Any:
        stream = getattr(self._local, "stream", None)
        if stream is None:
            # A blocking stream: it waits for work queued on the legacy default stream (where
            # cupy puts the caller's kernels unless told otherwise) before copying a buffer.
            stream = self._local.stream = self._cupy.cuda.Stream(non_blocking=False)
        return stream

    def read_pool(
        self,
        dev: Any,
        segment_id: int,
        pool: memoryview,
        offset: int,
        size: int,
        grant: bytes,
        now_ms: Callable[[], float] = _wall_ms,
    ) -> int | None:
        """DMA pool[offset:+size] into device array `dev` and return the checksum: of the bytes
        on the device, computed by the GPU after the copy (verify "gpu"), or of the pool's
        bytes, hashed on CPU threads during the copy ("cpu").  None when the read lease ran out
        before the copy was done (then nothing can be said of the bytes: read again).  The
        caller compares it with the stored checksum; on a mismatch `dev` holds undefined
        bytes."""
        base = self.register(segment_id, pool)
        stream = self._stream()
        gpu = self.gpu_checksum()
        self._rt.memcpyAsync(dev.data.ptr, base + offset, size, _H2D, stream.ptr)
        if gpu is not None:  # the digests of what landed on the device, after the copy
            try:
                pending = gpu.enqueue(dev, stream)
            finally:
                stream.synchronize()
            digest = pending.result()
            self.counters["gpu_verified"] += 1
        else:
            try:
                digest = checksum_parallel(pool[offset : offset + size], self._pool, self.workers)
            finally:
                stream.synchronize()
        if _lease_over(grant, now_ms):
            return None
        self.counters["dma_reads"] += 1
        return digest

    def write_pool(self, dev: Any, segment_id: int, pool: memoryview, offset: int) -> int:
        """DMA device array `dev` into pool[offset:] and return the checksum to store: of the
        device value, computed by the GPU while the copy runs ("gpu"; a copy that went wrong
        then fails every read's check, it is never returned), or of the bytes that landed in
        the pool, each 2 MiB piece hashed on CPU threads once its copy is done ("cpu")."""
        size = int(dev.nbytes)
        base = self.register(segment_id, pool)
        stream = self._stream()
        dest = pool[offset : offset + size]
        gpu = self.gpu_checksum()
        if gpu is not None:  # the GPU hashes the value while the copy engine moves it
            hash_stream = self._hash_stream()
            try:
                pending = gpu.enqueue(dev, hash_stream)
                self._rt.memcpyAsync(base + offset, dev.data.ptr, size, _D2H, stream.ptr)
            finally:
                stream.synchronize()
                hash_stream.synchronize()
            self.counters["dma_writes"] += 1
            self.counters["gpu_verified"] += 1
            return pending.result()
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
        self,
        dev: Any,
        tier_base: int,
        offset: int,
        size: int,
        grant: bytes,
        now_ms: Callable[[], float] = _wall_ms,
    ) -> int | None:
        """Copy a GPU-tier block device -> device into `dev`, then verify what landed: copied
        back to pinned host memory in pieces, each hashed as soon as it is there.  Returns the
        checksum, or None when the lease ran out first."""
        stream = self._stream()
        self._rt.memcpyAsync(dev.data.ptr, tier_base + offset, size, _D2D, stream.ptr)
        gpu = self.gpu_checksum()
        if gpu is not None:
            try:
                pending = gpu.enqueue(dev, stream)
            finally:
                stream.synchronize()
            digest = pending.result()
            self.counters["gpu_verified"] += 1
            if _lease_over(grant, now_ms):
                return None
            self.counters["ipc_reads"] += 1
            return digest
        host = self._pinned(size)
        pieces = []
        for start in range(0, size, _PIECE):
            n = min(_PIECE, size - start)
            self._rt.memcpyAsync(host.ctypes.data + start, dev.data.ptr + start, n, _D2H,
                                 stream.ptr)  # fmt: skip
            pieces.append((stream.record(), start, start + n))
        digests = self._hash_as_landed(pieces, memoryview(host.data)[:size])
        if _lease_over(grant, now_ms):
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


def _lease_over(grant: bytes, now_ms: Callable[[], float] = _wall_ms) -> bool:
    """Whether `grant`'s read lease ended by `now_ms` (the caller's clock of the master: the
    later of its own and the node's, where it maps the node's fence page)."""
    expires_ms = grant_expires_ms(grant)
    return expires_ms is not None and now_ms() >= expires_ms


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
                _PATH = CudaPath(verify=verify_mode_from_env())
    return _PATH


def forget_pool(segment_id: int) -> None:
    """What ShmMapper calls before it unmaps a pool: undo its CUDA registration, if any."""
    if _PATH is not None:
        _PATH.unregister(segment_id)
