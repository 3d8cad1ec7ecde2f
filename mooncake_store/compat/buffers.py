"""Integer addresses as buffers: Mooncake's zero-copy calls pass (pointer, size) pairs.

Host memory becomes a memoryview over the address (ctypes, no copy), so the SDK copies
straight between it and a node's pool, or sends and receives on it.  Device memory (CUDA) is
recognised with cupy when cupy and a GPU are present (`cudaPointerGetAttributes`), and becomes
an object with `__cuda_array_interface__`, which the SDK reads into pinned staging and copies
to the device (and copies to the host for a put): the host<->device copy is the transfer
itself, as in Mooncake's TCP transport.  Without cupy every address is taken as host memory,
so an engine that passes GPU pointers needs the `[gpu]` extra; with cupy but no usable GPU,
`DeviceBuffer` raises a clear error instead of touching the address.
"""

from __future__ import annotations

import ctypes
from typing import Any

from mooncake_store.common.errors import InvalidArgumentError

_CUDA_DEVICE, _CUDA_MANAGED = 2, 3  # cudaMemoryType values of device memory


def host_view(address: int, size: int) -> memoryview:
    """A writable byte view of `size` bytes of host memory at `address` (no copy)."""
    if address <= 0 or size < 0:
        raise InvalidArgumentError(f"bad buffer: address {address:#x}, size {size}")
    if size == 0:
        return memoryview(bytearray())
    return memoryview((ctypes.c_ubyte * size).from_address(address)).cast("B")


class DeviceBuffer:
    """`size` bytes of CUDA device memory at `address`, as a cupy-compatible array."""

    def __init__(self, address: int, size: int) -> None:
        self.address = address
        self.size = size
        self.__cuda_array_interface__ = {
            "shape": (size,),
            "typestr": "|u1",
            "data": (address, False),
            "version": 3,
            "strides": None,
        }


_CUPY: list[Any] = []  # [cupy or None] once looked up: an import attempt costs ~100 us


def _cupy() -> Any:
    if not _CUPY:
        try:
            import cupy

            _CUPY.append(cupy if cupy.is_available() else None)
        except Exception:
            _CUPY.append(None)
    return _CUPY[0]


def is_device_address(address: int) -> bool:
    """True when `address` is CUDA device (or managed) memory; False without cupy or a GPU."""
    cupy = _cupy()
    if cupy is None:
        return False
    try:
        kind = cupy.cuda.runtime.pointerGetAttributes(address).type
    except Exception:
        return False
    return kind in (_CUDA_DEVICE, _CUDA_MANAGED)


class Buffers:
    """The regions an engine registered (register_buffer) and the view of any (ptr, size)."""

    def __init__(self) -> None:
        self._regions: dict[int, tuple[int, bool]] = {}  # start -> (size, on a device)

    def register(self, address: int, size: int) -> None:
        if address <= 0 or size <= 0:
            raise InvalidArgumentError(f"bad buffer: address {address:#x}, size {size}")
        self._regions[address] = (size, is_device_address(address))

    def unregister(self, address: int) -> bool:
        return self._regions.pop(address, None) is not None

    def _on_device(self, address: int) -> bool:
        for start, (size, device) in self._regions.items():
            if start <= address < start + size:
                return device
        return is_device_address(address)

    def view(self, address: int, size: int) -> memoryview | DeviceBuffer:
        """The buffer at `address`: a host memoryview, or a DeviceBuffer for GPU memory."""
        if self._on_device(address):
            if _cupy() is None:
                raise InvalidArgumentError(
                    f"{address:#x} is GPU memory but no CUDA GPU is usable through cupy here"
                )
            return DeviceBuffer(address, size)
        return host_view(address, size)
