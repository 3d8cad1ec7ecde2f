"""The object checksum: xxh3_64 over fixed 1 MiB chunks, combined (docs/CHECKSUM.md).

Definition (format 2), for an object of `n` bytes:

- cut the bytes into chunks of `CHUNK_BYTES` (1 MiB = 1,048,576 bytes); the last chunk may be
  shorter;
- `n <= CHUNK_BYTES` (one chunk, or the empty object): the checksum is
  `xxh3_64(bytes, seed=0)`, exactly the whole-object hash the store used before (format 1), so
  blocks of up to 1 MiB need no migration;
- `n > CHUNK_BYTES`: `d_i = xxh3_64(chunk_i, seed=0)` for every chunk, and the checksum is
  `xxh3_64(le64(d_0) || le64(d_1) || ... , seed=0)`, each digest as 8 little-endian bytes.

Every chunk can be hashed on its own, by any thread, in any order, while its bytes are in cache
or while a DMA moves them; the combination is one hash of 8 bytes per MiB.  The object size is
stored beside the checksum, so the two cases cannot be confused.

xxhash releases the GIL while it hashes a buffer, so chunk digests computed on a thread pool run
in parallel (`checksum_parallel`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any

import xxhash

CHUNK_BYTES = 1 << 20
SEED = 0
FORMAT = 2  # 1: xxh3_64 of the whole object (blocks stored before the chunked definition)

_digest = xxhash.xxh3_64_intdigest


def chunk_digest(chunk: Any) -> int:
    """xxh3_64 (seed 0) of one chunk's bytes."""
    return _digest(chunk)


def combine(digests: Sequence[int], size_bytes: int) -> int:
    """The object checksum from its chunk digests (in order) and its size.

    With one chunk (size <= CHUNK_BYTES) the checksum is that chunk's digest; the empty object
    has one (empty) chunk.
    """
    if size_bytes <= CHUNK_BYTES:
        if len(digests) != 1:
            raise ValueError(f"an object of {size_bytes} bytes has one chunk, not {len(digests)}")
        return digests[0]
    if len(digests) != chunk_count(size_bytes):
        raise ValueError(
            f"an object of {size_bytes} bytes has {chunk_count(size_bytes)} chunks, "
            f"not {len(digests)}"
        )
    return _digest(struct.pack(f"<{len(digests)}Q", *digests))


def chunk_count(size_bytes: int) -> int:
    return max(1, -(-size_bytes // CHUNK_BYTES))


def chunk_digests(data: Any, start: int = 0, stop: int | None = None) -> list[int]:
    """Digests of the chunks of `data` from byte `start` (a chunk boundary) to `stop`."""
    view = _bytes_view(data)
    stop = len(view) if stop is None else stop
    if start % CHUNK_BYTES:
        raise ValueError(f"chunk range must start on a chunk boundary, not at {start}")
    if stop <= start:
        return [_digest(view[start:start])] if not len(view) else []
    return [_digest(view[i : min(i + CHUNK_BYTES, stop)]) for i in range(start, stop, CHUNK_BYTES)]


def checksum(data: Any) -> int:
    """The checksum of a bytes-like object, on the calling thread."""
    view = _bytes_view(data)
    n = len(view)
    if n <= CHUNK_BYTES:
        return _digest(view)
    return combine(chunk_digests(view), n)


# From two chunks up a thread hop (~20-50 us) costs less than hashing a chunk (~110 us).
PARALLEL_MIN_BYTES = 2 * CHUNK_BYTES


def checksum_parallel(data: Any, executor: Executor | None, workers: int) -> int:
    """The checksum of `data`, its chunks hashed in `workers` groups on `executor`.

    The caller's thread takes the first group.  Small objects, a missing executor or one
    worker fall back to `checksum`.
    """
    view = _bytes_view(data)
    n = len(view)
    chunks = chunk_count(n)
    if executor is None or workers < 2 or n < PARALLEL_MIN_BYTES:
        return checksum(view)
    per = -(-chunks // min(workers, chunks))
    bounds = [(i * CHUNK_BYTES, min(n, (i + per) * CHUNK_BYTES)) for i in range(0, chunks, per)]
    futures = [executor.submit(chunk_digests, view, a, b) for a, b in bounds[1:]]
    digests = chunk_digests(view, *bounds[0])
    for future in futures:
        digests.extend(future.result())
    return combine(digests, n)


class ChunkedHasher:
    """The checksum fed piece by piece (a TCP reply as it lands, a payload as it goes out).

    `update` takes pieces of any length; `intdigest` may be called at any point (it does not
    end the stream); `reset` starts over.  The same interface as `xxhash.xxh3_64`.
    """

    __slots__ = ("_digests", "_fill", "_h")

    def __init__(self) -> None:
        self._h = xxhash.xxh3_64(seed=SEED)
        self._fill = 0  # bytes of the current chunk fed to _h
        self._digests: list[int] = []  # finished chunks

    def update(self, data: Any) -> None:
        view = _bytes_view(data)
        n, pos = len(view), 0
        while pos < n:
            if self._fill == 0 and n - pos >= CHUNK_BYTES:  # a whole chunk: hash it in one call
                self._digests.append(_digest(view[pos : pos + CHUNK_BYTES]))
                pos += CHUNK_BYTES
                continue
            take = min(CHUNK_BYTES - self._fill, n - pos)
            self._h.update(view[pos : pos + take])
            self._fill += take
            pos += take
            if self._fill == CHUNK_BYTES:
                self._digests.append(self._h.intdigest())
                self._h.reset()
                self._fill = 0

    @property
    def size_bytes(self) -> int:
        return len(self._digests) * CHUNK_BYTES + self._fill

    def intdigest(self) -> int:
        digests = self._digests
        if self._fill or not digests:
            digests = [*digests, self._h.intdigest()]
        return combine(digests, self.size_bytes)

    def reset(self) -> None:
        self._h.reset()
        self._fill = 0
        self._digests = []


def legacy_checksum(data: Any) -> int:
    """Format 1 (before the chunked definition): xxh3_64 of the whole object.  Equal to
    `checksum` for objects of up to CHUNK_BYTES; used only to migrate stored blocks."""
    return _digest(_bytes_view(data))


def _bytes_view(data: Any) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view
