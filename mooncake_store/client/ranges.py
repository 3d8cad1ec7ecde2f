"""Ranged reads and read sessions: copy parts of objects, verified, under a held read lease.

A `ReadSession` leases its objects on the master for as long as it is open (the lease is
renewed while ranges are read), so their extents are neither freed nor reused meanwhile.

Verification never weakens the whole-object guarantee (docs/CHECKSUM.md defines the checksum
over 1 MiB chunks):

- **Same host** (the replica's pool is mapped): opening the session hashes every chunk of the
  object in place, in the pool, with no copy, and keeps the chunk digests once they combine
  into the stored checksum.  A ranged read then hashes again, in place, each chunk the range
  touches, compares it with its verified digest, and copies only the requested bytes.  A chunk
  that no longer matches fails the read (ChecksumMismatchError): unverified bytes are never
  returned.
- **Other hosts** (TCP): opening the session asks the node for the object's chunk digests
  (the data path's DIGESTS request: the node hashes the extent in place and sends 8 bytes per
  MiB), kept once they combine into the stored checksum.  A ranged read then fetches only the
  1 MiB chunks the range touches, checks each against its digest, and copies the requested
  bytes out.  Where a node cannot answer DIGESTS (an NVMe or GPU replica, an older node), the
  first ranged read fetches the object once, verified whole, and later ranges copy from it.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from mooncake_store.client.master_client import get_replica_list_call
from mooncake_store.client.steps import (
    Flow,
    LocalPools,
    MapPools,
    Transfer,
    Transfers,
    as_writable,
)
from mooncake_store.client.transport import Hasher
from mooncake_store.client.types import ReplicaList, ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES, chunk_count, chunk_digest, combine
from mooncake_store.common.errors import (
    ChecksumMismatchError,
    InvalidArgumentError,
    MooncakeError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.common.wire import Op

RENEW_AFTER_S = 1.0  # re-lease a session's objects when a read comes this long after the last


@dataclass(slots=True)
class _Entry:
    """One object of a session: its replica list, and how its bytes are verified."""

    info: ReplicaList
    local: ReplicaLocation | None = None  # a mapped same-host replica, verified in place
    remote: int = 0  # the segment of a TCP replica whose digests were verified (0: none)
    digests: list[int] = field(default_factory=list)  # the verified chunk digests
    copy: np.ndarray | None = None  # the verified whole object (fetched over TCP)

    def replica(self, segment_id: int) -> ReplicaLocation | None:
        return next((r for r in self.info.replicas if r.segment_id == segment_id), None)


@dataclass(slots=True)
class ReadSession:
    """Objects leased for ranged reads (`Client.read_session`); close it when done."""

    keys: list[str]
    entries: dict[str, _Entry | MooncakeError]
    leased_at: float
    closed: bool = False

    def error(self, key: str) -> MooncakeError | None:
        """Why `key` cannot be read in this session, or None."""
        entry = self.entries.get(key)
        if entry is None:
            return InvalidArgumentError(f"{key!r} is not part of this read session")
        return entry if isinstance(entry, MooncakeError) else None

    def close(self) -> None:
        """Drop the session's buffers; its leases end on their own shortly after."""
        self.closed = True
        self.entries.clear()


Range = tuple[object, int]  # (destination buffer, offset in the object)


class RangeFlows(LocalPools):
    """Ranged reads (a mixin of ClientFlows, flows.py: the state is its)."""

    counters: dict[str, int]

    def session_flow(self, keys: Sequence[str]) -> Flow[ReadSession]:
        keys = [validate_key(k) for k in keys]
        results = yield get_replica_list_call(keys, b"")
        session = ReadSession(list(keys), {}, time.monotonic())
        yield MapPools([loc for r in results if isinstance(r, ReplicaList) for loc in r.replicas])
        for key, result in zip(keys, results, strict=True):
            session.entries[key] = result if isinstance(result, MooncakeError) else _Entry(result)
            if isinstance(result, ReplicaList):
                session.entries[key] = self._verify_in_place(key, _Entry(result))
        remote = [
            (k, e) for k, e in session.entries.items()
            if isinstance(e, _Entry) and e.local is None
        ]  # fmt: skip
        if remote:
            yield from self._fetch_digests(remote)
        return session

    def _fetch_digests(self, entries: list[tuple[str, _Entry]]) -> Flow[None]:
        """Ask a DRAM replica's node for each object's chunk digests; keep them when they
        combine into the stored checksum (one chunk: the checksum is its digest)."""
        asks: list[tuple[_Entry, ReplicaLocation, bytearray]] = []
        for _, entry in entries:
            info = entry.info
            loc = next((r for r in info.replicas if r.tier == "DRAM"), None)
            if loc is None:
                continue
            if info.size_bytes <= CHUNK_BYTES:
                entry.remote, entry.digests = loc.segment_id, [info.checksum]
                continue
            asks.append((entry, loc, bytearray(8 * chunk_count(info.size_bytes))))
        if not asks:
            return
        errors = yield Transfers(
            [Transfer(Op.DIGESTS, loc, memoryview(buf)) for _, loc, buf in asks]
        )
        for (entry, loc, buf), err in zip(asks, errors, strict=True):
            if err is not None:
                continue  # the first ranged read fetches it whole instead
            digests = list(struct.unpack(f"<{len(buf) // 8}Q", buf))
            if combine(digests, entry.info.size_bytes) == entry.info.checksum:
                entry.remote, entry.digests = loc.segment_id, digests
            else:
                self.counters["checksum_failures"] += 1

    def _verify_in_place(self, key: str, entry: _Entry) -> _Entry | MooncakeError:
        """Hash a mapped replica's chunks in the pool; keep the digests when they combine to
        the stored checksum.  No mapped replica: the entry reads over TCP later."""
        info = entry.info
        for loc in info.replicas:
            pool = self._mapped(loc)
            if pool is None:
                continue
            view = pool[loc.offset : loc.offset + info.size_bytes]
            digests = [
                chunk_digest(view[i : i + CHUNK_BYTES])
                for i in range(0, max(1, info.size_bytes), CHUNK_BYTES)
            ]
            if combine(digests, info.size_bytes) == info.checksum:
                entry.local, entry.digests = loc, digests
                return entry
            self.counters["checksum_failures"] += 1
        return entry

    def ranges_flow(
        self, session: ReadSession, reads: Sequence[tuple[str, Sequence[Range]]]
    ) -> Flow[list[list[int | MooncakeError]]]:
        """Copy each (destination, object offset) range of each key: per range, the bytes
        copied (the destination's length) or the MooncakeError that stopped it."""
        if session.closed:
            raise InvalidArgumentError("this read session is closed; open a new one")
        if time.monotonic() - session.leased_at > RENEW_AFTER_S:
            yield from self._renew(session)
        chunked = yield from self._read_chunks(session, reads)
        fetch = [
            key for key, _ in reads
            if isinstance(e := session.entries.get(key), _Entry) and e.local is None
            and e.copy is None and key not in chunked
        ]  # fmt: skip
        if fetch:
            yield from self._fetch_whole(session, list(dict.fromkeys(fetch)))
        out: list[list[int | MooncakeError]] = []
        for n, (key, ranges) in enumerate(reads):
            error = session.error(key)
            results: list[int | MooncakeError] = []
            for r, (dest, offset) in enumerate(ranges):
                if error is not None:
                    results.append(error)
                elif (n, r) in chunked.get(key, {}):
                    results.append(chunked[key][n, r])
                else:
                    entry = session.entries[key]
                    assert isinstance(entry, _Entry)
                    results.append(self._copy_range(key, entry, dest, offset))
            out.append(results)
        return out

    def _read_chunks(
        self, session: ReadSession, reads: Sequence[tuple[str, Sequence[Range]]]
    ) -> Flow[dict[str, dict[tuple[int, int], int | MooncakeError]]]:
        """The ranges of objects read over TCP with verified digests: fetch the chunks each
        range touches (only those), check each against its digest, copy the range out.  Per
        key, per (read, range) index: the bytes copied or the error."""
        plans = []
        for n, (key, ranges) in enumerate(reads):
            entry = session.entries.get(key)
            if not isinstance(entry, _Entry) or entry.local is not None or not entry.remote:
                continue
            loc = entry.replica(entry.remote)
            if loc is None:
                continue
            for r, (dest, offset) in enumerate(ranges):
                view = as_writable(dest)
                size = entry.info.size_bytes
                if offset < 0 or offset + len(view) > size or not len(view):
                    continue  # _copy_range reports it
                start = offset // CHUNK_BYTES * CHUNK_BYTES
                stop = min(size, -(-(offset + len(view)) // CHUNK_BYTES) * CHUNK_BYTES)
                staging = np.empty(stop - start, dtype=np.uint8)
                part = replace(loc, offset=loc.offset + start, size_bytes=stop - start)
                plans.append((key, n, r, entry, view, offset, start, staging, part))
        out: dict[str, dict[tuple[int, int], int | MooncakeError]] = {}
        if not plans:
            return out
        errors = yield Transfers(
            [Transfer(Op.READ, p[8], memoryview(p[7])) for p in plans]  # type: ignore[arg-type]
        )
        for (key, n, r, entry, view, offset, start, staging, _), err in zip(
            plans, errors, strict=True
        ):
            result: int | MooncakeError
            if err is not None:
                result = err
            else:
                result = len(view)
                data = memoryview(staging)  # type: ignore[arg-type]
                for at in range(0, len(data), CHUNK_BYTES):
                    if (
                        chunk_digest(data[at : at + CHUNK_BYTES])
                        != entry.digests[(start + at) // CHUNK_BYTES]
                    ):
                        self.counters["checksum_failures"] += 1
                        result = ChecksumMismatchError(
                            f"chunk {(start + at) // CHUNK_BYTES} of {key!r} failed its digest"
                        )
                        break
                else:
                    view[:] = data[offset - start : offset - start + len(view)]
                    self.counters["tcp_reads"] += 1
                    self.counters["range_bytes_fetched"] = self.counters.get(
                        "range_bytes_fetched", 0
                    ) + len(data)
            out.setdefault(key, {})[n, r] = result
        return out

    def _renew(self, session: ReadSession) -> Flow[None]:
        live = [k for k in session.keys if isinstance(session.entries.get(k), _Entry)]
        if live:
            fresh = yield get_replica_list_call(live, b"")
            for key, info in zip(live, fresh, strict=True):
                entry = session.entries[key]
                assert isinstance(entry, _Entry)
                if isinstance(info, MooncakeError):
                    session.entries[key] = info  # removed or lost meanwhile
                elif (info.size_bytes, info.checksum) != (
                    entry.info.size_bytes,
                    entry.info.checksum,
                ):
                    session.entries[key] = ReplicaUnavailableError(
                        f"{key!r} changed during the session"
                    )
        session.leased_at = time.monotonic()

    def _fetch_whole(self, session: ReadSession, keys: list[str]) -> Flow[None]:
        """Read objects with no mapped replica once, whole, into session buffers (verified)."""
        pending = {k: session.entries[k] for k in keys}
        queues = {k: list(e.info.replicas) for k, e in pending.items()}  # type: ignore[union-attr]
        while pending:
            reads = []
            for key, entry in pending.items():
                assert isinstance(entry, _Entry)
                if entry.copy is None:
                    entry.copy = np.empty(entry.info.size_bytes, dtype=np.uint8)
                loc = queues[key].pop(0)
                reads.append((key, Transfer(Op.READ, loc, memoryview(entry.copy), Hasher())))  # type: ignore[arg-type]
            errors = yield Transfers([t for _, t in reads])
            for (key, read), err in zip(reads, errors, strict=True):
                entry = pending[key]
                assert isinstance(entry, _Entry) and read.hasher is not None
                if err is None and read.hasher.intdigest() == entry.info.checksum:
                    self.counters["tcp_reads"] += 1
                    del pending[key]
                    continue
                if err is None:
                    self.counters["checksum_failures"] += 1
                    err = ChecksumMismatchError(f"replica of {key!r} failed its checksum")
                if not queues[key]:
                    entry.copy = None
                    session.entries[key] = err
                    del pending[key]

    def _copy_range(
        self, key: str, entry: _Entry, dest: object, offset: int
    ) -> int | MooncakeError:
        view = as_writable(dest)
        size = entry.info.size_bytes
        if offset < 0 or offset + len(view) > size:
            return InvalidArgumentError(
                f"range [{offset}, +{len(view)}) lies outside {key!r} ({size} bytes)"
            )
        if not len(view):
            return 0
        if entry.copy is not None:
            view[:] = memoryview(entry.copy)[offset : offset + len(view)]  # type: ignore[arg-type]
            return len(view)
        assert entry.local is not None
        pool = self._mapped(entry.local)
        if pool is None:
            return ObjectNotFoundError(f"the pool holding {key!r} is gone")
        obj = pool[entry.local.offset : entry.local.offset + size]
        first, last = offset // CHUNK_BYTES, max(offset, offset + len(view) - 1) // CHUNK_BYTES
        for c in range(first, last + 1):  # every chunk the range touches, checked in place
            if chunk_digest(obj[c * CHUNK_BYTES : (c + 1) * CHUNK_BYTES]) != entry.digests[c]:
                self.counters["checksum_failures"] += 1
                return ChecksumMismatchError(f"chunk {c} of {key!r} no longer matches its digest")
        view[:] = obj[offset : offset + len(view)]
        self.counters["shm_reads"] += 1
        return len(view)
