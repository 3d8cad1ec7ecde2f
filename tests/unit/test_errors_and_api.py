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
        "IdentityMismatchError",
        "InvalidArgumentError",
        "InvalidKeyError",
        "InvalidValueError",
        "MasterUnavailableError",
        "MooncakeError",
        "NoSpaceError",
        "NodeStatus",
        "ObjectBusyError",
        "ObjectNotFoundError",
        "PrefixRead",
        "PutResult",
        "ReplicaUnavailableError",
        "Retry",
        "RpcError",
        "SegmentNotFoundError",
    ]
    for name in mooncake_store.__all__:
        assert hasattr(mooncake_store, name)


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
