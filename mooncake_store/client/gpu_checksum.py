"""The object checksum of a device buffer, computed on the GPU (docs/CHECKSUM.md, "On the GPU").

`client/xxh3_gpu.cu` holds two kernels: the block sums of every 1 MiB chunk (all blocks and
lanes in parallel) and the per-chunk scan that ends in the chunk digests.  This module is what
launches them, the same way for every backend:

- `Geometry(n)`: the grids and the scratch sizes for a buffer of `n` bytes;
- `launch(kernels, ...)`: the two kernels, in order, on one backend (`ChunkKernels`);
- `assemble(digests, n, tail)`: the checksum from the chunk digests; a last chunk of at most
  240 bytes (XXH3's short paths) is hashed on the host from its bytes (`tail_range`);
- `GpuChecksum`: the CUDA backend (cupy.RawModule), enqueued on a stream next to the DMA;
  `self_test` checks it against xxhash on the device it runs on before it is trusted.

The tests run the same `launch` and `assemble` on the host build of the kernel file
(gcc, `tests/unit/test_xxh3_gpu.py`); cupy is imported only by `GpuChecksum`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from mooncake_store.common.checksum import CHUNK_BYTES, checksum, chunk_count, chunk_digest, combine
from mooncake_store.common.xxh3_blocks import MIDSIZE_MAX, SECRET

KERNEL_SOURCE = Path(__file__).with_name("xxh3_gpu.cu")
SLOTS_PER_CHUNK = 1024  # block slots of a 1 MiB chunk: 1023 full blocks and a partial one
SUMS_THREADS = 256  # threads per CUDA block of xxh3_block_sums
FINISH_THREADS = 64  # of xxh3_finish (8 threads per chunk, one per lane; a multiple of 8)
_D2H = 2  # cudaMemcpyKind


@dataclass(frozen=True)
class Geometry:
    """Launch sizes for a buffer of `size_bytes` (> 0) bytes."""

    size_bytes: int

    @property
    def chunks(self) -> int:
        return chunk_count(self.size_bytes)

    @property
    def sum_words(self) -> int:
        """u64 words of block sums: 8 lanes per slot, SLOTS_PER_CHUNK slots per chunk."""
        return self.chunks * SLOTS_PER_CHUNK * 8

    @property
    def sums_grid(self) -> int:
        return -(-self.sum_words // SUMS_THREADS)

    @property
    def finish_grid(self) -> int:
        return -(-self.chunks * 8 // FINISH_THREADS)


class ChunkKernels(Protocol):
    """The two kernels of xxh3_gpu.cu, launched on some backend (CUDA, or the host build)."""

    def block_sums(self, grid: int, block: int, data: Any, n: int, sums: Any) -> None: ...

    def finish(self, grid: int, block: int, data: Any, n: int, sums: Any, digests: Any) -> None: ...


def launch(kernels: ChunkKernels, data: Any, n: int, sums: Any, digests: Any) -> None:
    """Both kernels over `data` (n bytes): `sums` holds Geometry(n).sum_words u64 words,
    `digests` Geometry(n).chunks."""
    g = Geometry(n)
    kernels.block_sums(g.sums_grid, SUMS_THREADS, data, n, sums)
    kernels.finish(g.finish_grid, FINISH_THREADS, data, n, sums, digests)


def tail_range(n: int) -> tuple[int, int] | None:
    """The bytes the host must hash itself: the last chunk when it has at most 240 bytes
    (the whole object when it does), else None."""
    last_start = (chunk_count(n) - 1) * CHUNK_BYTES
    if n - last_start <= MIDSIZE_MAX:
        return last_start, n
    return None


def assemble(digests: Sequence[int], n: int, tail: Any = None) -> int:
    """The object checksum from the kernels' chunk digests; `tail` is the bytes of
    `tail_range(n)` when that is not None."""
    got = [int(d) for d in digests]
    if tail_range(n) is not None:
        if tail is None:
            raise ValueError(f"an object of {n} bytes needs its last chunk's bytes")
        got[-1] = chunk_digest(tail)
    return combine(got, n)


class PendingChecksum:
    """A checksum enqueued on a stream: `result()` once the stream has been synchronized."""

    def __init__(
        self, n: int, digests: np.ndarray, tail: np.ndarray | None, scratch: tuple[Any, ...] = ()
    ) -> None:
        self.size_bytes = n
        self._digests = digests
        self._tail = tail
        self._scratch = scratch  # device arrays the stream still uses: freed after the result

    def result(self) -> int:
        self._scratch = ()
        return assemble(self._digests[: chunk_count(self.size_bytes)].tolist(), self.size_bytes,
                        self._tail)  # fmt: skip


class _CudaKernels:
    def __init__(self, module: Any, secret: Any) -> None:
        self._sums = module.get_function("xxh3_block_sums")
        self._finish = module.get_function("xxh3_finish")
        self.secret = secret  # XXH3's secret in device memory

    def block_sums(self, grid: int, block: int, data: Any, n: int, sums: Any) -> None:
        self._sums((grid,), (block,), (data, np.uint64(n), self.secret, sums))

    def finish(self, grid: int, block: int, data: Any, n: int, sums: Any, digests: Any) -> None:
        self._finish((grid,), (block,), (data, np.uint64(n), self.secret, sums, digests))


class GpuChecksum:
    """The checksum of device buffers, on the GPU that holds them (cupy)."""

    def __init__(self) -> None:
        import cupy

        self._cupy = cupy
        self._rt = cupy.cuda.runtime
        module = cupy.RawModule(code=KERNEL_SOURCE.read_text(), options=("--std=c++14",))
        secret = cupy.asarray(np.frombuffer(SECRET, dtype=np.uint8))
        self._kernels = _CudaKernels(module, secret)
        self._local = threading.local()  # pinned result buffers, per thread

    def _pinned(self, name: str, nbytes: int) -> np.ndarray:
        buf = getattr(self._local, name, None)
        if buf is None or buf.nbytes < nbytes:
            memory = self._cupy.cuda.alloc_pinned_memory(max(nbytes, 4096))
            buf = np.frombuffer(memory, dtype=np.uint8)
            setattr(self._local, name, buf)
        return buf

    def enqueue(self, data: Any, stream: Any) -> PendingChecksum:
        """Launch the checksum of `data` (a flat uint8 cupy array) on `stream`; the digests
        and the bytes the host hashes come back by async copies on the same stream."""
        cupy = self._cupy
        n = int(data.nbytes)
        if n == 0:
            return PendingChecksum(0, np.zeros(1, dtype=np.uint64), np.zeros(0, np.uint8))
        g = Geometry(n)
        host = self._pinned("digests", 8 * g.chunks)
        digests_host = host[: 8 * g.chunks].view(np.uint64)
        tail = tail_range(n)
        tail_host = None
        scratch: tuple[Any, ...] = ()
        with stream:
            if tail is None or g.chunks > 1:
                sums = cupy.empty(g.sum_words, dtype=cupy.uint64)
                digests = cupy.empty(g.chunks, dtype=cupy.uint64)
                launch(self._kernels, data, n, sums, digests)
                scratch = (sums, digests)
                self._rt.memcpyAsync(digests_host.ctypes.data, digests.data.ptr, 8 * g.chunks,
                                     _D2H, stream.ptr)  # fmt: skip
            else:
                digests_host[:] = 0
            if tail is not None:
                tail_host = self._pinned("tail", MIDSIZE_MAX)[: tail[1] - tail[0]]
                self._rt.memcpyAsync(tail_host.ctypes.data, data.data.ptr + tail[0],
                                     tail[1] - tail[0], _D2H, stream.ptr)  # fmt: skip
        return PendingChecksum(n, digests_host, tail_host, scratch)

    def checksum(self, data: Any, stream: Any) -> int:
        pending = self.enqueue(data, stream)
        stream.synchronize()
        return pending.result()

    def self_test(self) -> None:
        """Raise unless the kernels agree with xxhash on this device (every boundary the
        kernels treat apart: short last chunks, partial blocks, several chunks)."""
        stream = self._cupy.cuda.Stream(non_blocking=False)
        pattern = (np.arange(3 * CHUNK_BYTES + 4096, dtype=np.int64) % 251).astype(np.uint8)
        for n in (1, 240, 241, 1024, 1025, 1088, 4097, CHUNK_BYTES, CHUNK_BYTES + 1,
                  CHUNK_BYTES + 241, 3 * CHUNK_BYTES + 4093):  # fmt: skip
            host = pattern[:n]
            got = self.checksum(self._cupy.asarray(host), stream)
            if got != checksum(host):
                raise RuntimeError(
                    f"GPU checksum of {n} bytes is {got:#x}, xxhash says {checksum(host):#x}"
                )
