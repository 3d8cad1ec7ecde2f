"""GPU tier and cupy buffers.  Needs a CUDA GPU and the [gpu] extra; skipped cleanly elsewhere."""

from __future__ import annotations

import pytest

from mooncake_store import Client
from mooncake_store.cluster import LocalCluster
from mooncake_store.common.gpu import gpu_count
from tests.conftest import FAST_MASTER, wait_until

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(gpu_count() == 0, reason="needs a CUDA GPU and cupy ([gpu] extra)"),
]


@pytest.fixture
def gpu_cluster(tmp_path):
    with LocalCluster(tmp_path, nodes=1, dram="64MiB", master_args=FAST_MASTER,
                      node_args=["--gpu-bytes", "16MiB"]) as cluster:  # fmt: skip
        yield cluster


def test_cupy_buffers_round_trip(gpu_cluster):
    import cupy

    with Client(gpu_cluster.master_address) as store:
        src = cupy.arange(1 << 20, dtype=cupy.float32)
        store.put_from("gpu/src", src)
        out = cupy.zeros_like(src)
        assert store.get_into("gpu/src", out) == src.nbytes
        assert bool((out == src).all())


def test_hot_blocks_are_promoted_to_the_gpu_tier_and_served_from_it(gpu_cluster):
    import cupy
    import numpy as np

    with Client(gpu_cluster.master_address) as store:
        value = np.random.default_rng(0).integers(0, 255, 1 << 20, dtype=np.uint8)
        store.put("gpu/hot", value)
        for _ in range(3):
            assert store.get("gpu/hot") == value.tobytes()

        def on_gpu() -> bool:
            return any(n.tier == "GPU" and n.objects for n in store.list_nodes())

        wait_until(on_gpu, what="promotion to the GPU tier")
        out = cupy.empty(1 << 20, dtype=cupy.uint8)
        store.get_into("gpu/hot", out)
        assert bool((out == cupy.asarray(value)).all())
        assert store.counters["gpu_reads"] >= 1


@pytest.fixture
def dram_cluster(tmp_path):
    """No GPU tier: nothing gets promoted away from the pool under the test's feet."""
    with LocalCluster(tmp_path, nodes=1, dram="64MiB", master_args=FAST_MASTER) as cluster:
        yield cluster


def test_same_host_cupy_reads_and_writes_are_dma_with_the_pool(dram_cluster):
    """get_into a cupy array is one DMA from the registered pool and put_from one into it,
    verified in parallel; the bytes match, a corrupt replica raises, TCP still works."""
    gpu_cluster = dram_cluster
    import cupy
    import numpy as np

    from mooncake_store import ChecksumMismatchError
    from mooncake_store.client.cuda import cuda_path
    from mooncake_store.client.transport import ShmMapper
    from mooncake_store.common.checksum import checksum
    from tests.conftest import replica_list

    rng = np.random.default_rng(2)
    with Client(gpu_cluster.master_address) as store:
        for size in (4096, (1 << 20) + 3, (9 << 20) + 4097):
            host = rng.integers(0, 256, size, dtype=np.uint8)
            store.put(f"dma/{size}", host)
            store.get(f"dma/{size}")  # maps the pool
            path = cuda_path()
            before = dict(path.counters)
            out = cupy.zeros(size, dtype=cupy.uint8)
            assert store.get_into(f"dma/{size}", out) == size
            assert bool((out == cupy.asarray(host)).all())
            assert path.counters["dma_reads"] == before["dma_reads"] + 1

            dev = cupy.asarray(rng.integers(0, 256, size, dtype=np.uint8))
            store.put_from(f"dma-put/{size}", dev)
            assert path.counters["dma_writes"] == before["dma_writes"] + 1
            back = store.get(f"dma-put/{size}")
            assert back == cupy.asnumpy(dev).tobytes()
            assert replica_list(gpu_cluster.master_address, f"dma-put/{size}").checksum == (
                checksum(back)
            )

        loc = replica_list(gpu_cluster.master_address, f"dma/{(9 << 20) + 4097}").replicas[0]
        mapper = ShmMapper()
        pool = mapper.map(loc)
        assert pool is not None
        pool[loc.offset + (5 << 20)] ^= 0xFF  # a chunk in the middle goes bad
        mapper.close()
        with pytest.raises(ChecksumMismatchError):
            store.get_into(f"dma/{(9 << 20) + 4097}", cupy.zeros((9 << 20) + 4097, cupy.uint8))

    with Client(gpu_cluster.master_address, local_shm=False) as tcp:
        out = cupy.zeros(4096, dtype=cupy.uint8)
        assert tcp.get_into("dma/4096", out) == 4096
        assert tcp.counters["tcp_reads"] >= 1


def test_same_host_gpu_tier_reads_are_device_to_device(gpu_cluster):
    import cupy
    import numpy as np

    from mooncake_store.client.cuda import cuda_path

    with Client(gpu_cluster.master_address) as store:
        value = np.random.default_rng(4).integers(0, 255, 3 << 20, dtype=np.uint8)
        store.put("ipc/hot", value)
        for _ in range(3):
            assert store.get("ipc/hot") == value.tobytes()

        def on_gpu() -> bool:
            return any(n.tier == "GPU" and n.objects for n in store.list_nodes())

        wait_until(on_gpu, what="promotion to the GPU tier")
        before = cuda_path().counters["ipc_reads"]
        out = cupy.empty(3 << 20, dtype=cupy.uint8)
        store.get_into("ipc/hot", out)
        assert bool((out == cupy.asarray(value)).all())
        assert cuda_path().counters["ipc_reads"] == before + 1


def test_gpu_checksum_kernels_match_xxhash_on_the_device():
    """client/xxh3_gpu.cu on the real GPU (the host build runs in tests/unit/test_xxh3_gpu.py)."""
    import cupy
    import numpy as np

    from mooncake_store.client.gpu_checksum import GpuChecksum
    from mooncake_store.common.checksum import checksum
    from tests.unit.test_xxh3_gpu import OBJECT_LENGTHS

    gpu = GpuChecksum()
    stream = cupy.cuda.Stream(non_blocking=False)
    backing = np.random.default_rng(5).integers(0, 256, (4 << 20) + 16, dtype=np.uint8)
    dev = cupy.asarray(backing)
    for n in OBJECT_LENGTHS:
        assert gpu.checksum(dev[:n], stream) == checksum(backing[:n]), n
        assert gpu.checksum(dev[3 : 3 + n], stream) == checksum(backing[3 : 3 + n]), n  # unaligned
    bad = dev[: (2 << 20) + 5].copy()
    bad[(1 << 20) + 77] ^= 1
    assert gpu.checksum(bad, stream) != checksum(backing[: (2 << 20) + 5])


@pytest.mark.parametrize("mode", ["gpu", "cpu"])
def test_dma_reads_and_writes_verify_on_the_gpu_or_cpu_threads(dram_cluster, mode):
    import cupy
    import numpy as np

    from mooncake_store import ChecksumMismatchError
    from mooncake_store.client.cuda import cuda_path
    from mooncake_store.client.transport import ShmMapper
    from mooncake_store.common.checksum import checksum
    from tests.conftest import replica_list

    path = cuda_path()
    before_mode = path.verify
    path.verify = mode
    rng = np.random.default_rng(6)
    try:
        with Client(dram_cluster.master_address) as store:
            for size in (100, 4096, (1 << 20) + 3, (1 << 20) + 241, (9 << 20) + 4097):
                key = f"verify-{mode}/{size}"
                host = rng.integers(0, 256, size, dtype=np.uint8)
                store.put(key, host)
                store.get(key)  # maps the pool
                verified = path.counters["gpu_verified"]
                out = cupy.zeros(size, dtype=cupy.uint8)
                assert store.get_into(key, out) == size
                assert bool((out == cupy.asarray(host)).all())
                dev = cupy.asarray(rng.integers(0, 256, size, dtype=np.uint8))
                store.put_from(f"{key}/put", dev)
                back = store.get(f"{key}/put")
                assert back == cupy.asnumpy(dev).tobytes()
                assert replica_list(dram_cluster.master_address, f"{key}/put").checksum == (
                    checksum(back)
                )
                expected = 2 if mode == "gpu" else 0
                assert path.counters["gpu_verified"] == verified + expected
            key = f"verify-{mode}/{(9 << 20) + 4097}"
            loc = replica_list(dram_cluster.master_address, key).replicas[0]
            mapper = ShmMapper()
            pool = mapper.map(loc)
            assert pool is not None
            pool[loc.offset + (7 << 20) + 5] ^= 0x10
            mapper.close()
            with pytest.raises(ChecksumMismatchError):
                store.get_into(key, cupy.zeros((9 << 20) + 4097, cupy.uint8))
    finally:
        path.verify = before_mode


def test_tcp_reads_into_cupy_arrays_are_pipelined(dram_cluster):
    import cupy
    import numpy as np

    value = np.random.default_rng(7).integers(0, 256, (5 << 20) + 3, dtype=np.uint8)
    with Client(dram_cluster.master_address, local_shm=False) as tcp:
        tcp.put("pipe/cupy", value)
        out = cupy.zeros(value.nbytes, dtype=cupy.uint8)
        assert tcp.get_into("pipe/cupy", out) == value.nbytes
        assert bool((out == cupy.asarray(value)).all())
        assert tcp.counters["pipelined_reads"] == 1
