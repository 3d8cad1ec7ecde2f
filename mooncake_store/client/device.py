"""GPU buffers for the client: cupy arrays (or anything with __cuda_array_interface__).

A device buffer is read into a pinned host staging buffer (pinned memory is what lets the
host-to-device copy run near the PCIe/NVLink limit: ~55 GB/s on an H200, against ~13 GB/s from
pageable memory) and then copied to the device; a device value to put is copied to the host
first.  cupy is imported only when such a buffer shows up.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from mooncake_store.common.errors import InvalidValueError


def is_device_buffer(obj: object) -> bool:
    return hasattr(obj, "__cuda_array_interface__")


def device_bytes(obj: Any) -> Any:
    """A flat uint8 cupy view of a C-contiguous device buffer (no copy)."""
    import cupy

    array = cupy.asarray(obj)
    if not array.flags.c_contiguous:
        raise InvalidValueError(
            "device buffer must be C-contiguous; pass cupy.ascontiguousarray(x)"
        )
    return array.reshape(-1).view(cupy.uint8)


class PinnedStaging:
    """Pinned host buffers, reused by size (allocating pinned memory is slow)."""

    def __init__(self) -> None:
        self._free: dict[int, list[np.ndarray]] = {}

    def take(self, size: int) -> np.ndarray:
        free = self._free.get(size)
        if free:
            return free.pop()
        import cupy

        memory = cupy.cuda.alloc_pinned_memory(size)
        return np.frombuffer(memory, dtype=np.uint8, count=size)

    def give(self, buf: np.ndarray) -> None:
        free = self._free.setdefault(buf.nbytes, [])
        if len(free) < 4:
            free.append(buf)


class HostStaging:
    """Warm host buffers for reads that must end in new `bytes` (get / get_many over TCP):
    the data lands in a buffer whose pages are already faulted in, then takes one copy out.
    Reused by size class (powers of two from 64 KiB), a few per class."""

    def __init__(self, per_class: int = 4) -> None:
        self.per_class = per_class
        self.max_kept_bytes = 64 * 1024 * 1024
        self._free: dict[int, list[bytearray]] = {}
        self._lock = threading.Lock()  # the sync Client's threads share one client

    @staticmethod
    def _class(size: int) -> int:
        return max(64 * 1024, 1 << (size - 1).bit_length())

    def take(self, size: int) -> bytearray:
        with self._lock:
            free = self._free.get(self._class(size))
            if free:
                return free.pop()
        return bytearray(self._class(size))

    def give(self, buf: bytearray) -> None:
        if len(buf) > self.max_kept_bytes:
            return
        with self._lock:
            free = self._free.setdefault(len(buf), [])
            if len(free) < self.per_class:
                free.append(buf)


def to_host(obj: Any) -> np.ndarray:
    """Copy a device value to host memory (for put)."""
    return device_bytes(obj).get()
