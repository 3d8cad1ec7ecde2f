"""GPU buffers for the client: cupy arrays (or anything with __cuda_array_interface__).

A device buffer that no same-host DMA serves (client/cuda.py) is read into pinned host staging
(pinned memory is what lets the host-to-device copy run near the PCIe limit: ~55 GB/s on an
H200, against ~13 GB/s from pageable memory): over TCP piece by piece, each piece copied up
while the next is received (`DeviceParts.pipeline`, client/recv_pipeline.py); otherwise whole,
then uploaded.  A device value to put is copied to the host first when no DMA serves it.
cupy is imported only when such a buffer shows up.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from mooncake_store.common.errors import InvalidValueError

if TYPE_CHECKING:
    from mooncake_store.client.recv_pipeline import Copier, PipelinedReceive


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


class DeviceTarget:
    """A read's destination in device memory, filled from host staging through a `Copier`
    (client/recv_pipeline.py).  `cuda_target` makes one of a cupy array; `get_into` takes
    either.  Another kind of device memory (or, in tests, a host array standing in for one)
    is a DeviceTarget with its own copier factory and `cuda=None` (no same-host DMA path).

    `delivered` says whether the last read already put the value on the device (a pipelined
    TCP read) or whether it still sits in the host staging (`upload`)."""

    def __init__(self, nbytes: int, copier: Callable[[], Copier], *, cuda: Any = None) -> None:
        self.nbytes = nbytes
        self.copier = copier
        self.cuda = cuda  # the flat uint8 cupy view, for the DMA paths (client/cuda.py)
        self.delivered = False

    def upload(self, host: memoryview) -> None:
        """Copy the verified value from host staging to the device (and wait for it)."""
        copier = self.copier()
        copier.copy(0, host)
        copier.drain()
        self.delivered = True


def cuda_target(obj: Any) -> DeviceTarget:
    """The DeviceTarget of a cupy array (or anything with __cuda_array_interface__)."""
    from mooncake_store.client.cuda import cuda_path
    from mooncake_store.client.recv_pipeline import CudaCopier

    dev = device_bytes(obj)
    return DeviceTarget(int(dev.nbytes), lambda: CudaCopier(dev, cuda_path().stream()), cuda=dev)


def device_target(obj: object) -> DeviceTarget | None:
    """`obj` as a device destination, or None for host memory."""
    if isinstance(obj, DeviceTarget):
        return obj
    if is_device_buffer(obj):
        return cuda_target(obj)
    return None


class DeviceParts(list[memoryview]):
    """The destination parts of a device read: one host staging view (what same-host copies
    and the fallback fill), with the device target.  A TCP read of it is pipelined: pieces
    rotate through the first STAGING_BUFFERS pieces of that staging while each landed piece is
    copied up (`pipeline`)."""

    def __init__(self, staging: memoryview, target: DeviceTarget) -> None:
        super().__init__([staging] if len(staging) else [])
        self.target = target

    def trimmed(self, size: int) -> DeviceParts:
        return DeviceParts(self[0][:size] if self else memoryview(b""), self.target)

    def pipeline(self) -> PipelinedReceive:
        from mooncake_store.client.recv_pipeline import (
            PIECE_BYTES,
            STAGING_BUFFERS,
            PipelinedReceive,
        )

        self.target.delivered = False
        staging = self[0]
        size = len(staging)
        buffers = [staging[k * PIECE_BYTES : (k + 1) * PIECE_BYTES]
                   for k in range(min(STAGING_BUFFERS, -(-size // PIECE_BYTES)))]  # fmt: skip
        return PipelinedReceive(size, buffers, self.target.copier())
