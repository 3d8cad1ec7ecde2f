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
- **Other hosts** (TCP): a node hands out whole extents, so the first ranged read of an object
  in a session fetches the object once into a buffer the session owns, verified whole like any
  get; every later range of it is a copy from that verified buffer.  Over a whole layer-wise
  load this moves each object once, as one get would.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mooncake_store.client.master_client import get_replica_list_call
from mooncake_store.client.steps import Flow, LocalPools, MapPools, Transfer, Transfers
from mooncake_store.client.transport import Hasher
from mooncake_store.client.types import ReplicaList, ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES, chunk_digest, combine
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
    digests: list[int] = field(default_factory=list)  # its verified chunk digests
    copy: np.ndarray | None = None  # the verified whole object (fetched over TCP)


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
    """Ranged reads of AsyncClient (a mixin: the state is the client's)."""

    counters: dict[str, int]

    def _session_flow(self, keys: Sequence[str]) -> Flow[ReadSession]:
        keys = [validate_key(k) for k in keys]
        results = yield get_replica_list_call(keys, b"")
        session = ReadSession(list(keys), {}, time.monotonic())
        yield MapPools([loc for r in results if isinstance(r, ReplicaList) for loc in r.replicas])
        for key, result in zip(keys, results, strict=True):
            session.entries[key] = result if isinstance(result, MooncakeError) else _Entry(result)
            if isinstance(result, ReplicaList):
                session.entries[key] = self._verify_in_place(key, _Entry(result))
        return session

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

    def _ranges_flow(
        self, session: ReadSession, reads: Sequence[tuple[str, Sequence[Range]]]
    ) -> Flow[list[list[int | MooncakeError]]]:
        """Copy each (destination, object offset) range of each key: per range, the bytes
        copied (the destination's length) or the MooncakeError that stopped it."""
        if session.closed:
            raise InvalidArgumentError("this read session is closed; open a new one")
        if time.monotonic() - session.leased_at > RENEW_AFTER_S:
            yield from self._renew(session)
        fetch = [
            key for key, _ in reads
            if isinstance(e := session.entries.get(key), _Entry) and e.local is None
            and e.copy is None
        ]  # fmt: skip
        if fetch:
            yield from self._fetch_whole(session, list(dict.fromkeys(fetch)))
        out: list[list[int | MooncakeError]] = []
        for key, ranges in reads:
            error = session.error(key)
            results: list[int | MooncakeError] = []
            for dest, offset in ranges:
                results.append(error or self._copy_range(key, session.entries[key], dest, offset))  # type: ignore[arg-type]
            out.append(results)
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
        from mooncake_store.client.steps import as_writable

        view = as_writable(dest)
        size = entry.info.size_bytes
        if offset < 0 or offset + len(view) > size:
            return InvalidArgumentError(
                f"range [{offset}, +{len(view)}) lies outside {key!r} ({size} bytes)"
            )
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
