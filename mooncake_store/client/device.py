"""GPU buffers for the client: cupy arrays (or anything with __cuda_array_interface__).

A device buffer is read into a pinned host staging buffer (pinned memory is what lets the
host-to-device copy run near the PCIe/NVLink limit: ~55 GB/s on an H200, against ~13 GB/s from
pageable memory) and then copied to the device; a device value to put is copied to the host
first.  cupy is imported only when such a buffer shows up.
"""

from __future__ import annotations

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


def to_host(obj: Any) -> np.ndarray:
    """Copy a device value to host memory (for put)."""
    return device_bytes(obj).get()
