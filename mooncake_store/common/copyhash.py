"""Copy a buffer and return the digest of the bytes written, in one pass where it can.

`copy_digest(dest, src)` copies `src` into `dest` (one length) and returns xxh3_64 (seed 0) of
`dest` afterwards: one chunk digest of the store's checksum (common/checksum.py) when the two
are one chunk, the whole checksum of an object of up to 1 MiB.

Where the package was built with its C kernel (mooncake_store/native/copyhash.c), each 64-byte
stripe is loaded once, stored, and hashed from the same registers, with streaming stores into
aligned destinations from 128 KiB: a 4 MiB copy-and-hash between cold buffers costs less than a
plain memcpy of it (README "Performance").  Without it (no compiler at install time, or
MOONCAKE_NATIVE_COPY=0 in the environment) numpy copies and xxhash hashes the copy: the same
bytes and the same digests, about 1.3x the time.  `KERNEL` says which runs: "avx2", "sse2",
"portable" (the C module's memcpy then hash) or "numpy".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from mooncake_store.common.checksum import chunk_digest

SMALL_COPY = 128 * 1024  # below: a slice assignment (numpy's call overhead would double it)


def _load() -> ModuleType | None:
    if os.environ.get("MOONCAKE_NATIVE_COPY", "1") == "0":
        return None
    try:
        from mooncake_store import _copyhash  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _copyhash  # type: ignore[no-any-return]


def numpy_copy_digest(dest: Any, src: Any) -> int:
    """The fallback: numpy's copy, then xxh3 of the copy (in cache up to a chunk)."""
    to, frm = memoryview(dest).cast("B"), memoryview(src).cast("B")
    if len(to) != len(frm):
        raise ValueError(f"copy of {len(frm)} bytes into a buffer of {len(to)}")
    if len(frm) <= SMALL_COPY:
        to[:] = frm
    else:
        np.copyto(np.frombuffer(to, dtype=np.uint8), np.frombuffer(frm, dtype=np.uint8))
    return chunk_digest(to)


_native = _load()
KERNEL: str = _native.kernel() if _native is not None else "numpy"
copy_digest: Callable[[Any, Any], int] = (
    _native.copy_digest if _native is not None else numpy_copy_digest
)
#: copy_digest_parts(region, parts, into_parts): region -> parts (into_parts) or parts ->
#: region, one pass over all the parts; None without the kernel (client/steps.py falls back).
copy_digest_parts: Callable[[Any, Any, bool], int] | None = (
    _native.copy_digest_parts if _native is not None else None
)
