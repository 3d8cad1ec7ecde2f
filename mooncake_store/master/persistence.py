"""RocksDB persistence of committed objects, with group commit.

Committed objects are stored (key `o/<object key>`), the releases owed to nodes for
persistent-tier blocks the master let go of (key `r/<segment id><offset>`, both 8 bytes big
endian: the block's checksum and key; master/releases.py), the blocks of dropped persistent
segments (key `d/<segment id><offset>`, the same record; master/detached.py) and the persistent
segments ever mounted (key `s/<segment id>`, no value).  Pending puts, leases, liveness and
allocator state are rebuilt at start-up.  One writer task gathers every mutation queued while
the previous batch was being written and commits them as one `WriteBatch`.  What `write()`
returning means depends on the durability mode (the master's `sync_commits` and
`sync_interval_s`):

- `sync=True` (`--sync-commits`): the batch is fsync'd before `write()` returns (one fsync for
  the whole group); a commit survives a host crash.
- `sync=False` with `sync_interval_s > 0` (the default, 100 ms): the batch is in RocksDB's
  write-ahead log (the OS holds it: it survives a master crash, kill -9 included) and a
  background thread fsyncs the log at least every `sync_interval_s` while there are unsynced
  writes.  A host crash loses at most that window, and always a suffix of the log (never a
  commit before one that survived).
- `sync=False`, `sync_interval_s == 0`: the log is never fsync'd by the master; the OS writes
  it back when it likes.

The window mode fsyncs in a thread: rocksdict releases the GIL in `flush_wal`, so the loop keeps
serving meanwhile.  rocksdict holds the
GIL during the fsync, which is why per-RPC synced puts would cap the master near 3k writes/s
while grouped ones reach ~250k/s.  A PutEnd with no other put in flight has nobody to wait for,
and is written on the spot (`alone=True`).

Record versions: 5 stores the chunked checksum (common/checksum.py, format 2).  Version 4 stored
the whole-object xxh3_64, which is the same number for objects of up to 1 MiB: those load as
they are; bigger ones cannot be re-hashed here (the master never holds the bytes), so they are
dropped at load with a warning, as evictions.  A node's NVMe tier migrates its own copies and
reports them again, and the master adopts them from that inventory.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from mooncake_store.common.checksum import CHUNK_BYTES
from mooncake_store.common.clock import to_monotonic, to_wall
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.releases import BlockName, ReleaseRecord
from mooncake_store.master.revocations import Revocation

log = logging.getLogger("mooncake.master")

_PREFIX = b"o/"
# version, size, checksum, created, replica count, fingerprint / parent key / tag lengths,
# pinned until (wall clock, see common/clock.py; inf: until removed), wanted replicas; then
# the replicas, then the three variable fields.
_HEADER = struct.Struct("<BQQdHBHHdB")
_REPLICA = struct.Struct("<QQ")  # segment id, offset
_VERSION = 5
_LEGACY_VERSION = 4  # whole-object checksum: valid as is only up to CHUNK_BYTES
_SEGMENT_PREFIX = b"s/"  # + segment id (8 bytes, big endian): a persistent segment, no value
_RELEASE_PREFIX = b"r/"
_RELEASE = struct.Struct("<BQ")  # version, checksum; then the key
_RELEASE_VERSION = 1


_DETACHED_PREFIX = b"d/"  # the same record: a block of a dropped persistent segment
_TOKEN_PREFIX = b"t/"  # + token id: a revoked token (master/revocations.py)
_TOKEN = struct.Struct("<Bqd")  # version, the token's expiry (0: never), revoked at
_TOKEN_VERSION = 1


def _release_key(segment_id: int, offset: int, prefix: bytes = _RELEASE_PREFIX) -> bytes:
    return prefix + segment_id.to_bytes(8, "big") + offset.to_bytes(8, "big")


def encode_release(name: BlockName) -> bytes:
    return _RELEASE.pack(_RELEASE_VERSION, name.checksum) + name.key.encode(
        "utf-8", "surrogatepass"
    )


def decode_release(raw_key: bytes, blob: bytes) -> tuple[int, int, BlockName]:
    if len(raw_key) != len(_RELEASE_PREFIX) + 16 or blob[:1] != bytes([_RELEASE_VERSION]):
        raise ValueError(f"malformed owed-release record {raw_key!r}")
    segment_id = int.from_bytes(raw_key[2:10], "big")
    offset = int.from_bytes(raw_key[10:18], "big")
    _, digest = _RELEASE.unpack_from(blob)
    key = blob[_RELEASE.size :].decode("utf-8", "surrogatepass")
    return segment_id, offset, BlockName(key, digest)


class LegacyChecksumError(ValueError):
    """A version-4 record of an object over 1 MiB: its checksum is of the old format."""


def encode_object(meta: ObjectMeta) -> bytes:
    parent = meta.parent_key.encode("utf-8", "surrogatepass")
    parts = [
        _HEADER.pack(_VERSION, meta.size_bytes, meta.checksum, meta.created_s,
                     len(meta.replicas), len(meta.fingerprint), len(parent), len(meta.tag),
                     to_wall(meta.pin_until_s), min(meta.wanted_replicas, 255))
    ]  # fmt: skip
    parts.extend(_REPLICA.pack(r.segment_id, r.offset) for r in meta.replicas)
    parts += [meta.fingerprint, parent, meta.tag]
    return b"".join(parts)


def decode_object(key: str, blob: bytes) -> ObjectMeta:
    version = blob[0]
    if version not in (_VERSION, _LEGACY_VERSION):
        raise ValueError(f"object record of {key!r} has unknown version {version}")
    _, size_bytes, checksum, created_s, count, n_fp, n_parent, n_tag, pin_until_s, wanted = (
        _HEADER.unpack_from(blob)
    )
    if version == _LEGACY_VERSION and size_bytes > CHUNK_BYTES:
        raise LegacyChecksumError(
            f"object record of {key!r} ({size_bytes} bytes) has a whole-object checksum "
            f"(record version {version}); the chunked checksum needs version {_VERSION}"
        )
    offset = _HEADER.size
    replicas: list[Replica] = []
    for _ in range(count):
        replicas.append(Replica(*_REPLICA.unpack_from(blob, offset)))
        offset += _REPLICA.size
    fingerprint = blob[offset : offset + n_fp]
    offset += n_fp
    parent = blob[offset : offset + n_parent].decode("utf-8", "surrogatepass")
    offset += n_parent
    tag = blob[offset : offset + n_tag]
    return ObjectMeta(
        key, size_bytes, ObjectState.COMPLETE, tuple(replicas), checksum=checksum,
        created_s=created_s, fingerprint=fingerprint, parent_key=parent, tag=tag,
        pin_until_s=to_monotonic(pin_until_s), wanted_replicas=wanted,
    )  # fmt: skip


class MetadataStore:
    """Committed-object records in RocksDB under `path`, written with group commit."""

    def __init__(
        self, path: str | Path, *, sync: bool = True, sync_interval_s: float = 0.0
    ) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        self._path, self._options = str(path), options
        self._db = Rdict(self._path, options)
        self._failed: Exception | None = None  # the last write failed: reopen before the next
        self._syncing = False  # a background fsync is running on the handle
        self.reopened = 0
        self._sync = WriteOptions()
        self._sync.sync = sync  # False: in the WAL (the OS has it), not fsync'd
        # Background fsync of the WAL (only without per-commit fsync): see the module docstring.
        self.sync_interval_s = 0.0 if sync else max(0.0, sync_interval_s)
        self._syncer: asyncio.Task[None] | None = None
        self._sync_thread: ThreadPoolExecutor | None = None
        self._unsynced = False  # written since the last background fsync began
        self.background_syncs = 0
        self.last_sync_s = 0.0  # duration of the last background fsync
        self._queue: list[tuple[dict[bytes, bytes | None], asyncio.Future[None]]] = []
        self._wakeup = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self.batches_written = 0
        self.mutations_written = 0
        self.legacy_dropped = 0  # version-4 records over 1 MiB dropped by load()

    def load(self) -> Iterator[ObjectMeta]:
        """Yield every committed object (call before serving).  Records whose checksum is of
        the old whole-object format and over 1 MiB are deleted, with a warning."""
        legacy: list[bytes] = []
        for raw_key, blob in self._db.items(from_key=_PREFIX):
            assert isinstance(raw_key, bytes) and isinstance(blob, bytes)  # raw mode
            if not raw_key.startswith(_PREFIX):
                break
            key = raw_key[len(_PREFIX) :].decode("utf-8", "surrogatepass")
            try:
                yield decode_object(key, blob)
            except LegacyChecksumError:
                legacy.append(raw_key)
        if legacy:
            log.warning(
                "dropped %d objects over 1 MiB committed with the old whole-object checksum "
                "(record version %d): treated as evicted; NVMe copies come back re-hashed from "
                "their node's inventory", len(legacy), _LEGACY_VERSION,
            )  # fmt: skip
            batch = WriteBatch(raw_mode=True)
            for raw_key in legacy:
                batch.delete(raw_key)
            self._db.write(batch, self._sync)
            self.legacy_dropped = len(legacy)

    def load_releases(self, prefix: bytes = _RELEASE_PREFIX) -> list[tuple[int, int, BlockName]]:
        """Every owed release recorded (call before serving)."""
        out = []
        for raw_key, blob in self._db.items(from_key=prefix):
            assert isinstance(raw_key, bytes) and isinstance(blob, bytes)  # raw mode
            if not raw_key.startswith(prefix):
                break
            out.append(decode_release(raw_key, blob))
        return out

    def load_detached(self) -> list[tuple[int, int, BlockName]]:
        """Every detached block recorded (master/detached.py; call before serving)."""
        return self.load_releases(_DETACHED_PREFIX)

    def load_segments(self) -> set[int]:
        """The persistent segments recorded (call before serving)."""
        out = set()
        for raw_key in self._db.keys(from_key=_SEGMENT_PREFIX):
            assert isinstance(raw_key, bytes)  # raw mode
            if not raw_key.startswith(_SEGMENT_PREFIX):
                break
            out.add(int.from_bytes(raw_key[len(_SEGMENT_PREFIX) :], "big"))
        return out

    def load_revocations(self) -> list[Revocation]:
        """The revoked tokens recorded (master/revocations.py; call before serving)."""
        out = []
        for raw_key, blob in self._db.items(from_key=_TOKEN_PREFIX):
            assert isinstance(raw_key, bytes) and isinstance(blob, bytes)  # raw mode
            if not raw_key.startswith(_TOKEN_PREFIX):
                break
            version, expires_s, revoked_s = _TOKEN.unpack(blob)
            if version != _TOKEN_VERSION:
                raise ValueError(f"revoked token record {raw_key!r} has version {version}")
            out.append(Revocation(raw_key[len(_TOKEN_PREFIX) :].decode(), expires_s, revoked_s))
        return out

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self._writer is None:
            self._writer = loop.create_task(self._write_loop())
        if self._syncer is None and self.sync_interval_s > 0:
            self._sync_thread = ThreadPoolExecutor(1, thread_name_prefix="mooncake-wal-sync")
            self._syncer = loop.create_task(self._sync_loop())

    async def _sync_loop(self) -> None:
        """Fsync the WAL at least every `sync_interval_s` while there are unsynced writes."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self.sync_interval_s - self.last_sync_s))
            if self._unsynced and self._db is not None and self._failed is None:
                self._syncing = True
                try:
                    await loop.run_in_executor(self._sync_thread, self._sync_wal)
                except Exception as exc:  # the next write reopens the store (see _reopen)
                    log.error("background fsync of the metadata WAL failed: %s", exc)
                    self._failed = exc
                finally:
                    self._syncing = False

    def _sync_wal(self) -> None:
        started = time.monotonic()
        self._unsynced = False  # before the fsync: a write landing meanwhile waits for the next
        self._db.flush_wal(True)
        self.last_sync_s = time.monotonic() - started
        self.background_syncs += 1

    async def write(
        self,
        puts: Sequence[ObjectMeta] = (),
        deletes: Sequence[str] = (),
        *,
        releases: Sequence[ReleaseRecord] = (),
        segments: Sequence[int] = (),
        detached: Sequence[ReleaseRecord] = (),
        revoked: Sequence[Revocation] = (),
        unrevoked: Sequence[str] = (),
        alone: bool = False,
    ) -> None:
        """Persist the mutations before returning (fsync'd unless opened with sync=False), in
        one batch: `releases` record owed releases (a name) or end them (None); `segments`
        record persistent segments, `detached` detached blocks (as `releases`); `revoked`
        records revoked tokens, `unrevoked` drops such records (by token id).

        `alone`: the caller knows nothing else is about to commit (no other put is in flight),
        so there is no group to wait for: with nothing queued, the batch is written here and
        now, which saves the writer task's wake-up and lets the framed endpoint answer inline.
        """
        if not (puts or deletes or releases or segments or detached or revoked or unrevoked):
            return
        mutations: dict[bytes, bytes | None] = {}
        for meta in puts:
            mutations[_PREFIX + meta.key.encode("utf-8", "surrogatepass")] = encode_object(meta)
        for key in deletes:
            mutations[_PREFIX + key.encode("utf-8", "surrogatepass")] = None
        for segment_id, offset, name in releases:
            mutations[_release_key(segment_id, offset)] = (
                None if name is None else encode_release(name)
            )
        for segment_id in segments:
            mutations[_SEGMENT_PREFIX + segment_id.to_bytes(8, "big")] = b""
        for segment_id, offset, name in detached:
            mutations[_release_key(segment_id, offset, _DETACHED_PREFIX)] = (
                None if name is None else encode_release(name)
            )
        for record in revoked:
            mutations[_TOKEN_PREFIX + record.token_id.encode()] = _TOKEN.pack(
                _TOKEN_VERSION, record.expires_s, record.revoked_s
            )
        for token_id in unrevoked:
            mutations[_TOKEN_PREFIX + token_id.encode()] = None
        if alone and not self._queue and not self._closing:
            # Queued groups go first (order matters for a key put and removed): none here.
            self._write_group([mutations])
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((mutations, future))
        self._wakeup.set()
        await future

    async def close(self) -> None:
        """Flush what is queued, stop the writer, fsync the log and close the database
        (idempotent)."""
        if self._writer is not None:
            self._closing = True
            self._wakeup.set()
            await self._writer
            self._writer = None
        if self._syncer is not None:
            self._syncer.cancel()
            try:
                await self._syncer  # an fsync in flight finishes first (the thread is not cut)
            except asyncio.CancelledError:
                pass
            self._syncer = None
        if self._sync_thread is not None:
            self._sync_thread.shutdown(wait=True)
            self._sync_thread = None
        if self._db is not None:
            try:
                if not self._sync.sync:
                    self._db.flush_wal(True)  # a clean stop loses nothing in any mode
                self._db.close()
            except Exception as exc:  # a failed store's flush fails too: nothing more to save
                log.warning("closing the metadata store failed: %s", exc)
            self._db = None  # type: ignore[assignment]

    async def _write_loop(self) -> None:
        while True:
            if not self._queue:
                if self._closing:
                    return
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            group, self._queue = self._queue, []
            try:
                self._write_group([mutations for mutations, _ in group])
            except Exception as exc:
                for _, future in group:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for _, future in group:
                if not future.done():
                    future.set_result(None)

    def _write_group(self, group: list[dict[bytes, bytes | None]]) -> None:
        """One WriteBatch for the whole group, synced per the store's options."""
        batch = WriteBatch(raw_mode=True)
        count = 0
        for mutations in group:
            for raw_key, blob in mutations.items():
                if blob is None:
                    batch.delete(raw_key)
                else:
                    batch.put(raw_key, blob)
                count += 1
        # On the loop, not in a thread: rocksdict keeps the GIL through most of the fsync, so a
        # thread bought no overlap and cost two wake-ups (~140 us a commit).  Calls that arrive
        # meanwhile wait in the socket and join the next group.
        if self._failed is not None:
            self._reopen()
        try:
            self._db.write(batch, self._sync)
        except Exception as exc:
            self._failed = exc
            raise
        self._unsynced = True
        self.batches_written += 1
        self.mutations_written += count

    def _reopen(self) -> None:
        """Open the database afresh after a failed write (ENOSPC, an I/O error): RocksDB
        refuses every later write until then, even once space is back.  Raises (and stays
        failed) while it cannot be opened.  A failed write may still have reached the WAL, so
        the caller rewrites the true state of the keys it touched (see service.py)."""
        if self._syncing:  # never close the handle under the fsync thread: the next write will
            raise RuntimeError(f"metadata store failed ({self._failed}); reopening")
        try:
            self._db.close()  # its flush fails too while the disk is full
        except Exception:
            pass
        self._db = Rdict(self._path, self._options)
        log.warning("metadata store reopened after a failed write (%s)", self._failed)
        self._failed = None
        self.reopened += 1
