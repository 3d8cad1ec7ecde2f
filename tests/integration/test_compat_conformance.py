"""Conformance of the Mooncake-compatible API (mooncake_store.compat) with Mooncake Store's
documented behaviour, against a real cluster: every method vLLM's, SGLang's and LMCache's
connectors call, real bytes checked byte for byte, Mooncake's return conventions and codes."""

from __future__ import annotations

import os

import numpy as np
import pytest

from mooncake_store.compat import (
    MooncakeDistributedStore,
    ReplicateConfig,
)

MiB = 1 << 20
NOT_FOUND, HAS_LEASE, INVALID = -704, -706, -600


def ptr(array: np.ndarray) -> int:
    return int(array.ctypes.data)


def random_bytes(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.fixture(scope="module")
def store(cluster):
    s = MooncakeDistributedStore()
    assert s.setup("127.0.0.1", "P2PHANDSHAKE", 0, 16 * MiB, "tcp", "", cluster.master_address) == 0
    yield s
    assert s.close() == 0


def test_calls_before_setup_follow_mooncakes_conventions():
    s = MooncakeDistributedStore()
    assert s.put("k", b"v") == INVALID and s.put_from("k", 1, 1) == INVALID
    assert s.get("k") == b"" and s.get_buffer("k") is None and s.get_batch(["a"]) == [b""]
    assert s.batch_is_exist(["a", "b"]) == [INVALID, INVALID]
    assert s.batch_get_into(["a"], [1], [1]) == [INVALID]
    assert s.is_exist("k") == INVALID and s.remove("k") == INVALID and s.remove_all() == INVALID
    assert s.health_check() == 1
    assert s.close() == 0


def test_put_get_exist_size_remove(store):
    value = os.urandom(3000)
    assert store.put("c/basic", value) == 0
    assert store.put("c/basic", value) == 0  # an existing key: success, nothing written
    assert store.get("c/basic") == value
    assert store.is_exist("c/basic") == 1 and store.is_exist("c/none") == 0
    assert store.batch_is_exist(["c/basic", "c/none"]) == [1, 0]
    assert store.get_size("c/basic") == 3000 and store.get_size("c/none") == NOT_FOUND
    assert store.get("c/none") == b"" and store.get_buffer("c/none") is None
    handle = store.get_buffer("c/basic")
    assert handle.size() == len(handle) == 3000 and bytes(handle.tobytes()) == value
    assert store.remove("c/basic") == HAS_LEASE  # just read: leased, as in Mooncake (5 s)
    assert store.remove("c/basic", True) == 0 and store.remove("c/basic") == NOT_FOUND
    assert store.put("c/unread", b"u") == 0 and store.remove("c/unread") == 0
    assert store.get("c/basic") == b"" and store.health_check() == 0
    assert store.put("", b"x") == -400  # INVALID_KEY


def test_zero_copy_pointer_calls(store):
    data = [random_bytes(n, n) for n in (1, 4096, 200_000, 3 * MiB + 5)]
    keys = [f"c/zc/{a.nbytes}" for a in data]
    arena = np.zeros(8 * MiB, dtype=np.uint8)
    assert store.register_buffer(ptr(arena), arena.nbytes) == 0
    assert store.put_from(keys[0], ptr(data[0]), data[0].nbytes) == 0
    assert store.batch_put_from(
        keys[1:], [ptr(a) for a in data[1:]], [a.nbytes for a in data[1:]]
    ) == [0, 0, 0]
    outs = [np.zeros(a.nbytes, dtype=np.uint8) for a in data]
    assert store.get_into(keys[3], ptr(outs[3]), outs[3].nbytes) == data[3].nbytes
    got = store.batch_get_into(
        [*keys[:3], "c/zc/none"], [ptr(o) for o in outs[:3]] + [ptr(arena)],
        [o.nbytes for o in outs[:3]] + [16],
    )  # fmt: skip
    assert got == [1, 4096, 200_000, NOT_FOUND]  # a missing key fails alone
    for want, out in zip(data, outs, strict=True):
        assert np.array_equal(want, out)
    # A buffer smaller than the object: a negative code, the buffer's neighbours untouched.
    small = arena[:100]
    assert store.get_into(keys[2], ptr(small), 100) == INVALID
    assert store.unregister_buffer(ptr(arena)) == 0
    assert store.unregister_buffer(ptr(arena)) == INVALID


def test_multi_buffer_forms_store_one_object(store):
    keys = [f"c/mb/{i}" for i in range(6)]
    k_parts = [random_bytes(256 * 1024, i) for i in range(6)]
    v_parts = [random_bytes(256 * 1024, 100 + i) for i in range(6)]
    res = store.batch_put_from_multi_buffers(
        keys, [[ptr(k), ptr(v)] for k, v in zip(k_parts, v_parts, strict=True)],
        [[k.nbytes, v.nbytes] for k, v in zip(k_parts, v_parts, strict=True)], ReplicateConfig(),
    )  # fmt: skip
    assert res == [0] * 6
    assert store.get(keys[2]) == k_parts[2].tobytes() + v_parts[2].tobytes()
    assert store.get_size(keys[0]) == 512 * 1024
    k_out = [np.zeros_like(k) for k in k_parts]
    v_out = [np.zeros_like(v) for v in v_parts]
    got = store.batch_get_into_multi_buffers(
        keys, [[ptr(k), ptr(v)] for k, v in zip(k_out, v_out, strict=True)],
        [[k.nbytes, v.nbytes] for k, v in zip(k_out, v_out, strict=True)], True,
    )  # fmt: skip
    assert got == [512 * 1024] * 6
    for a, b in zip(k_parts + v_parts, k_out + v_out, strict=True):
        assert np.array_equal(a, b)
    missing = store.batch_get_into_multi_buffers(["c/mb/none"], [[ptr(k_out[0])]], [[16]])
    assert missing == [NOT_FOUND]


def test_put_parts_put_batch_get_batch(store):
    assert store.put_parts("c/parts", b"head-", memoryview(b"middle-"), bytearray(b"tail")) == 0
    assert store.get("c/parts") == b"head-middle-tail"
    assert store.put_batch(["c/pb/1", "c/pb/2"], [b"one", b"two"]) == 0
    assert store.get_batch(["c/pb/1", "c/none", "c/pb/2"]) == [b"one", b"", b"two"]
    handles = store.batch_get_buffer(["c/pb/2", "c/none"])
    assert handles[0].tobytes() == b"two" and handles[1] is None


def test_remove_honours_force_with_a_leased_object(store):
    assert store.put("c/leased", b"x" * 100) == 0
    assert store.get("c/leased") == b"x" * 100  # a read: the object is leased for a while
    assert store.remove("c/leased") == HAS_LEASE
    assert store.is_exist("c/leased") == 1
    assert store.remove("c/leased", force=True) == 0
    assert store.is_exist("c/leased") == 0


def test_replicate_config_is_honoured(store, cluster):
    nodes = {n.node_id for n in _nodes(cluster)}
    config = ReplicateConfig()
    config.replica_num = 2
    assert store.put("c/two", b"y" * 5000, config) == 0
    descs = store.get_replica_desc("c/two")
    assert len(descs) == 2 and all(d.is_memory_replica() and not d.is_disk_replica() for d in descs)
    assert {d.node_id for d in descs} <= nodes
    buf = descs[0].get_memory_descriptor().buffer_descriptor
    assert buf.size == 5000 and ":" in buf.transport_endpoint
    assert store.batch_get_replica_desc(["c/two", "c/none"]).keys() == {"c/two"}
    for node in sorted(nodes):
        config = ReplicateConfig()
        config.preferred_segment = node
        config.with_soft_pin = True
        key = f"c/pref/{node}"
        assert store.put(key, b"z" * 100, config) == 0
        assert [d.node_id for d in store.get_replica_desc(key)] == [node]
    pinned = ReplicateConfig()
    pinned.with_hard_pin = True
    assert store.put("c/hard", b"p", pinned) == 0 and store.remove("c/hard", True) == 0


def test_ranges_and_get_sessions(store):
    big = random_bytes(2 * MiB + 4096, 9)  # three checksum chunks
    small = random_bytes(10_000, 10)
    assert store.batch_put_from(["c/r/big", "c/r/small"], [ptr(big), ptr(small)],
                                [big.nbytes, small.nbytes]) == [0, 0]  # fmt: skip
    assert store.batch_get_session_start(["c/r/big", "c/r/small", "c/r/none"]) == [0, 0, NOT_FOUND]
    a, b, c = (np.zeros(n, dtype=np.uint8) for n in (1000, MiB, 500))
    offsets = [[MiB - 500, 5], [100]]  # the first range crosses a chunk boundary
    got = store.batch_get_into_multi_buffer_ranges(
        ["c/r/big", "c/r/small"], [[ptr(a), ptr(b)], [ptr(c)]], [[1000, MiB], [500]], offsets
    )
    assert got == [1000 + MiB, 500]
    assert np.array_equal(a, big[MiB - 500 : MiB + 500]) and np.array_equal(b, big[5 : 5 + MiB])
    assert np.array_equal(c, small[100:600])
    outside = store.batch_get_into_multi_buffer_ranges(["c/r/small"], [[ptr(c)]], [[500]], [[9800]])
    assert outside[0] < 0
    assert store.batch_get_session_end(["c/r/big", "c/r/small", "c/r/none"]) == [0, 0, 0]
    # get_into_ranges: several keys into one buffer at destination offsets (no session needed).
    dest = np.zeros(3000, dtype=np.uint8)
    res = store.get_into_ranges(
        [ptr(dest)], [["c/r/big", "c/r/small"]], [[[0, 1000], [2000]]], [[[7, 2 * MiB], [0]]],
        [[[1000, 1000], [1000]]],
    )  # fmt: skip
    assert res == [[[1000, 1000], [1000]]]
    assert np.array_equal(dest[:1000], big[7:1007])
    assert np.array_equal(dest[1000:2000], big[2 * MiB : 2 * MiB + 1000])
    assert np.array_equal(dest[2000:], small[:1000])


def test_torch_tensors_as_buffers(store):
    torch = pytest.importorskip("torch")
    t = torch.arange(4096, dtype=torch.float32)
    assert store.put_from("c/torch", t.data_ptr(), t.numel() * 4) == 0
    out = torch.zeros_like(t)
    assert store.get_into("c/torch", out.data_ptr(), out.numel() * 4) == 4096 * 4
    assert torch.equal(t, out)


def test_cuda_buffers(store):
    cupy = pytest.importorskip("cupy")
    if not cupy.is_available():
        pytest.skip("needs a CUDA GPU")
    src = cupy.arange(1 << 18, dtype=cupy.uint8)
    assert store.register_buffer(int(src.data.ptr), src.nbytes) == 0
    assert store.put_from("c/gpu", int(src.data.ptr), src.nbytes) == 0
    k, v = cupy.zeros(1 << 17, dtype=cupy.uint8), cupy.zeros(1 << 17, dtype=cupy.uint8)
    got = store.batch_get_into_multi_buffers(
        ["c/gpu"], [[int(k.data.ptr), int(v.data.ptr)]], [[k.nbytes, v.nbytes]]
    )
    assert got == [src.nbytes] and bool((cupy.concatenate([k, v]) == src).all())


def test_remove_by_regex_and_remove_all(store):
    for i in range(25):
        assert store.put(f"c/rx/{i}", b"r") == 0
    assert store.remove_by_regex(r"^c/rx/1\d$") == 10
    assert store.batch_is_exist(["c/rx/1", "c/rx/12", "c/rx/24"]) == [1, 0, 1]
    assert store.remove_by_regex("(") == INVALID
    assert store.get("c/rx/3") == b"r"  # leased now: remove_all without force keeps it
    kept = store.remove_all()
    assert kept > 0 and store.is_exist("c/rx/3") == 1 and store.is_exist("c/rx/4") == 0
    assert store.remove_all(force=True) >= 1
    assert store.is_exist("c/rx/3") == 0


def _nodes(cluster):
    from mooncake_store import Client

    with Client(cluster.master_address) as client:
        return client.list_nodes()


def test_contributed_memory_lives_and_ends_with_the_client(cluster, store):
    before = {n.node_id for n in _nodes(cluster)}
    assert store.get_hostname() == "127.0.0.1"  # set up with 0 bytes: no node of its own
    owner = MooncakeDistributedStore()
    assert owner.setup("127.0.0.1:7777", "", 8 * MiB, 0, "tcp", "", cluster.master_address) == 0
    nodes = {n.node_id: n for n in _nodes(cluster)}
    [mine] = set(nodes) - before
    assert nodes[mine].size_bytes == 8 * MiB and nodes[mine].endpoint == owner.get_hostname()
    config = ReplicateConfig()
    config.prefer_alloc_in_same_node = True
    assert owner.put("c/mine", b"m" * 1000, config) == 0
    assert [d.node_id for d in owner.get_replica_desc("c/mine")] == [mine]
    assert owner.close() == 0
    assert mine not in {n.node_id for n in _nodes(cluster)}  # unmounted as it stopped
    # The node drained on its way out (SIGTERM): its single-copy object moved to a node that stays.
    assert store.is_exist("c/mine") == 1
    assert {d.node_id for d in store.get_replica_desc("c/mine")} <= before
    assert owner.put("c/after", b"x") == -600  # closed: as before setup


def test_setup_forms_and_failures(cluster):
    by_dict = MooncakeDistributedStore()
    config = {"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
              "global_segment_size": "0", "local_buffer_size": "16MB", "protocol": "tcp",
              "master_server_address": cluster.master_address}  # fmt: skip
    assert by_dict.setup(config) == 0
    assert by_dict.put("c/dict", b"d") == 0 and by_dict.get("c/dict") == b"d"
    assert by_dict.close() == 0
    dummy = MooncakeDistributedStore()  # SGLang's standalone mode: the address is the master's
    assert dummy.setup_dummy(0, 16 * MiB, cluster.master_address) == 0
    assert dummy.get("c/dict") == b"d" and dummy.get_hostname() == ""
    assert dummy.close() == 0
    assert MooncakeDistributedStore().setup("h", "", "lots", 0) == INVALID  # a bad size


def test_setup_takes_the_leases_option(cluster):
    """Allocation leases are on by default (a put's commit brings space for the next put of
    its size); config key "leases" (or setup(..., leases=False)) turns them off."""
    from mooncake_store import Client

    config = {"local_hostname": "127.0.0.1", "global_segment_size": "0", "protocol": "tcp",
              "master_server_address": cluster.master_address}  # fmt: skip
    with Client(cluster.master_address, leases=False) as observer:
        before = observer.stats().leases
        off = MooncakeDistributedStore()
        assert off.setup({**config, "leases": False}) == 0
        assert off._client._flows._leases is None
        assert off.put("c/no-lease", b"n" * 5000) == 0
        on = MooncakeDistributedStore()
        assert on.setup(config) == 0
        assert on._client._flows._leases is not None
        assert on.put("c/lease", b"l" * 5000) == 0  # same host: by shared memory
        assert observer.stats().leases > before  # the put's commit brought a lease
        assert off.put("c/no-lease-2", b"n" * 5000) == 0 and on.put("c/lease-2", b"m" * 5000) == 0
        assert on._client._flows.counters["leased_puts"] == 1
        assert off.get("c/lease") == b"l" * 5000 and on.get("c/no-lease") == b"n" * 5000
        assert off.close() == 0 and on.close() == 0


def test_setup_takes_the_busy_poll_option(cluster):
    """Config key "busy_poll_us" (or setup(..., busy_poll_us=)) reaches the client: 0 turns
    busy polling off; a bad value is INVALID_PARAMS, not an exception."""
    config = {"local_hostname": "127.0.0.1", "global_segment_size": "0", "protocol": "tcp",
              "master_server_address": cluster.master_address}  # fmt: skip
    off = MooncakeDistributedStore()
    assert off.setup({**config, "busy_poll_us": 0}) == 0
    assert off.put("c/no-poll", b"p" * 5000) == 0 and off.get("c/no-poll") == b"p" * 5000
    assert off._client.counters["busy_polls"] == 0 and off._client._busy_poll_s == 0
    on = MooncakeDistributedStore()
    assert on.setup({**config, "busy_poll_us": "100"}) == 0
    assert on._client._busy_poll_s == 100e-6
    assert on.get("c/no-poll") == b"p" * 5000
    for bad in ("soon", -1, float("inf")):  # inf: OverflowError from int()
        assert MooncakeDistributedStore().setup({**config, "busy_poll_us": bad}) == INVALID
    assert off.close() == 0 and on.close() == 0
