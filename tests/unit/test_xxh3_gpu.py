"""The GPU checksum's arithmetic, on the CPU: the NumPy reference of the block decomposition
(common/xxh3_blocks.py) and the host build of the CUDA kernel file (client/xxh3_gpu.cu,
compiled with gcc), both against the xxhash package; and the kernel file compiled by nvcc.
No GPU is needed; the gcc and nvcc tests skip cleanly where the compiler is missing."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import xxhash

from mooncake_store.client.gpu_checksum import (
    KERNEL_SOURCE,
    Geometry,
    assemble,
    launch,
    tail_range,
)
from mooncake_store.common.checksum import CHUNK_BYTES, checksum
from mooncake_store.common.xxh3_blocks import (
    SECRET,
    block_sums,
    counted_stripes,
    full_blocks,
    xxh3_64_blocks,
)

MIB = CHUNK_BYTES
# Every boundary the decomposition treats apart: the short/long switch (240/241), stripes
# (64), blocks (1024), the last stripe overlapping the partial block, odd lengths, a full chunk.
CHUNK_LENGTHS = [
    241, 242, 255, 256, 257, 319, 320, 321, 383, 1000, 1023, 1024, 1025, 1087, 1088, 1089,
    1151, 1152, 2047, 2048, 2049, 3071, 4096 + 63, 16 * 1024 + 1, 65535, 65536, 65537,
    MIB - 1025, MIB - 1024, MIB - 65, MIB - 64, MIB - 63, MIB - 1, MIB,
]  # fmt: skip
# Objects of several chunks: the last chunk long, exactly one byte, at most 240 bytes, 241.
OBJECT_LENGTHS = [
    1, 16, 17, 128, 129, 240, *CHUNK_LENGTHS, MIB + 1, MIB + 64, MIB + 240, MIB + 241,
    2 * MIB, 2 * MIB + 1025, 3 * MIB + 4093,
]  # fmt: skip


def _data(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + n).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("n", [*CHUNK_LENGTHS, MIB + 1, 2 * MIB + 7])
def test_numpy_block_decomposition_is_xxh3(n):
    data = _data(n)
    assert xxh3_64_blocks(data) == xxhash.xxh3_64_intdigest(data.tobytes())


def test_block_sums_shape_follows_the_spec():
    # 1 MiB: 1023 full blocks, then a partial block of 15 stripes and the last stripe.
    assert full_blocks(MIB) == 1023 and counted_stripes(MIB) == 1023 * 16 + 15
    assert block_sums(_data(MIB)).shape == (1024, 8)
    assert block_sums(_data(1025)).shape == (2, 8)  # one full block, a partial of 0 stripes
    assert not block_sums(_data(1025))[1].any()
    with pytest.raises(ValueError):
        block_sums(_data(240))


def test_a_flipped_bit_changes_the_sums_and_the_hash():
    data = _data(5000)
    bad = data.copy()
    bad[3000] ^= 1
    assert not np.array_equal(block_sums(data), block_sums(bad))
    assert xxh3_64_blocks(bad) == xxhash.xxh3_64_intdigest(bad.tobytes()) != xxh3_64_blocks(data)


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory):
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        pytest.skip("no C compiler (gcc) to build the host version of xxh3_gpu.cu")
    lib_path = tmp_path_factory.mktemp("xxh3") / "libxxh3_host.so"
    subprocess.run(
        [gcc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-x", "c",
         str(KERNEL_SOURCE), "-o", str(lib_path)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    return HostKernels(ctypes.CDLL(str(lib_path)))


class HostKernels:
    """The kernels of xxh3_gpu.cu built for the host: each grid's threads run in a loop."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        u32, u64, ptr = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_void_p
        self._sums = lib.xxh3_block_sums_grid
        self._sums.argtypes = [u32, u32, ptr, u64, ptr, ptr]
        self._finish = lib.xxh3_finish_grid
        self._finish.argtypes = [u32, u32, ptr, u64, ptr, ptr, ptr]
        self._secret = np.frombuffer(SECRET, dtype=np.uint8).copy()
        self.launches: list[tuple[str, int, int]] = []

    def block_sums(self, grid, block, data, n, sums):
        self.launches.append(("block_sums", grid, block))
        self._sums(grid, block, data.ctypes.data, n, self._secret.ctypes.data, sums.ctypes.data)

    def finish(self, grid, block, data, n, sums, digests):
        self.launches.append(("finish", grid, block))
        self._finish(grid, block, data.ctypes.data, n, self._secret.ctypes.data,
                     sums.ctypes.data, digests.ctypes.data)  # fmt: skip


def _host_checksum(kernels: HostKernels, data: np.ndarray) -> tuple[int, np.ndarray]:
    n = len(data)
    g = Geometry(n)
    sums = np.full(g.sum_words, 0xDEAD, dtype=np.uint64)  # garbage: every word is written
    digests = np.zeros(g.chunks, dtype=np.uint64)
    launch(kernels, data, n, sums, digests)
    tail = tail_range(n)
    return assemble(digests.tolist(), n, None if tail is None else data[tail[0] : tail[1]]), sums


@pytest.mark.parametrize("n", OBJECT_LENGTHS)
def test_host_build_of_the_kernels_gives_the_object_checksum(host_kernels, n):
    data = _data(n, seed=1)
    got, _ = _host_checksum(host_kernels, data)
    assert got == checksum(data)


def test_host_build_at_unaligned_addresses_and_with_a_corrupt_byte(host_kernels):
    backing = _data(2 * MIB + 300, seed=2)
    data = backing[3:]  # not 8-byte aligned
    assert data.ctypes.data % 8 != 0
    got, sums = _host_checksum(host_kernels, data)
    assert got == checksum(data)
    # The sums of the first chunk are the NumPy reference's, slot for slot.
    assert np.array_equal(sums[: 1024 * 8].reshape(1024, 8), block_sums(data[:MIB]))
    bad = data.copy()
    bad[MIB + 12345] ^= 0x80
    assert _host_checksum(host_kernels, bad)[0] != got


def test_launch_covers_every_chunk_with_the_documented_grids(host_kernels):
    host_kernels.launches.clear()
    _host_checksum(host_kernels, _data(3 * MIB + 4093))
    g = Geometry(3 * MIB + 4093)
    assert g.chunks == 4
    assert host_kernels.launches == [("block_sums", g.sums_grid, 256), ("finish", 1, 64)]
    assert g.sums_grid * 256 >= 4 * 1024 * 8


def test_assemble_needs_the_short_tail():
    assert tail_range(MIB + 240) == (MIB, MIB + 240)
    assert tail_range(MIB + 241) is None
    assert tail_range(100) == (0, 100)
    with pytest.raises(ValueError):
        assemble([0, 0], MIB + 5)


def test_nvcc_compiles_the_kernel_file(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc (CUDA toolkit) not installed")
    ptx = tmp_path / "xxh3_gpu.ptx"
    subprocess.run([nvcc, "-ptx", "-arch=sm_90", str(KERNEL_SOURCE), "-o", str(ptx)],
                   check=True, capture_output=True, timeout=300)  # fmt: skip
    text = ptx.read_text()
    # extern "C": the names cupy.RawModule.get_function looks up, unmangled.
    assert ".entry xxh3_block_sums(" in text
    assert ".entry xxh3_finish(" in text
