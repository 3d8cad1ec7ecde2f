"""A copy into a pool under a write grant stops within a chunk once the grant is no longer
admitted (client/steps.py guards, client/shm.py `ShmMapper.copy_guard`)."""

import time

import numpy as np
import pytest

from mooncake_store.client.shm import CopyStopped, ShmMapper
from mooncake_store.client.steps import copy_checksum, copy_parts_into
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES, checksum
from mooncake_store.common.grant import Grant, GrantMode, sign_grant

MiB = 1 << 20


def _guard_ending_after(chunks: int):
    calls = []

    def guard() -> None:
        calls.append(1)
        if len(calls) > chunks:
            raise CopyStopped("ended")

    return guard, calls


@pytest.mark.parametrize("size", [3 * MiB, 8 * MiB])  # one thread; two threads (halves)
def test_a_guarded_copy_stops_within_a_chunk_of_its_grant_ending(size):
    src = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    guard, calls = _guard_ending_after(2)
    with pytest.raises(CopyStopped):
        copy_checksum(memoryview(dst), memoryview(src), guard)
    copied = int(np.count_nonzero(dst == src))
    assert copied <= 3 * CHUNK_BYTES + 1024  # at most the chunks admitted (+ chance equals)
    full = np.zeros(size, dtype=np.uint8)
    guard, calls = _guard_ending_after(1 << 30)
    assert copy_checksum(memoryview(full), memoryview(src), guard) == checksum(src)
    assert len(calls) >= size // CHUNK_BYTES  # checked before every chunk


def test_a_scatter_copy_is_guarded_before_every_chunk():
    parts = [memoryview(np.full(n, i + 1, dtype=np.uint8)) for i, n in enumerate([10, 2 * MiB, 5])]
    region = memoryview(np.zeros(sum(len(p) for p in parts), dtype=np.uint8))
    guard, calls = _guard_ending_after(1)
    with pytest.raises(CopyStopped):
        copy_parts_into(region, parts, guard)
    assert np.count_nonzero(np.frombuffer(region, dtype=np.uint8)) <= CHUNK_BYTES  # one chunk
    guard, calls = _guard_ending_after(100)
    assert copy_parts_into(region, parts, guard) == checksum(b"".join(bytes(p) for p in parts))
    assert len(calls) >= 3  # 2 MiB + 15 bytes: three chunks, each checked before it is copied


def _loc(expires_ms: int, generation: int = 5) -> ReplicaLocation:
    grant = sign_grant(b"k" * 32, Grant(7, 0, MiB, expires_ms, GrantMode.WRITE, generation))
    return ReplicaLocation("n", 7, "n:1", "shm", 0, MiB, grant)


def test_a_grant_near_its_expiry_is_not_copied_with():
    """The master frees an expired put's room without its node's word (master/frees.py), so
    a same-host copy never uses a grant within a second of its expiry."""
    mapper = ShmMapper()  # no page mapped for segment 7: a two-phase grant may copy
    now_ms = int(time.time() * 1000)
    assert mapper.copy_guard(_loc(now_ms + 60_000), leased=False) is not None
    assert mapper.copy_guard(_loc(now_ms + 500), leased=False) is None
    assert mapper.copy_guard(_loc(now_ms + 60_000), leased=True) is None


@pytest.mark.parametrize("master_ahead_s", [60, -60])
def test_a_copy_runs_only_while_its_grant_is_live_by_the_masters_clock_and_the_hosts(
    master_ahead_s,
):
    """The node shows same-host clients the master's clock it follows (common/shm_fence.py).
    With the master 60 s ahead of this host, a grant that ended 5 s ago by the master's clock
    (55 s ahead by this host's) is not copied with: the host's clock alone let it copy into
    room the master may have handed out again.  With the master 60 s behind (or stepped back
    since the grant), the host's clock still ends a grant: a copy is never longer than either
    clock allows."""
    import os

    from mooncake_store.common.grant import WriteFence
    from mooncake_store.common.shm_fence import FencePage, FenceView

    page = FencePage()
    mapper = ShmMapper()
    mapper._fences[7] = FenceView(os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY))
    try:
        page.publish(WriteFence(0, frozenset()), None)  # every generation admitted
        host_ms = time.time() * 1000
        master_ms = host_ms + master_ahead_s * 1000
        page.publish_clock(master_ms - time.monotonic() * 1000)
        ended = _loc(int(master_ms - 5_000))
        assert mapper.copy_guard(ended, leased=True) is None
        later = max(host_ms, master_ms)
        assert mapper.copy_guard(_loc(int(later + 10_000)), leased=True) is not None
        assert mapper.copy_guard(_loc(int(min(host_ms, master_ms) + 10_000)), leased=True) is None
        assert abs(mapper.master_now_ms(7) - later) < 1_000
    finally:
        mapper._fences.pop(7).close()
        page.close()


def test_a_dma_read_lease_ends_by_the_masters_clock_the_node_shows():
    """A GPU read of a same-host pool (client/cuda.py) discards what it read once its read
    lease ended: by the later of this host's clock and the master's as the node shows it, so a
    master whose clock runs ahead (it does not follow its wall clock back) is not out-waited."""
    import os
    from functools import partial

    from mooncake_store.client.cuda import _lease_over
    from mooncake_store.common.shm_fence import FencePage, FenceView

    page = FencePage()
    mapper = ShmMapper()
    mapper._fences[7] = FenceView(os.open(f"/proc/self/fd/{page.fd}", os.O_RDONLY))
    try:
        master_ms = time.time() * 1000 + 120_000  # the master's clock 2 minutes ahead
        page.publish_clock(master_ms - time.monotonic() * 1000)
        lease = sign_grant(b"k" * 32, Grant(7, 0, 4096, int(master_ms - 60_000), GrantMode.READ))
        assert not _lease_over(lease)  # by this host's clock alone: a minute to go
        assert _lease_over(lease, partial(mapper.master_now_ms, 7))  # ended a minute ago
        live = sign_grant(b"k" * 32, Grant(7, 0, 4096, int(master_ms + 60_000), GrantMode.READ))
        assert not _lease_over(live, partial(mapper.master_now_ms, 7))
    finally:
        mapper.close()
        page.close()
