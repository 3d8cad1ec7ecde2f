"""The master process's start-up and memory helpers: opening the metadata store, large
allocations in their own mappings, and freezing long-lived objects out of the collector."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path

from mooncake_store.common.daemon import StartupError
from mooncake_store.master.config import MasterConfig
from mooncake_store.master.persistence import MetadataStore

# Python's full (generation 2) collection walks every tracked object: ~0.67 s per million
# blocks here, a multi-second stall of the master's one loop at 10M blocks, and it runs every time
# the survivors grow by a quarter.  The metadata is acyclic (reference counting frees it), so
# the master moves what survived into the permanent generation every few seconds; young cycles
# (asyncio's) are still collected by the cheap younger generations.
GC_FREEZE_INTERVAL_S = 10.0


def map_large_allocations() -> bool:
    """Serve allocations of 1 MiB and more with their own mappings (glibc only).

    The table's columns grow by realloc.  Below glibc's mmap threshold (which rises on its own
    up to 32 MiB), every step copies into the heap and leaves the old buffer behind as a hole
    that RSS keeps: ~70 bytes per block at a million blocks.  A mapped buffer grows in place
    (mremap).  Returns False where there is no glibc mallopt to call.
    """
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_mmap_threshold = -3
    return bool(mallopt(m_mmap_threshold, 1 << 20))


def open_metadata(data_dir: Path, config: MasterConfig) -> MetadataStore:
    """Open the RocksDB metadata under `data_dir`; a locked or unusable one is a StartupError."""
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        return MetadataStore(
            data_dir / "rocksdb", sync=config.sync_commits, sync_interval_s=config.sync_interval_s
        )
    except Exception as exc:
        text = str(exc)
        if "lock" in text.lower():
            raise StartupError(
                f"data dir {data_dir} is in use by another master (RocksDB's LOCK is held): "
                "stop that master or pass another --data-dir"
            ) from exc
        raise StartupError(
            f"cannot open the metadata in {data_dir}: {text.splitlines()[0] if text else exc!r}; "
            "check the directory's permissions and free space, or pass another --data-dir"
        ) from exc


def freeze_long_lived() -> None:
    """Collect the young generations, then exempt every survivor from future collections."""
    gc.collect(1)
    gc.freeze()
