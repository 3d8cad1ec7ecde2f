"""The GPU tier: one device allocation (cupy) holding a node's hottest blocks.

cupy is imported only here, and only when a node is started with --gpu-bytes.  Blocks reach
the GPU tier by promotion (the master copies the most-read DRAM blocks up) and leave it by
demotion back to DRAM at the tier's high watermark.  Reads from the GPU tier go device-to-host
into a staging buffer and out on the TCP data path; a client reading into a cupy array copies
host-to-device on its side.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from mooncake_store.node.nvme import StagingBuffers


class GpuTier:
    def __init__(self, size_bytes: int, *, device: int = 0) -> None:
        import cupy  # the [gpu] extra; StoreNode checks gpu_count() before getting here

        self._cupy = cupy
        self.device = device
        self.size_bytes = size_bytes - size_bytes % 4096
        self.segment_id = int.from_bytes(os.urandom(8), "little") or 1
        with cupy.cuda.Device(device):
            self.array: Any = cupy.zeros(self.size_bytes, dtype=cupy.uint8)
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.staging = StagingBuffers()

    def read(self, dest: memoryview, offset: int) -> None:
        """Copy device bytes [offset, +len(dest)) into host memory `dest` (blocking)."""
        host = np.frombuffer(dest, dtype=np.uint8)
        with self._cupy.cuda.Device(self.device):
            self.array[offset : offset + len(host)].get(out=host, stream=self.stream)
            self.stream.synchronize()

    def write(self, source: memoryview, offset: int) -> None:
        """Copy host bytes `source` to the device at `offset` (blocking)."""
        host = np.frombuffer(source, dtype=np.uint8)
        with self._cupy.cuda.Device(self.device):
            self.array[offset : offset + len(host)].set(host, stream=self.stream)
            self.stream.synchronize()

    def close(self) -> None:
        self.array = None
