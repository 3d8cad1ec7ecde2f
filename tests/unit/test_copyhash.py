"""The one-pass copy-and-hash kernel (mooncake_store/native/copyhash.c) against xxhash.

Every kernel this machine can run (AVX2, SSE2, the portable memcpy-then-hash) and the numpy
fallback must copy every byte exactly, touch nothing around the destination, and return
xxh3_64 of what they wrote, for sizes around each of the kernel's boundaries (XXH3's 240-byte
long-input path, its 1 KiB blocks and 64-byte stripes, the 128 KiB streaming-store threshold,
a 1 MiB checksum chunk) and for every alignment of source and destination.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import xxhash

from mooncake_store.common import copyhash
from mooncake_store.common.checksum import CHUNK_BYTES, checksum

try:
    from mooncake_store import _copyhash  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: only the numpy fallback runs
    _copyhash = None
# The module's own kernel at import (copyhash.KERNEL is "numpy" under MOONCAKE_NATIVE_COPY=0)
_DEFAULT = _copyhash.kernel() if _copyhash is not None else None

SIZES = [0, 1, 63, 64, 65, 240, 241, 256, 1023, 1024, 1025, 1088, 4096 + 17, 65536,
         128 * 1024 - 1, 128 * 1024, 128 * 1024 + 1, 300_001,
         CHUNK_BYTES - 64, CHUNK_BYTES]  # fmt: skip
OFFSETS = [0, 1, 8, 16, 31, 32, 33]


def _kernels() -> list[str]:
    if _copyhash is None:
        return []
    out = []
    for name in ("avx2", "sse2", "portable"):
        try:
            _copyhash.use_kernel(name)
        except ValueError:  # not this machine's
            continue
        out.append(name)
    _copyhash.use_kernel(_DEFAULT)
    return out


KERNELS = _kernels()


@pytest.fixture(params=[*KERNELS, "numpy"])
def copy_digest(request):
    if request.param == "numpy":
        yield copyhash.numpy_copy_digest
        return
    _copyhash.use_kernel(request.param)
    try:
        yield _copyhash.copy_digest
    finally:
        _copyhash.use_kernel(_DEFAULT)


def test_every_size_and_alignment_copies_exactly_and_hashes_what_it_wrote(copy_digest):
    rng = np.random.default_rng(7)
    source = rng.integers(0, 256, CHUNK_BYTES + 64, dtype=np.uint8)
    for size in SIZES:
        for src_at in (0, 5, 32):
            src = source[src_at : src_at + size]
            want = xxhash.xxh3_64_intdigest(src.tobytes())
            for dest_at in OFFSETS:
                space = np.full(size + 96, 0xA5, dtype=np.uint8)
                dest = space[dest_at : dest_at + size]
                assert copy_digest(memoryview(dest), memoryview(src)) == want, (size, dest_at)
                assert np.array_equal(dest, src), (size, src_at, dest_at)
                assert (space[:dest_at] == 0xA5).all() and (space[dest_at + size :] == 0xA5).all()


def test_digests_match_the_store_checksum_of_a_chunk(copy_digest):
    data = np.random.default_rng(3).integers(0, 256, CHUNK_BYTES, dtype=np.uint8)
    dest = bytearray(CHUNK_BYTES)
    assert copy_digest(dest, data) == checksum(data) == checksum(dest)


def test_overlapping_buffers_move_as_memmove_does(copy_digest):
    for shift in (-4096, -1, 1, 64, 4096):
        space = np.random.default_rng(9).integers(0, 256, 600_000, dtype=np.uint8)
        size, at = 500_000, 50_000
        want = space[at : at + size].copy()
        dest = space[at + shift : at + shift + size]
        digest = copy_digest(memoryview(dest), memoryview(space[at : at + size]))
        assert np.array_equal(dest, want), shift
        assert digest == xxhash.xxh3_64_intdigest(want.tobytes())


def test_any_buffer_types_and_bad_arguments(copy_digest):
    floats = np.arange(4096, dtype=np.float16)  # a KV tensor's dtype: copied as bytes
    dest = np.zeros_like(floats)
    assert copy_digest(memoryview(dest), memoryview(floats)) == xxhash.xxh3_64_intdigest(
        floats.tobytes()
    )
    assert np.array_equal(dest, floats)
    with pytest.raises(ValueError, match="into a buffer of"):
        copy_digest(bytearray(10), b"x" * 11)
    with pytest.raises(TypeError):
        copy_digest(b"read-only", b"read-only")  # a destination must be writable


@pytest.mark.skipif(_copyhash is None, reason="built without the C kernel")
def test_the_copy_runs_without_the_gil():
    """While one thread copies 256 MiB in one call, another thread runs Python: it records
    times strictly inside the call, which it could not if the call held the GIL."""
    src = np.ones(256 << 20, dtype=np.uint8)
    dest = np.zeros_like(src)
    stamps: list[float] = []
    stop = threading.Event()

    def stamp() -> None:
        while not stop.is_set():
            stamps.append(time.perf_counter())

    stamper = threading.Thread(target=stamp)
    stamper.start()
    try:
        time.sleep(0.01)
        started = time.perf_counter()
        _copyhash.copy_digest(dest, src)
        ended = time.perf_counter()
    finally:
        stop.set()
        stamper.join()
    margin = (ended - started) / 4
    inside = [t for t in stamps if started + margin < t < ended - margin]
    assert inside, f"no Python ran during a {ended - started:.3f} s copy"
    assert dest.all()


@pytest.mark.skipif(_copyhash is None, reason="built without the C kernel")
def test_environment_switch_selects_the_numpy_fallback():
    code = "from mooncake_store.common import copyhash; print(copyhash.KERNEL)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"MOONCAKE_NATIVE_COPY": "0", "PATH": ""}, check=True)  # fmt: skip
    assert out.stdout.strip() == "numpy"
    with pytest.raises(ValueError, match="not available"):
        _copyhash.use_kernel("neon")
