"""How much memory the node may take, and progress lines while a big pool is pre-faulted."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from mooncake_store.common.units import format_size

log = logging.getLogger("mooncake.node")

# Pools from this size log their pre-faulting progress (about 1 s per GiB here).
PROGRESS_FROM_BYTES = 1024**3


def available_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """The kernel's MemAvailable estimate, or None where it cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_problem(dram_bytes: int, available: int | None) -> str | None:
    """Why a pool of `dram_bytes` cannot be pre-faulted with `available` bytes free, or None."""
    if available is None or dram_bytes <= available:
        return None
    return (
        f"--dram {format_size(dram_bytes)} is more than the {format_size(available)} of memory "
        f"available on this host (MemAvailable): pass a smaller --dram, e.g. "
        f"--dram {max(1, available // 2 // 2**20)}MiB"
    )


def progress_logger(
    what: str,
    total_bytes: int,
    *,
    every_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[int, int], None] | None:
    """A `progress(done, total)` callback that logs at most every `every_s`, for big pools."""
    if total_bytes < PROGRESS_FROM_BYTES:
        return None
    started = clock()
    last = [started]

    def progress(done: int, total: int) -> None:
        now = clock()
        if done < total and now - last[0] < every_s:
            return
        last[0] = now
        log.info("%s: %s of %s pre-faulted (%.0f%%, %.1fs)", what, format_size(done),
                 format_size(total), 100 * done / total, now - started)  # fmt: skip

    return progress
