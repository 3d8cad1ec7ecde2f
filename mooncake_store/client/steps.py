"""The vocabulary of client operations: the steps a flow yields, and the buffer helpers.

Every operation (put, get, their batch and prefix forms) is written once, as a generator of
steps: master calls (`master_client.MasterCall`), a master call overlapped with local work
(`Overlapped`), pool mapping (`MapPools`) and TCP transfers (`Transfers`), reached through
`ClientFlows` (flows.py).  Two drivers run them:
`AsyncClient._drive` awaits each step on its event loop (transfers in parallel on its TcpPool);
the sync `Client` takes them in the calling thread, on blocking sockets of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from mooncake_store.client.master_client import MasterCall
from mooncake_store.client.shm import Guard, ShmMapper
from mooncake_store.client.transport import Buffer, Hasher
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES, ChunkedHasher, chunk_digest, combine
from mooncake_store.common.checksum import checksum as checksum
from mooncake_store.common.copyhash import SMALL_COPY, copy_digest, copy_digest_parts
from mooncake_store.common.errors import InvalidValueError
from mooncake_store.common.helper_thread import HelperThread
from mooncake_store.common.wire import Op

T = TypeVar("T")


_FUSE_CHUNK = CHUNK_BYTES  # a checksum chunk: in cache when hashed, big enough for memcpy
_SPLIT_COPY = 8 << 20  # from here a second thread copies chunks from the back (below, the
# one-pass kernel alone keeps up with memory: a second thread at 4 MiB slowed same-host gets,
# whose copy runs while the master answers, from ~350 to ~390-500 us on the 2-core VM)
_SPLIT_PUT = 6 << 20  # a put's copy into the pool: nothing else runs meanwhile.  Interleaved
# A/Bs on one cluster (one thread, 60 puts a round, median of the rounds' p50s; 2026-12-08): a
# second thread took 6 MiB puts from 739 to 667 us, 8 MiB from 873 to 760 and 16 MiB from 1,577
# to 1,251, but 4 MiB ones not at all (559 vs 555 and 567 vs 581 us) and 5 MiB ones barely (677
# vs 660), while the three processes spent ~170 us more CPU per put: on a 2-core host that is
# CPU the master's reply waits for (README "Where a put's time goes on 2 cores")


def copy_checksum(
    dest: memoryview, src: memoryview, guard: Guard | None = None, split_from: int = 0
) -> int:
    """Copy `src` into `dest` (same length) and return the checksum of `dest`.  `guard` runs
    before the copy and before each of its 1 MiB steps (in both threads).

    Each 1 MiB step is one checksum chunk (common/checksum.py), copied and hashed by
    `copy_digest` (common/copyhash.py): in one pass over memory by the C kernel, or copied by
    numpy and hashed while the chunk is in cache.  Both release the GIL, so the threads of one
    process copy in parallel.

    From `split_from` bytes (0: `_SPLIT_COPY`, 8 MiB), when the process's copy helper is free,
    it copies and hashes the back half while this thread copies and hashes the front half (the
    chunks are independent); busy (another thread of the process is using it), the copy stays
    here.
    """
    n = len(src)
    if len(dest) != n:
        raise ValueError(f"copy of {n} bytes into a buffer of {len(dest)}")
    if guard is not None:
        guard()
    if n <= _FUSE_CHUNK:
        return copy_digest(dest, src)
    half = n // 2 // _FUSE_CHUNK * _FUSE_CHUNK
    split_from = split_from or _SPLIT_COPY
    split = half if n >= split_from and _HELPER.start(dest, src, half, guard) else n
    try:
        digests = _copy_hashed(copy_digest, dest[:split], src[:split], guard)
    finally:
        back = _HELPER.wait() if split < n else []
    return combine(digests + back, n)


def _copy_hashed(
    copy: Callable[[memoryview, memoryview], int],
    to: memoryview,
    frm: memoryview,
    guard: Guard | None = None,
) -> list[int]:
    """Copy `frm` into `to` chunk by chunk with `copy` (a `copy_digest`), returning each
    chunk's digest (`to` starts on a chunk boundary of the object); `guard` runs before each
    chunk."""
    digests = []
    for start in range(0, len(frm), _FUSE_CHUNK):
        if guard is not None and start:
            guard()
        stop = min(start + _FUSE_CHUNK, len(frm))
        digests.append(copy(to[start:stop], frm[start:stop]))
    return digests


def copy_parts_checksum(
    dests: Sequence[memoryview], srcs: Sequence[memoryview], guard: Guard | None = None
) -> int:
    """Copy each of `srcs` into the matching `dests` (pairwise the same length) and return the
    checksum of all of `dests` one after the other: a scatter-gather object's checksum, with
    no staging buffer (one part: `copy_checksum`).  Copied and hashed in cache-sized steps;
    `guard` runs before each part and each 1 MiB step."""
    if len(dests) == 1:
        return copy_checksum(dests[0], srcs[0], guard)
    h = ChunkedHasher()
    for dest, src in zip(dests, srcs, strict=True):
        n = len(src)
        if len(dest) != n:
            raise ValueError(f"copy of {n} bytes into a buffer of {len(dest)}")
        if guard is not None:
            guard()
        if n <= SMALL_COPY:
            dest[:] = src
            h.update(dest)
            continue
        to = np.frombuffer(dest, dtype=np.uint8)
        frm = np.frombuffer(src, dtype=np.uint8)
        for start in range(0, n, _FUSE_CHUNK):
            if guard is not None and start:
                guard()
            stop = min(start + _FUSE_CHUNK, n)
            np.copyto(to[start:stop], frm[start:stop])
            h.update(dest[start:stop])
    return h.intdigest()


def copy_parts_into(
    region: memoryview, parts: Sequence[memoryview], guard: Guard | None = None
) -> int:
    """Copy `parts` one after the other into `region` (their total length) and return the
    checksum of `region`: a scatter-gather write into the pool.  `guard` runs before the copy
    and before each 1 MiB of it."""
    return _region_and_parts(region, parts, False, guard)


def copy_out_checksum(
    region: memoryview, parts: Sequence[memoryview], guard: Guard | None = None
) -> int:
    """Copy `region` into `parts` (their total length, one after the other) and return the
    checksum of the bytes copied: a read out of the pool into the caller's buffers, which must
    not overlap one another (a later part would overwrite bytes already hashed)."""
    return _region_and_parts(region, parts, True, guard)


def _region_and_parts(
    region: memoryview, parts: Sequence[memoryview], into_parts: bool, guard: Guard | None
) -> int:
    """Copy between one region and a value's parts, chunk by chunk of the checksum: each
    chunk is one pass of the C kernel over all the parts it spans (common/copyhash.py); one
    part is a contiguous copy; without the kernel, numpy copies and xxh3 hashes."""
    if len(parts) == 1:
        if into_parts:
            return copy_checksum(parts[0], region, guard)
        return copy_checksum(region, parts[0], guard, _SPLIT_PUT)
    n = sum(len(p) for p in parts)
    if n != len(region):
        raise ValueError(f"parts of {n} bytes for a region of {len(region)}")
    if copy_digest_parts is None or n == 0:  # the empty value: one (empty) chunk, as below
        if into_parts:
            return copy_parts_checksum(parts, split_like(region, parts), guard)
        if n > _FUSE_CHUNK:
            return copy_parts_checksum(split_like(region, parts), parts, guard)
        if guard is not None:
            guard()
        for dest, part in zip(split_like(region, parts), parts, strict=True):
            dest[:] = part
        return chunk_digest(region)
    digests = []
    for start, chunk in _chunks(parts):
        if guard is not None:
            guard()
        stop = min(start + _FUSE_CHUNK, n)
        digests.append(copy_digest_parts(region[start:stop], chunk, into_parts))
    return combine(digests, n)


def _chunks(parts: Sequence[memoryview]) -> list[tuple[int, list[memoryview]]]:
    """A value's parts cut at the checksum's chunk boundaries: (offset, the slices of the
    parts that make up that chunk) for each chunk."""
    out: list[tuple[int, list[memoryview]]] = []
    current: list[memoryview] = []
    start = room = 0
    at = 0
    for part in parts:
        used = 0
        while used < len(part):
            if room == 0:
                if current:
                    out.append((start, current))
                current, start, room = [], at, _FUSE_CHUNK
            take = min(room, len(part) - used)
            current.append(part[used : used + take])
            used += take
            at += take
            room -= take
    if current:
        out.append((start, current))
    return out


def split_like(view: memoryview, parts: Sequence[memoryview]) -> list[memoryview]:
    """`view` cut into consecutive pieces of the sizes of `parts`."""
    out, at = [], 0
    for part in parts:
        out.append(view[at : at + len(part)])
        at += len(part)
    return out


def trim_parts(parts: Sequence[memoryview], size: int) -> list[memoryview]:
    """The leading `size` bytes of `parts` (an object read into parts larger than it)."""
    out: list[memoryview] = []
    for part in parts:
        if size <= 0:
            break
        out.append(part[:size])
        size -= len(out[-1])
    return out


def parts_checksum(parts: Sequence[memoryview]) -> int:
    """The checksum of `parts` one after the other (common/checksum.py)."""
    h = ChunkedHasher()
    for part in parts:
        h.update(part)
    return h.intdigest()


class _CopyHelper:
    """The process's helper thread (common/helper_thread.py) that copies and hashes the back
    half of a big buffer (see copy_checksum).  Busy, the caller copies alone."""

    def __init__(self) -> None:
        self.thread = HelperThread("mooncake-copy")
        self._copy = copy_digest  # what the helper copies with (a test makes it fail)

    @property
    def splits(self) -> int:  # copies it took half of
        return self.thread.jobs

    def start(
        self, to: memoryview, frm: memoryview, split: int, guard: Guard | None = None
    ) -> bool:
        """Hand `frm[split:]` -> `to[split:]` to the helper; False when it is busy."""
        to, frm, copy = to[split:], frm[split:], self._copy

        def job() -> list[int]:
            if guard is not None:
                guard()  # its first chunk is guarded too
            return _copy_hashed(copy, to, frm, guard)

        return self.thread.start(job)

    def wait(self) -> list[int]:
        """Wait for the back half and return its chunk digests; raise what the helper's copy
        raised."""
        digests: list[int] = self.thread.wait()
        return digests


_HELPER = _CopyHelper()


@dataclass(frozen=True, slots=True)
class MapPools:
    """Step: map the DRAM pools of `replicas` whose nodes share this host (once per pool)."""

    replicas: Sequence[ReplicaLocation]


@dataclass(frozen=True, slots=True)
class Transfer:
    """One node access over TCP: write `buffer` to, or read the replica into, `buffer`.

    It may carry `hasher`: the transport feeds it each piece of a read's reply as it lands,
    or of a write's payload just before it goes out, while the piece is in cache, so the
    checksum costs no second pass over memory (16 MiB: ~1 ms, 12-20% of the transfer).
    """

    op: Op
    loc: ReplicaLocation
    buffer: Buffer
    hasher: Hasher | None = None


@dataclass(frozen=True, slots=True)
class Transfers:
    """Step: run the transfers; the result is one MooncakeError or None per transfer."""

    transfers: Sequence[Transfer]


@dataclass(frozen=True, slots=True)
class Overlapped:
    """Step: the master call `call`, with `meanwhile()` run while its reply is on its way (the
    request sent, the reply not read yet).  The result is the pair (the call's parsed reply,
    what `meanwhile` returned or the Exception it raised): meanwhile's failure never fails the
    step, the call's raises as a MasterCall step's would.  Where the call cannot be sent that
    way (no framed channel, gRPC, a batch sent as slices), the driver runs meanwhile and then
    the plain call: the same result, without the overlap."""

    call: MasterCall[Any]
    meanwhile: Callable[[], Any]


def run_meanwhile(meanwhile: Callable[[], T]) -> T | Exception:
    """What an Overlapped step's `meanwhile` returned, or the Exception it raised."""
    try:
        return meanwhile()
    except Exception as exc:
        return exc


Step = MasterCall[Any] | MapPools | Transfers | Overlapped
Flow = Generator[Step, Any, T]


def as_readable(value: object, *, what: str = "value") -> memoryview:
    """A flat byte view of any C-contiguous buffer-protocol object, or InvalidValueError."""
    try:
        view = memoryview(value)  # type: ignore[arg-type]
    except TypeError:
        hint = " (encode str with .encode())" if isinstance(value, str) else ""
        raise InvalidValueError(
            f"{what} must be a bytes-like object (bytes, bytearray, memoryview, numpy array), "
            f"got {type(value).__name__}{hint}"
        ) from None
    if not view.c_contiguous:
        raise InvalidValueError(
            f"{what} must be C-contiguous; pass numpy.ascontiguousarray(x) instead"
        )
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def as_writable(buffer: object) -> memoryview:
    view = as_readable(buffer, what="buffer")
    if view.readonly:
        raise InvalidValueError("buffer is read-only; pass a bytearray, numpy array or similar")
    return view


class LocalPools:
    """Same-host pools as the read and write flows see them (a mixin of ClientFlows)."""

    local_shm: bool
    shm: ShmMapper

    def _mapped(self, loc: ReplicaLocation) -> memoryview | None:
        """The pool of `loc` if it is a DRAM replica already mapped on this host."""
        if not self.local_shm or loc.tier != "DRAM":
            return None
        return self.shm.cached(loc)
