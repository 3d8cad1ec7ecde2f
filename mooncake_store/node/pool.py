"""The DRAM tier: one pre-faulted shared-memory segment (memfd) per node.

The segment is a memfd so that a client on the same host can map the very same pages (the node
passes the descriptor over a unix socket) and copy straight into or out of them; the memory is
returned to the system when the node and every client have closed it, even after a kill -9.
The pages are faulted in at start (MADV_POPULATE_WRITE, in chunks that report progress) because
first-touch page faults cost 5-10x a copy on these machines.

The memfd is sealed once it has its size: F_SEAL_SHRINK and F_SEAL_GROW (its size is fixed, so a
process holding the descriptor cannot truncate it and make every mapping of the cut-off pages
raise SIGBUS in the node and in other clients) and F_SEAL_SEAL (nobody can add a seal later, e.g.
F_SEAL_FUTURE_WRITE, which would stop new clients from mapping it writable).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from collections.abc import Callable

import numpy as np

# madvise(MADV_POPULATE_WRITE) (Linux 5.14+): pre-fault a range for writing, chunk by chunk, so a
# big pool can report progress; older kernels get the pages touched one by one instead.
MADV_POPULATE_WRITE = 23
PREFAULT_CHUNK_BYTES = 64 * 1024 * 1024


def prefault(region: mmap.mmap, size_bytes: int,
             progress: Callable[[int, int], None] | None = None) -> None:  # fmt: skip
    """Fault every page of `region` in for writing; `progress(done, total)` after each chunk."""
    pages: np.ndarray | None = None
    for start in range(0, size_bytes, PREFAULT_CHUNK_BYTES):
        length = min(PREFAULT_CHUNK_BYTES, size_bytes - start)
        try:
            if pages is None:
                region.madvise(MADV_POPULATE_WRITE, start, length)
        except OSError:
            pages = np.frombuffer(region, dtype=np.uint8)
        if pages is not None:
            pages[start : start + length : mmap.PAGESIZE] = 0
        if progress is not None:
            progress(start + length, size_bytes)


#: The seals every pool carries (see the module docstring).
POOL_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class SharedPool:
    def __init__(
        self,
        size_bytes: int,
        *,
        name: str = "mooncake-pool",
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.size_bytes = size_bytes
        self.fd = os.memfd_create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(self.fd, size_bytes)
            fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, POOL_SEALS)
            self._map = mmap.mmap(
                self.fd,
                size_bytes,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
            prefault(self._map, size_bytes, progress)
        except OSError:
            os.close(self.fd)
            raise
        self.view = memoryview(self._map)

    def close(self) -> None:
        """Unmap and close (idempotent).  Pages live on while clients still map them."""
        if self.fd < 0:
            return
        try:
            self.view.release()
            self._map.close()
        except BufferError:  # a connection still holds a slice; the mapping dies with the process
            pass
        os.close(self.fd)
        self.fd = -1
