"""A TCP read into a device buffer, pipelined: receive piece k+1 while piece k is copied up.

Over TCP a value meant for device memory lands in pinned host staging, piece by piece, and each
piece's host-to-device copy is issued (asynchronously, on a stream) the moment its last byte
lands, while the socket fills the next piece.  The staging buffers rotate: piece k goes to
buffer `k % len(staging)`; before a buffer takes new bytes, the copy that last read it must be
done (`Copier.wait`).  The checksum is computed as the bytes land, the usual way
(`ChunkedHasher`: the same object is the transfer's hasher), so a read costs no second pass.

`PipelinedReceive` is a `Hasher` to the transports (client/tcp_async.py, tcp_blocking.py):
they call `update` with every slice that lands, in order, never a slice that spans two
destinations (a receive is bounded by its destination).  `dests` are the transfer's buffer.

The copier is injected:
- `CudaCopier` (cupy): `cudaMemcpyAsync` pinned -> device on a stream, an event per piece;
- `HostCopier`: a host array as the "device", its copies run late (queued until waited on, as
  an engine that lags), so the tests here catch a buffer reused before its copy ran.

After the transfer, succeeded or not, `finish()` waits for every issued copy: only then may the
staging be reused (another replica's attempt) or the result be trusted.  On any failure the
destination holds undefined bytes; the caller raises or reads again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from mooncake_store.common.checksum import CHUNK_BYTES, ChunkedHasher

PIECE_BYTES = CHUNK_BYTES  # a piece per checksum chunk: ~30 us at the H2D limit, ~0.3 ms of TCP
STAGING_BUFFERS = 2


class Copier(Protocol):
    """Copies from host staging into the destination, asynchronously."""

    def copy(self, offset: int, src: memoryview) -> Any:
        """Start copying `src` to destination offset `offset`; a token for `wait`."""

    def wait(self, token: Any) -> None:
        """Return once that copy has read all of its source."""

    def drain(self) -> None:
        """Return once every copy started is complete."""


class PipelinedReceive(ChunkedHasher):
    """The hasher and the destination parts of one TCP read into device memory."""

    __slots__ = ("_copied", "_copier", "_piece", "_received", "_size", "_tokens", "dests")

    def __init__(
        self,
        size_bytes: int,
        staging: Sequence[memoryview],
        copier: Copier,
        piece_bytes: int = PIECE_BYTES,
    ) -> None:
        super().__init__()
        if piece_bytes <= 0 or not staging:
            raise ValueError("a pipelined receive needs staging buffers and a piece size > 0")
        self._size = size_bytes
        self._piece = piece_bytes
        self._copier = copier
        pieces = -(-size_bytes // piece_bytes)
        #: Where the transport receives, in order: piece k in staging buffer k % len(staging).
        self.dests = [
            staging[k % len(staging)][: min(piece_bytes, size_bytes - k * piece_bytes)]
            for k in range(pieces)
        ]
        if sum(len(d) for d in self.dests) != size_bytes:
            raise ValueError(f"staging buffers too small for pieces of {piece_bytes} bytes")
        self._tokens: list[Any] = [None] * len(staging)
        self._received = 0
        self._copied = 0  # pieces whose copy has been started

    def update(self, data: Any) -> None:
        super().update(data)
        self._received += len(data) if isinstance(data, memoryview) else memoryview(data).nbytes
        if self._received > self._size:
            raise ValueError(f"received {self._received} bytes into a {self._size}-byte value")
        while self._copied < len(self.dests) and self._received >= self._end(self._copied):
            k = self._copied
            slot = k % len(self._tokens)
            self._tokens[slot] = self._copier.copy(k * self._piece, self.dests[k])
            self._copied += 1
            after = k + 1  # the next piece lands in a buffer that an earlier copy reads
            if after < len(self.dests) and after >= len(self._tokens):
                token = self._tokens[after % len(self._tokens)]
                if token is not None:
                    self._copier.wait(token)

    def _end(self, k: int) -> int:
        return min((k + 1) * self._piece, self._size)

    @property
    def complete(self) -> bool:
        """Every byte received and its copy started."""
        return self._received == self._size and self._copied == len(self.dests)

    def finish(self) -> None:
        """Wait for every copy started (after success or failure alike)."""
        self._copier.drain()
        self._tokens = [None] * len(self._tokens)

    def reset(self) -> None:
        """Start over (the transport retries on a fresh connection): nothing copied counts."""
        self.finish()
        super().reset()
        self._received = 0
        self._copied = 0


class HostCopier:
    """A host array as the destination; copies run only when waited on (a lagging engine)."""

    def __init__(self, dest: np.ndarray) -> None:
        self.dest = dest.reshape(-1).view(np.uint8)
        self._queued: list[tuple[int, int, memoryview]] = []
        self._serial = 0
        self.copies = 0
        self.waits = 0

    def copy(self, offset: int, src: memoryview) -> int:
        self._serial += 1
        self._queued.append((self._serial, offset, src))
        return self._serial

    def wait(self, token: int) -> None:
        self.waits += 1
        self._run(until=token)

    def drain(self) -> None:
        self._run(until=self._serial)

    def _run(self, until: int) -> None:
        while self._queued and self._queued[0][0] <= until:
            _, offset, src = self._queued.pop(0)
            self.dest[offset : offset + len(src)] = np.frombuffer(src, dtype=np.uint8)
            self.copies += 1


class CudaCopier:
    """Pinned host staging -> a cupy device buffer, on one stream, an event per copy."""

    def __init__(self, dev: Any, stream: Any) -> None:
        import cupy

        self._rt = cupy.cuda.runtime
        self._dev_ptr = int(dev.data.ptr)
        self._size = int(dev.nbytes)
        self._stream = stream

    def copy(self, offset: int, src: memoryview) -> Any:
        if offset + len(src) > self._size:
            raise ValueError("copy past the end of the device buffer")
        src_ptr = int(np.frombuffer(src, dtype=np.uint8).ctypes.data)
        self._rt.memcpyAsync(self._dev_ptr + offset, src_ptr, len(src), 1, self._stream.ptr)
        return self._stream.record()

    def wait(self, token: Any) -> None:
        token.synchronize()

    def drain(self) -> None:
        self._stream.synchronize()
