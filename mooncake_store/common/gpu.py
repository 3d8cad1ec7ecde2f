"""GPU detection that never raises: cupy is an optional extra, imported only when asked."""

from __future__ import annotations

import os
import struct

# What a node's GPU hand-off socket (`<shm socket>.gpu`) sends a same-host process: the GPU
# tier's segment id, size, CUDA device ordinal and cudaIpcMemHandle_t (node/gpu.py GpuHandoff,
# client/cuda.py).  Refused: common/shm_handoff.REFUSED instead.
GPU_HELLO = struct.Struct("<QQi64s")


def gpu_count() -> int:
    """CUDA devices usable through cupy; 0 without cupy, without a driver, or when disabled
    with MOONCAKE_DISABLE_GPU=1."""
    if os.environ.get("MOONCAKE_DISABLE_GPU") == "1":
        return 0
    try:
        import cupy
    except ImportError:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except Exception:
        return 0
