"""The exception tree, its wire codes, and the pinned public surface."""

import mooncake_store
from mooncake_store.common import errors


def test_public_surface_is_pinned_and_sorted():
    assert mooncake_store.__all__ == sorted(mooncake_store.__all__)
    assert mooncake_store.__all__ == [
        "AccessDeniedError",
        "AsyncClient",
        "BufferTooSmallError",
        "ChecksumMismatchError",
        "Client",
        "ClusterStats",
        "DataPathError",
        "GrantExpiredError",
        "IdentityConflictError",
        "IdentityMismatchError",
        "InvalidArgumentError",
        "InvalidKeyError",
        "InvalidValueError",
        "MasterTimeoutError",
        "MasterUnavailableError",
        "MooncakeError",
        "NoSpaceError",
        "NodeStatus",
        "ObjectBusyError",
        "ObjectConflictError",
        "ObjectHasLeaseError",
        "ObjectNotFoundError",
        "PrefixRead",
        "PutResult",
        "ReplicaUnavailableError",
        "Retry",
        "RpcError",
        "SegmentNotFoundError",
        "TlsConfig",
        "TlsError",
    ]
    for name in mooncake_store.__all__:
        assert hasattr(mooncake_store, name)


def test_every_error_class_is_importable_from_the_package():
    # The README tells users to catch these by name (`from mooncake_store import
    # ObjectConflictError`); an error class missing from the package is a trap.
    error_classes = {
        name
        for name, c in vars(errors).items()
        if isinstance(c, type) and issubclass(c, errors.MooncakeError)
    }
    assert error_classes - set(mooncake_store.__all__) == set()
    for name in error_classes:
        assert getattr(mooncake_store, name) is getattr(errors, name)


def test_codes_are_unique_and_round_trip():
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, errors.MooncakeError)
    ]
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    for cls in classes:
        err = errors.error_for_code(cls.code, "msg")
        assert type(err) is cls and err.code == cls.code and err.message == "msg"
    unknown = errors.error_for_code(-12345, "later version")
    assert type(unknown) is errors.MooncakeError and unknown.code == -12345


def test_builtin_bases():
    assert issubclass(errors.ObjectNotFoundError, KeyError)
    assert issubclass(errors.InvalidKeyError, ValueError)
    assert issubclass(errors.InvalidValueError, TypeError)
    assert issubclass(errors.BufferTooSmallError, ValueError)
    assert issubclass(errors.MasterUnavailableError, ConnectionError)
    assert str(errors.ObjectNotFoundError("no object under key 'k'")) == "no object under key 'k'"


def test_fused_copy_checksum_matches_copy_then_hash():
    import numpy as np

    from mooncake_store.client.steps import _FUSE_CHUNK, _SPLIT_COPY, copy_checksum
    from mooncake_store.common.checksum import checksum

    rng = np.random.default_rng(7)
    sizes = (1, 4095, _FUSE_CHUNK - 1, _FUSE_CHUNK, _FUSE_CHUNK + 1, 3 * _FUSE_CHUNK + 17,
             _SPLIT_COPY, _SPLIT_COPY + 4097, 9 * _FUSE_CHUNK + 1)  # fmt: skip
    for size in sizes:
        src = rng.integers(0, 256, size, dtype=np.uint8)
        dest = np.zeros(size + 8, dtype=np.uint8)
        digest = copy_checksum(memoryview(dest)[:size], memoryview(src))
        assert digest == checksum(src.tobytes())
        assert dest[:size].tobytes() == src.tobytes() and not dest[size:].any()


def test_split_copies_from_many_threads_stay_right():
    """Big copies share one helper thread: the caller that finds it busy copies alone, and
    every copy still lands whole with the right checksum; a failed helper copy raises."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np
    import pytest

    from mooncake_store.client.steps import _HELPER, _SPLIT_COPY, copy_checksum
    from mooncake_store.common.checksum import checksum

    rng = np.random.default_rng(11)
    sources = [rng.integers(0, 256, _SPLIT_COPY + i * 8192, dtype=np.uint8) for i in range(4)]

    def copy(i: int) -> bool:
        src = sources[i % 4]
        dest = np.empty_like(src)
        digest = copy_checksum(memoryview(dest), memoryview(src))
        return digest == checksum(src) and np.array_equal(dest, src)

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(copy, range(24)))

    splits = _HELPER.splits
    assert copy(0) and _HELPER.splits == splits + 1  # alone: the helper took the back half

    src = sources[0]
    short = np.empty(len(src) - 4096, dtype=np.uint8)
    with pytest.raises(ValueError, match="into a buffer of"):
        copy_checksum(memoryview(short), memoryview(src))

    def failing(to: memoryview, frm: memoryview) -> int:
        raise OSError("bad page")

    kept = _HELPER._copy
    _HELPER._copy = failing  # the helper's half fails: the caller raises, never returns
    try:
        with pytest.raises(OSError, match="bad page"):
            copy(0)
    finally:
        _HELPER._copy = kept
    assert not _HELPER.thread.busy
    assert copy(0) and _HELPER.splits == splits + 3  # free again after the failure


def test_host_staging_reuses_buffers_by_size_class():
    from mooncake_store.client.device import HostStaging

    staging = HostStaging(per_class=2)
    a = staging.take(100_000)
    assert len(a) == 128 * 1024  # power-of-two class, at least 64 KiB
    staging.give(a)
    assert staging.take(70_000) is a  # same class: the warm buffer comes back
    big = staging.take(staging.max_kept_bytes + 1)
    staging.give(big)
    assert staging.take(staging.max_kept_bytes + 1) is not big  # too big to keep


# Mooncake Store's own ErrorCode values (mooncake-store/include/types.h): a code this project
# shares with Mooncake must mean the same thing, so an engine reading it is never misled.
MOONCAKE_CODES = {
    -1: "INTERNAL_ERROR", -10: "BUFFER_OVERFLOW", -100: "SHARD_INDEX_OUT_OF_RANGE",
    -101: "SEGMENT_NOT_FOUND", -102: "SEGMENT_ALREADY_EXISTS", -103: "CLIENT_NOT_FOUND",
    -200: "NO_AVAILABLE_HANDLE", -300: "INVALID_VERSION", -400: "INVALID_KEY",
    -500: "WRITE_FAIL", -600: "INVALID_PARAMS", -601: "ILLEGAL_CLIENT", -700: "INVALID_WRITE",
    -701: "INVALID_READ", -702: "INVALID_REPLICA", -703: "REPLICA_IS_NOT_READY",
    -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS", -706: "OBJECT_HAS_LEASE",
    -707: "LEASE_EXPIRED", -708: "OBJECT_HAS_REPLICATION_TASK",
    -709: "OBJECT_NO_REPLICATION_TASK", -710: "REPLICA_NOT_FOUND",
    -711: "REPLICA_ALREADY_EXISTS", -712: "REPLICA_IS_GONE", -800: "TRANSFER_FAIL",
    -801: "CHECKSUM_MISMATCH", -900: "RPC_FAIL", -901: "RPC_TIMEOUT",
    -1010: "UNAVAILABLE_IN_CURRENT_STATUS", -1011: "UNAVAILABLE_IN_CURRENT_MODE",
    -1012: "NOT_SUPPORTED",
}  # fmt: skip

# What each shared number means here: the class that carries it.
SAME_MEANING = {
    "INTERNAL_ERROR": "MooncakeError", "SEGMENT_NOT_FOUND": "SegmentNotFoundError",
    "SEGMENT_ALREADY_EXISTS": "IdentityConflictError",
    "NO_AVAILABLE_HANDLE": "NoSpaceError", "INVALID_KEY": "InvalidKeyError",
    "INVALID_PARAMS": "InvalidArgumentError", "REPLICA_IS_NOT_READY": "ObjectBusyError",
    "OBJECT_NOT_FOUND": "ObjectNotFoundError", "OBJECT_HAS_LEASE": "ObjectHasLeaseError",
    "LEASE_EXPIRED": "GrantExpiredError", "TRANSFER_FAIL": "DataPathError",
    "CHECKSUM_MISMATCH": "ChecksumMismatchError", "RPC_FAIL": "RpcError",
    "RPC_TIMEOUT": "MasterTimeoutError",
}  # fmt: skip


def test_codes_shared_with_mooncake_mean_the_same():
    for cls in vars(errors).values():
        if not (isinstance(cls, type) and issubclass(cls, errors.MooncakeError)):
            continue
        name = MOONCAKE_CODES.get(cls.code)
        if name is not None:
            assert SAME_MEANING.get(name) == cls.__name__, (
                f"{cls.__name__} uses {cls.code}, which is Mooncake's {name}"
            )


def test_docs_errors_table_matches_the_code():
    from pathlib import Path

    table = (Path(__file__).resolve().parents[2] / "docs" / "ERRORS.md").read_text()
    for cls in vars(errors).values():
        if isinstance(cls, type) and issubclass(cls, errors.MooncakeError):
            assert f"| {cls.code} | `{cls.__name__}`" in table, cls.__name__


def test_a_put_copy_takes_the_helper_from_4_mib_and_a_read_copy_from_8():
    """A same-host put's copy into the pool splits from 4 MiB (nothing else runs meanwhile); a
    read's copy out of it from 8 MiB (it runs while the master answers).  Both land whole."""
    import numpy as np

    from mooncake_store.client.steps import (
        _HELPER,
        _SPLIT_PUT,
        copy_out_checksum,
        copy_parts_into,
    )
    from mooncake_store.common.checksum import checksum

    src = np.random.default_rng(5).integers(0, 256, _SPLIT_PUT + 12345, dtype=np.uint8)
    pool = np.empty_like(src)
    before = _HELPER.splits
    assert copy_parts_into(memoryview(pool), [memoryview(src)]) == checksum(src)
    assert np.array_equal(pool, src) and _HELPER.splits == before + 1
    out = np.empty_like(src)
    assert copy_out_checksum(memoryview(pool), [memoryview(out)]) == checksum(src)
    assert np.array_equal(out, src) and _HELPER.splits == before + 1  # on one thread
