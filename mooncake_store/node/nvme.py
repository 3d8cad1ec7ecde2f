"""The NVMe tier: one preallocated file of blocks plus a durable index, surviving restarts.

Layout under the tier's directory:
    segment.json   the segment id and size (stable across restarts, so the master can
                   reconcile its records with what is on disk)
    blocks.dat     the data file, preallocated; the master allocates extents in it
    index/         RocksDB: data-file offset -> (key, size, checksum, fingerprint, parent, tag)

Why one big file and not a file per block: extents come from the master's allocator like every
other tier (one code path for allocation, eviction and grants), there is no per-block inode,
open or fsync cost, and O_DIRECT needs nothing more than aligned offsets and buffers, which the
master's 4 KiB alignment and the page-aligned pools give.  I/O is `os.pwrite`/`os.preadv`
with O_DIRECT where the filesystem allows it (2-4x faster than buffered here, and blocks are
not cached twice), buffered with `posix_fadvise(DONTNEED)` where it does not; callers run it
on a thread pool, never on the event loop.

On start the node verifies every indexed block against its checksum; blocks that no longer
match are dropped from the index and never served.  The survivors are reported to the master
as the segment's inventory.

`segment.json` names the checksum format of the index (`checksum_format`, see
common/checksum.py).  A tier written before the chunked checksum (no such field) is migrated on
its first start: a block over 1 MiB whose bytes match the old whole-object hash is re-hashed
and re-indexed with the chunked checksum; blocks up to 1 MiB have the same checksum in both.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
from dataclasses import replace
from pathlib import Path

from rocksdict import Options, Rdict, WriteBatch, WriteOptions

from mooncake_store.common.blocks import BlockRecord
from mooncake_store.common.checksum import CHUNK_BYTES, FORMAT, checksum, legacy_checksum

log = logging.getLogger("mooncake.node")

PAGE = 4096
_RECORD = struct.Struct("<QQHBHH")  # size, checksum, key len, fingerprint len, parent len, tag len


def _encode(block: BlockRecord) -> bytes:
    key = block.key.encode("utf-8", "surrogatepass")
    parent = block.parent_key.encode("utf-8", "surrogatepass")
    head = _RECORD.pack(block.size_bytes, block.checksum, len(key), len(block.fingerprint),
                        len(parent), len(block.tag))  # fmt: skip
    return head + key + block.fingerprint + parent + block.tag


def _decode(offset: int, blob: bytes) -> BlockRecord:
    size, checksum, nk, nf, np_, nt = _RECORD.unpack_from(blob)
    pos = _RECORD.size
    key = blob[pos : pos + nk].decode("utf-8", "surrogatepass")
    pos += nk
    fingerprint = blob[pos : pos + nf]
    pos += nf
    parent = blob[pos : pos + np_].decode("utf-8", "surrogatepass")
    pos += np_
    return BlockRecord(key, offset, size, checksum, fingerprint, parent, blob[pos : pos + nt])


def aligned(size: int) -> int:
    return max(PAGE, (size + PAGE - 1) // PAGE * PAGE)


class StagingBuffers:
    """Page-aligned scratch buffers (O_DIRECT needs them), reused by size."""

    def __init__(self) -> None:
        self._free: dict[int, list[mmap.mmap]] = {}
        self._lock = threading.Lock()

    def take(self, size: int) -> mmap.mmap:
        size = aligned(size)
        with self._lock:
            free = self._free.get(size)
            if free:
                return free.pop()
        return mmap.mmap(-1, size)

    def give(self, buf: mmap.mmap) -> None:
        with self._lock:
            free = self._free.setdefault(len(buf), [])
            if len(free) < 4:
                free.append(buf)


class NvmeTier:
    def __init__(self, directory: str | Path, size_bytes: int) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.size_bytes = size_bytes - size_bytes % PAGE
        meta_path = self.directory / "segment.json"
        data_path = self.directory / "blocks.dat"
        old = json.loads(meta_path.read_text()) if meta_path.exists() else None
        fresh = old is None or old.get("size_bytes") != self.size_bytes
        meta: dict[str, int] = old or {}
        if fresh:
            if old is not None:
                log.warning("NVMe tier size changed (%s -> %s bytes): starting it empty",
                            old.get("size_bytes"), self.size_bytes)  # fmt: skip
            meta = {"segment_id": int.from_bytes(os.urandom(8), "little") or 1,
                    "size_bytes": self.size_bytes, "checksum_format": FORMAT}  # fmt: skip
            for stale in (data_path,):
                stale.unlink(missing_ok=True)
        self.segment_id: int = int(meta["segment_id"])
        self._meta_path = meta_path
        self._meta = meta
        # Format 1 (field absent): whole-object xxh3_64; migrated by the first load().
        self.checksum_format = int(meta.get("checksum_format", 1))
        self.fd, self.direct = self._open(data_path)
        os.posix_fallocate(self.fd, 0, self.size_bytes)
        options = Options(raw_mode=True)
        options.create_if_missing(True)
        index_path = self.directory / "index"
        if fresh and index_path.exists():
            Rdict.destroy(str(index_path), options)
        self._index = Rdict(str(index_path), options)
        self._index_lock = threading.Lock()  # Move and Release run on the node's I/O threads
        self._sync = WriteOptions()
        self._sync.sync = True
        if fresh:
            self._write_meta()
        self.staging = StagingBuffers()
        self.reads = 0
        self.writes = 0

    def _write_meta(self) -> None:
        tmp = self._meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._meta))
        os.replace(tmp, self._meta_path)

    @staticmethod
    def _open(path: Path) -> tuple[int, bool]:
        flags = os.O_RDWR | os.O_CREAT
        try:
            fd = os.open(path, flags | os.O_DIRECT, 0o600)
        except OSError:
            return os.open(path, flags, 0o600), False
        probe = mmap.mmap(-1, PAGE)  # some filesystems accept the flag but fail the I/O
        try:
            os.preadv(fd, [probe], 0)
        except OSError:
            os.close(fd)
            return os.open(path, flags, 0o600), False
        finally:
            probe.close()
        return fd, True

    # ---- block I/O (blocking: call from a thread) ---------------------------------------------

    def write(self, source: memoryview, offset: int) -> None:
        """Write `source` (page-aligned, length a multiple of the page) at `offset`."""
        self._check(offset, len(source))
        done = 0
        while done < len(source):
            done += os.pwrite(self.fd, source[done:], offset + done)
        if not self.direct:
            os.posix_fadvise(self.fd, offset, len(source), os.POSIX_FADV_DONTNEED)
        self.writes += 1

    def read(self, dest: memoryview, offset: int) -> None:
        """Fill `dest` (page-aligned, length a multiple of the page) from `offset`."""
        self._check(offset, len(dest))
        done = 0
        while done < len(dest):
            n = os.preadv(self.fd, [dest[done:]], offset + done)
            if n <= 0:
                raise OSError(f"short read at {offset + done} of the NVMe tier")
            done += n
        self.reads += 1

    def _check(self, offset: int, length: int) -> None:
        if offset % PAGE or length % PAGE or offset + length > self.size_bytes:
            raise ValueError(f"unaligned or out-of-range NVMe access [{offset}, +{length})")

    def sync(self) -> None:
        os.fdatasync(self.fd)

    # ---- index ----------------------------------------------------------------------------------

    def index(self, blocks: list[BlockRecord]) -> None:
        """Record blocks durably (call after `sync`, so the index never names unwritten data)."""
        batch = WriteBatch(raw_mode=True)
        for block in blocks:
            batch.put(block.offset.to_bytes(8, "big"), _encode(block))
        with self._index_lock:
            self._index.write(batch, self._sync)

    def forget(self, offsets: list[int]) -> None:
        """Drop the index entries at `offsets`, whatever they name."""
        batch = WriteBatch(raw_mode=True)
        for offset in offsets:
            batch.delete(offset.to_bytes(8, "big"))
        with self._index_lock:
            self._index.write(batch, self._sync)

    def release(self, blocks: list[tuple[int, str, int]]) -> int:
        """Drop the index entries of the blocks (offset, key, checksum) the master released,
        each only while its offset still holds that block: a release that comes after another
        block went to the same offset leaves that block indexed.  Returns how many went."""
        batch = WriteBatch(raw_mode=True)
        gone = 0
        with self._index_lock:  # no Move indexes a block between the check and the delete
            for offset, key, digest in blocks:
                raw = offset.to_bytes(8, "big")
                blob = self._index.get(raw)
                if not isinstance(blob, bytes):
                    continue
                held = _decode(offset, blob)
                if held.key == key and held.checksum == digest:
                    batch.delete(raw)
                    gone += 1
                else:
                    log.info("kept the NVMe block %r at offset %d: a release named %r there",
                             held.key, offset, key)  # fmt: skip
            if gone:
                self._index.write(batch, self._sync)
        return gone

    def load_index(self) -> list[BlockRecord]:
        """Every indexed block, as recorded (no verification)."""
        out = []
        for raw_offset, blob in self._index.items():
            assert isinstance(raw_offset, bytes) and isinstance(blob, bytes)
            out.append(_decode(int.from_bytes(raw_offset, "big"), blob))
        return out

    def load(self) -> list[BlockRecord]:
        """Every indexed block whose bytes still match their checksum; the rest are forgotten.
        An index of checksum format 1 is migrated to the current format on the way."""
        good: list[BlockRecord] = []
        bad: list[int] = []
        migrated: list[BlockRecord] = []
        legacy = self.checksum_format < FORMAT
        for block in self.load_index():
            buf = self.staging.take(block.size_bytes)
            try:
                self.read(memoryview(buf), block.offset)
                data = memoryview(buf)[: block.size_bytes]
                digest = checksum(data)
                ok = digest == block.checksum
                if not ok and legacy and block.size_bytes > CHUNK_BYTES:
                    ok = legacy_checksum(data) == block.checksum
                    if ok:
                        block = replace(block, checksum=digest)
                        migrated.append(block)
            except (OSError, ValueError):
                ok = False
            finally:
                self.staging.give(buf)
            if ok:
                good.append(block)
            else:
                bad.append(block.offset)
        if bad:
            log.warning("dropping %d NVMe blocks that failed their checksum", len(bad))
            self.forget(bad)
        if legacy:
            if migrated:
                self.index(migrated)
            log.info("NVMe tier: checksum format %d -> %d, %d blocks re-hashed",
                     self.checksum_format, FORMAT, len(migrated))  # fmt: skip
            self._meta["checksum_format"] = self.checksum_format = FORMAT
            self._write_meta()
        return good

    def close(self) -> None:
        if self.fd >= 0:
            self._index.close()
            os.close(self.fd)
            self.fd = -1
