"""The exact call sequences of the three engines' Mooncake connectors, replayed against a real
cluster through `from mooncake.store import ...` (the compat/ alias package), with numpy
buffers standing in for tensors and real bytes checked.

The sequences follow the connectors' public code: LMCache's mooncakestore connector (setup,
register its pinned slab, is_exist / put_from / batch_get_into / get_into, remove, close),
vLLM's MooncakeStoreConnector worker (setup with 7 positional arguments and its own segment,
ReplicateConfig, register_buffer of the KV cache, batch_is_exist lookup, K/V saved with
batch_put_from_multi_buffers, loaded with batch_get_into_multi_buffers, batch_get_replica_desc
for tier logging, remove_all(force=True) on reset, close) and SGLang's HiCache MooncakeStore
(setup with a transfer engine argument, the 4 KiB warm-up put/is_exist/get, register of the
host pool, batch_is_exist then batch_put_from / batch_put_from_multi_buffers for MHA and MLA
pages, batch_get_into, the direct linker's get sessions with per-layer
batch_get_into_multi_buffer_ranges, remove_all on clear).
"""

from __future__ import annotations

import importlib
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

COMPAT = str(Path(__file__).resolve().parents[2] / "compat")
MiB = 1 << 20


@pytest.fixture(scope="module")
def mooncake_store_module():
    """`mooncake.store` as an engine imports it, with compat/ put on the path on purpose."""
    sys.path.insert(0, COMPAT)
    try:
        for name in ("mooncake.store", "mooncake"):
            sys.modules.pop(name, None)
        module = importlib.import_module("mooncake.store")
        assert module.__file__.startswith(COMPAT)
        yield module
    finally:
        sys.path.remove(COMPAT)
        for name in ("mooncake.store", "mooncake"):
            sys.modules.pop(name, None)


def ptr(a: np.ndarray) -> int:
    return int(a.ctypes.data)


def test_lmcache_mooncakestore_connector(cluster, mooncake_store_module):
    MooncakeDistributedStore = mooncake_store_module.MooncakeDistributedStore
    ReplicateConfig = mooncake_store_module.ReplicateConfig
    store = MooncakeDistributedStore()
    # LMCache's config: local_hostname, metadata_server, global_segment_size, local_buffer_size,
    # protocol, rdma_devices, master_server_addr (positional).
    assert store.setup("localhost", "http://localhost:8080/metadata", 0, 64 * MiB, "tcp", "",
                       cluster.master_address) == 0  # fmt: skip
    slab = np.zeros(4 * MiB, dtype=np.uint8)  # LMCache's pinned CPU slab
    assert store.register_buffer(ptr(slab), slab.nbytes) == 0
    chunk = 256 * 1024
    keys = [f"lmcache@model@1@0@{uuid.uuid4().hex}" for _ in range(8)]
    rng = np.random.default_rng(1)
    chunks = [rng.integers(0, 256, chunk, dtype=np.uint8) for _ in keys]
    config = ReplicateConfig()
    config.replica_num = 1
    for i, (key, data) in enumerate(zip(keys, chunks, strict=True)):
        assert store.is_exist(key) == 0
        region = slab[i * chunk : (i + 1) * chunk]
        region[:] = data  # the memory object lives in the slab
        assert store.put_from(key, ptr(region), chunk, config) == 0
        assert store.is_exist(key) == 1
    slab[:] = 0
    got = store.batch_get_into(keys, [ptr(slab[i * chunk :]) for i in range(8)], [chunk] * 8)
    assert got == [chunk] * 8
    for i, data in enumerate(chunks):
        assert np.array_equal(slab[i * chunk : (i + 1) * chunk], data)
    one = np.zeros(chunk, dtype=np.uint8)
    assert store.get_into(keys[3], ptr(one), chunk) == chunk and np.array_equal(one, chunks[3])
    assert store.remove(keys[0], force=True) == 0 and store.remove(keys[0]) == -704
    assert store.unregister_buffer(ptr(slab)) == 0
    assert store.close() == 0


def test_vllm_mooncake_store_connector(cluster, mooncake_store_module):
    MooncakeDistributedStore = mooncake_store_module.MooncakeDistributedStore
    ReplicateConfig = mooncake_store_module.ReplicateConfig
    store = MooncakeDistributedStore()
    # embedded mode: the rank contributes global_segment_size bytes of its own.
    assert store.setup("127.0.0.1", "P2PHANDSHAKE", 32 * MiB, 16 * MiB, "rdma", "",
                       cluster.master_address) == 0  # fmt: skip
    hostname = store.get_hostname()
    assert hostname.startswith("127.0.0.1:")
    replicate_config = ReplicateConfig()
    replicate_config.preferred_segment = hostname  # this rank's own segment
    # KV cache in the FlashAttention layout (2, num_blocks, block bytes): K and V segments.
    num_blocks, block_bytes = 32, 64 * 1024
    kv = np.random.default_rng(2).integers(0, 256, (2, num_blocks, block_bytes), dtype=np.uint8)
    assert store.register_buffer(ptr(kv), kv.nbytes) == 0
    base_k, base_v = ptr(kv[0]), ptr(kv[1])
    hashes = [uuid.uuid4().hex for _ in range(num_blocks)]
    keys = [f"Qwen2.5-7B@tp_rank:0@pcp0@dcp0@pp_rank:0@{h}" for h in hashes]
    # lookup: nothing stored yet
    assert store.batch_is_exist(keys) == [0] * num_blocks
    # save: the missing blocks, K and V of each block as one object
    missing = [i for i, s in enumerate(store.batch_is_exist(keys)) if s != 1]
    addrs = [[base_k + i * block_bytes, base_v + i * block_bytes] for i in missing]
    sizes = [[block_bytes, block_bytes] for _ in missing]
    res = store.batch_put_from_multi_buffers([keys[i] for i in missing], addrs, sizes,
                                             replicate_config)  # fmt: skip
    assert res == [0] * num_blocks
    assert store.batch_is_exist(keys) == [1] * num_blocks
    tiers = store.batch_get_replica_desc(keys[:4])
    assert all(d[0].is_memory_replica() for d in tiers.values())
    # the preferred segment is this rank's own node, which has room
    assert {d[0].get_memory_descriptor().buffer_descriptor.transport_endpoint
            for d in tiers.values()} == {hostname}  # fmt: skip
    # load into a fresh cache (another instance's blocks)
    kv_loaded = np.zeros_like(kv)
    lk, lv = ptr(kv_loaded[0]), ptr(kv_loaded[1])
    got = store.batch_get_into_multi_buffers(
        keys, [[lk + i * block_bytes, lv + i * block_bytes] for i in range(num_blocks)],
        [[block_bytes, block_bytes]] * num_blocks,
    )  # fmt: skip
    assert got == [2 * block_bytes] * num_blocks
    assert np.array_equal(kv, kv_loaded)
    # reset (the scheduler is paused): remove everything, leased or not
    assert store.remove_all(force=True) >= num_blocks
    assert store.batch_is_exist(keys) == [0] * num_blocks
    assert store.close() == 0


def test_sglang_hicache_mooncake_store(cluster, mooncake_store_module):
    MooncakeDistributedStore = mooncake_store_module.MooncakeDistributedStore
    ReplicateConfig = mooncake_store_module.ReplicateConfig
    assert hasattr(ReplicateConfig(), "group_ids")  # probed by the connector
    store = MooncakeDistributedStore()
    assert store.setup("localhost", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "",
                       cluster.master_address, None) == 0  # fmt: skip
    # warm-up
    warm = "sglang_mooncake_store_warmup_key" + uuid.uuid4().hex
    assert store.put(warm, bytes(4 * 1024)) == 0
    assert store.is_exist(warm) == 1 and store.get(warm) == bytes(4 * 1024)
    # host KV pool (page_first layout): per page a K and a V region
    pages, page_bytes = 16, 32 * 1024
    host = np.random.default_rng(3).integers(0, 256, (pages, 2, page_bytes), dtype=np.uint8)
    assert store.register_buffer(ptr(host), host.nbytes) == 0
    page_keys = [uuid.uuid4().hex for _ in range(pages)]
    # batch_set_v1 (MHA): keys "<hash>_<rank>_k" / "_v", only the missing ones put
    key_strs = [f"{k}_0_{kv}" for k in page_keys for kv in ("k", "v")]
    ptrs = [ptr(host[p, i]) for p in range(pages) for i in range(2)]
    sizes = [page_bytes] * len(key_strs)
    exist = store.batch_is_exist(key_strs)
    todo = [i for i, e in enumerate(exist) if e != 1]
    config = ReplicateConfig()
    config.group_ids = [f"sglang-hicache:{page_keys[i // 2]}" for i in todo]
    put = store.batch_put_from([key_strs[i] for i in todo], [ptrs[i] for i in todo],
                               [sizes[i] for i in todo], config)  # fmt: skip
    assert put == [0] * len(todo)
    # MLA pages: one object per page from two buffers (multi-buffer form)
    mla_keys = [f"{k}__k" for k in page_keys]
    res = store.batch_put_from_multi_buffers(
        mla_keys, [[ptr(host[p, 0]), ptr(host[p, 1])] for p in range(pages)],
        [[page_bytes, page_bytes]] * pages, ReplicateConfig(),
    )  # fmt: skip
    assert res == [0] * pages
    # batch_exists: the longest stored prefix of pages
    exist = store.batch_is_exist(key_strs)
    assert exist.index(0) if 0 in exist else len(exist) == len(key_strs)
    # batch_get_v1: into another host pool
    other = np.zeros_like(host)
    got = store.batch_get_into(key_strs, [ptr(other[p, i]) for p in range(pages) for i in range(2)],
                               sizes)  # fmt: skip
    assert got == sizes and np.array_equal(other, host)
    # direct linker: a get session, then layer by layer ranged reads of each MLA object
    layers = 4
    layer_bytes = 2 * page_bytes // layers
    assert store.batch_get_session_start(mla_keys) == [0] * pages
    device = np.zeros((pages, 2 * page_bytes), dtype=np.uint8)
    for layer in range(layers):
        off = layer * layer_bytes
        result = store.batch_get_into_multi_buffer_ranges(
            mla_keys, [[ptr(device[p, off:])] for p in range(pages)],
            [[layer_bytes]] * pages, [[off]] * pages,
        )  # fmt: skip
        assert list(result) == [layer_bytes] * pages
    assert np.array_equal(device, host.reshape(pages, -1))
    store.batch_get_session_end(mla_keys)
    # clear
    assert store.remove_all() >= 0
    assert store.batch_is_exist(key_strs[:2]) == [1, 1]  # just read: leased, kept
    assert store.remove_all(force=True) > 0
    assert store.close() == 0
