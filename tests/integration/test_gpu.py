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
