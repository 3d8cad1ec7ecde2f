"""Mooncake Store's integer return codes, and the one table from this store's errors to them.

Mooncake's Python API returns 0 or a negative `ErrorCode` (mooncake-store/include/types.h)
where this SDK raises.  Every error of `mooncake_store.common.errors` whose code is also one of
Mooncake's means the same thing (a unit test pins it), so such a code passes through; the
project's own codes map to the nearest Mooncake meaning here.  docs/ERRORS.md has the table.
"""

from __future__ import annotations

from mooncake_store.common.errors import (
    AccessDeniedError,
    IdentityMismatchError,
    InvalidArgumentError,
    MooncakeError,
    ObjectConflictError,
    ReplicaUnavailableError,
    RpcError,
)

OK = 0
INTERNAL_ERROR = -1
BUFFER_OVERFLOW = -10
SEGMENT_NOT_FOUND = -101
NO_AVAILABLE_HANDLE = -200
INVALID_KEY = -400
INVALID_PARAMS = -600
REPLICA_IS_NOT_READY = -703
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
LEASE_EXPIRED = -707
REPLICA_IS_GONE = -712
TRANSFER_FAIL = -800
CHECKSUM_MISMATCH = -801
RPC_FAIL = -900
RPC_TIMEOUT = -901
NOT_SUPPORTED = -1012

#: Every Mooncake code this layer can return, by name.
MOONCAKE_CODES: dict[int, str] = {
    OK: "OK", INTERNAL_ERROR: "INTERNAL_ERROR", BUFFER_OVERFLOW: "BUFFER_OVERFLOW",
    SEGMENT_NOT_FOUND: "SEGMENT_NOT_FOUND", NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE",
    INVALID_KEY: "INVALID_KEY", INVALID_PARAMS: "INVALID_PARAMS",
    REPLICA_IS_NOT_READY: "REPLICA_IS_NOT_READY", OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND",
    OBJECT_ALREADY_EXISTS: "OBJECT_ALREADY_EXISTS", OBJECT_HAS_LEASE: "OBJECT_HAS_LEASE",
    LEASE_EXPIRED: "LEASE_EXPIRED", REPLICA_IS_GONE: "REPLICA_IS_GONE",
    TRANSFER_FAIL: "TRANSFER_FAIL", CHECKSUM_MISMATCH: "CHECKSUM_MISMATCH",
    RPC_FAIL: "RPC_FAIL", RPC_TIMEOUT: "RPC_TIMEOUT", NOT_SUPPORTED: "NOT_SUPPORTED",
}  # fmt: skip


def code_of(exc: BaseException) -> int:
    """The Mooncake code for an exception raised by this store (or a caller's bad input)."""
    if isinstance(exc, MooncakeError):
        if exc.code in MOONCAKE_CODES:
            return exc.code
        if isinstance(exc, InvalidArgumentError):
            return INVALID_PARAMS  # a bad value or a buffer too small for the object
        if isinstance(exc, ReplicaUnavailableError):
            return REPLICA_IS_GONE  # committed, but no replica can be read now
        if isinstance(exc, IdentityMismatchError):
            return OBJECT_NOT_FOUND  # not served to this reader
        if isinstance(exc, ObjectConflictError):
            return OBJECT_ALREADY_EXISTS  # stored with another value, which is kept
        if isinstance(exc, AccessDeniedError):
            return TRANSFER_FAIL  # the node refused the transfer
        if isinstance(exc, RpcError):
            return RPC_FAIL  # the master is unreachable, or the call failed
        return INTERNAL_ERROR
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        return INVALID_PARAMS
    return INTERNAL_ERROR
