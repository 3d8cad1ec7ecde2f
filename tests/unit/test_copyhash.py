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


def _cut(rng: np.random.Generator, n: int, count: int) -> list[int]:
    points = sorted(int(x) for x in rng.integers(0, n + 1, count - 1))
    return [b - a for a, b in zip([0, *points], [*points, n], strict=True)]


@pytest.mark.skipif(_copyhash is None, reason="built without the C kernel")
@pytest.mark.parametrize("kernel", KERNELS)
def test_parts_copies_both_ways_hash_the_bytes_written(kernel):
    """copy_digest_parts between one region and parts cut anywhere (empty parts, parts of
    a few bytes, stripes straddling two parts), out of the region (a read into the caller's
    buffers) and into it (a scatter-gather put)."""
    _copyhash.use_kernel(kernel)
    try:
        rng = np.random.default_rng(17)
        source = rng.integers(0, 256, CHUNK_BYTES + 64, dtype=np.uint8)
        for trial in range(300):
            choices = [rng.integers(1, 300), rng.integers(241, 5000),
                       rng.integers(1, CHUNK_BYTES), CHUNK_BYTES, 128 * 1024]  # fmt: skip
            n = int(rng.choice(choices))
            sizes = _cut(rng, n, int(rng.choice([2, 3, 5, 17, 64])))
            data = source[trial % 64 : trial % 64 + n]
            want = xxhash.xxh3_64_intdigest(data.tobytes())
            arena = np.full(n + 64 * len(sizes) + 64, 0x5A, dtype=np.uint8)
            parts, at = [], trial % 33
            for size in sizes:
                parts.append(arena[at : at + size])
                at += size + int(rng.integers(0, 40))
            assert _copyhash.copy_digest_parts(data, parts, True) == want, (n, sizes)
            assert np.array_equal(np.concatenate(parts), data), (n, sizes)
            space = np.full(n + 80, 0x33, dtype=np.uint8)
            region = space[7 : 7 + n]
            assert _copyhash.copy_digest_parts(region, parts, False) == want, (n, sizes)
            assert np.array_equal(region, data) and (space[:7] == 0x33).all()
            assert (space[7 + n :] == 0x33).all()
    finally:
        _copyhash.use_kernel(_DEFAULT)


@pytest.mark.skipif(_copyhash is None, reason="built without the C kernel")
def test_parts_copy_refuses_bad_arguments():
    with pytest.raises(ValueError, match="parts of 9 bytes for a region of 10"):
        _copyhash.copy_digest_parts(bytearray(10), [bytearray(4), bytearray(5)], False)
    with pytest.raises(ValueError, match="parts of 0 bytes"):
        _copyhash.copy_digest_parts(bytearray(0), [], False)
    with pytest.raises(BufferError):  # the region is written by a put: it must be writable
        _copyhash.copy_digest_parts(bytes(10), [bytearray(10)], False)
    with pytest.raises(BufferError):  # the parts are written by a read
        _copyhash.copy_digest_parts(bytearray(10), [b"x" * 10], True)
    with pytest.raises(ValueError, match="C-contiguous"):
        _copyhash.copy_digest_parts(np.zeros(20, np.uint8), [np.zeros(40, np.uint8)[::2]], True)


@pytest.mark.parametrize("native", [True, False])
def test_scatter_gather_copies_match_the_store_checksum(native, monkeypatch):
    """client/steps.py's scatter-gather copies, with the kernel and with the numpy fallback:
    values of several chunks in parts of any size, both ways."""
    from mooncake_store.client import steps

    if not native:
        monkeypatch.setattr(steps, "copy_digest_parts", None)
    elif steps.copy_digest_parts is None:
        pytest.skip("built without the C kernel")
    rng = np.random.default_rng(23)
    for n, count in [
        (3 * CHUNK_BYTES + 5, 7),
        (CHUNK_BYTES, 2),
        (700_000, 4),
        (2 * CHUNK_BYTES, 3),
    ]:
        data = rng.integers(0, 256, n, dtype=np.uint8)
        parts = [np.empty(size, dtype=np.uint8) for size in _cut(rng, n, count)]
        views = [memoryview(p) for p in parts]
        assert steps.copy_out_checksum(memoryview(data), views) == checksum(data)
        assert np.array_equal(np.concatenate(parts), data)
        region = np.zeros(n, dtype=np.uint8)
        assert steps.copy_parts_into(memoryview(region), views) == checksum(data)
        assert np.array_equal(region, data)
    empty = [memoryview(bytearray()), memoryview(bytearray())]  # the empty value: one chunk
    assert steps.copy_out_checksum(memoryview(b""), empty) == checksum(b"")
    assert steps.copy_parts_into(memoryview(bytearray()), empty) == checksum(b"")
