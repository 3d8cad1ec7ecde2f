"""The one exception tree of mooncake-store, with stable numeric codes.

Codes follow Mooncake Store's ranges: -100s segments and nodes, -200s allocation, -400 keys,
-600s bad input, -700s objects, -800s data path, -900s RPC.  Where a code here shares a number
with Mooncake's own `ErrorCode` it means the same thing (INVALID_KEY -400, REPLICA_IS_NOT_READY
-703, OBJECT_NOT_FOUND -704, OBJECT_HAS_LEASE -706, LEASE_EXPIRED -707, TRANSFER_FAIL -800,
CHECKSUM_MISMATCH -801, ...); this project's own errors sit on numbers Mooncake does not use
(-602, -603, -720, -721, -810, -910, -911).  docs/ERRORS.md has the whole table, and
`mooncake_store.compat.codes` turns any of these into the code a Mooncake caller expects.
The code travels on the wire (`Status.code` in proto/), and `error_for_code` is the single
table that turns it back into the most specific class.

    MooncakeError                      root; every error carries `.code`
    ├── InvalidArgumentError           (also ValueError) bad input, says what to do
    │   ├── InvalidKeyError            empty, over-long or non-str key
    │   ├── InvalidValueError          (also TypeError) not a buffer, empty, too large
    │   └── BufferTooSmallError        get_into target smaller than the object
    ├── SegmentNotFoundError           master does not know the node/segment
    ├── IdentityConflictError          a mount claims a live node's id or another's segment id
    ├── NoSpaceError                   no node can hold the object
    ├── ObjectNotFoundError            (also KeyError) no committed object under the key
    ├── ObjectBusyError                a put of the key is in progress
    ├── ObjectHasLeaseError            remove(force=False) of an object being read
    ├── ReplicaUnavailableError        the object exists but no replica could be read
    ├── ChecksumMismatchError          bytes read do not match the committed checksum
    ├── IdentityMismatchError          the object was stored under another identity
    ├── ObjectConflictError            the key holds a different value (another checksum)
    ├── DataPathError                  a transfer to or from a node failed
    │   └── AccessDeniedError          the node refused the grant (expired, forged, out of range)
    └── RpcError                       the master call failed
        ├── MasterUnavailableError     (also ConnectionError) master unreachable at an address
        ├── TlsError                   (also ConnectionError) TLS handshake failed (untrusted
                                       certificate, TLS on one side only)
        └── MasterTimeoutError         (also TimeoutError) no reply in time: outcome unknown
"""

from __future__ import annotations


class MooncakeError(Exception):
    """Root of every mooncake-store error.  `code` is stable and travels on the wire."""

    code: int = -1

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(MooncakeError, ValueError):
    code = -600


class InvalidKeyError(InvalidArgumentError):
    code = -400  # Mooncake INVALID_KEY


class InvalidValueError(InvalidArgumentError, TypeError):
    code = -602


class BufferTooSmallError(InvalidArgumentError):
    code = -603


class SegmentNotFoundError(MooncakeError):
    code = -101


class IdentityConflictError(MooncakeError):
    """A mount claims the node id of a live node or a segment id another live node owns
    (Mooncake's SEGMENT_ALREADY_EXISTS).  The mount is refused; the live node is untouched."""

    code = -102


class NoSpaceError(MooncakeError):
    code = -200


class ObjectNotFoundError(MooncakeError, KeyError):
    code = -704

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class ObjectBusyError(MooncakeError):
    code = -703  # Mooncake REPLICA_IS_NOT_READY: the put has not ended


class ObjectHasLeaseError(MooncakeError):
    """A remove without `force` found the object under a read lease (or a copy in flight)."""

    code = -706  # Mooncake OBJECT_HAS_LEASE


class ReplicaUnavailableError(MooncakeError):
    code = -720


class ChecksumMismatchError(MooncakeError):
    code = -801  # Mooncake CHECKSUM_MISMATCH


class IdentityMismatchError(MooncakeError):
    code = -721


class ObjectConflictError(MooncakeError):
    """A put named a key that is already stored with a different value (checksum): the stored
    value is kept and the put is reported, not silently "deduplicated"."""

    code = -722


class DataPathError(MooncakeError):
    code = -800  # Mooncake TRANSFER_FAIL


class AccessDeniedError(DataPathError):
    code = -810


class GrantExpiredError(AccessDeniedError):
    """The grant's lease or put window ended before the node saw the access (the client
    re-asks the master once for a read)."""

    code = -707  # Mooncake LEASE_EXPIRED


class RpcError(MooncakeError):
    code = -900  # Mooncake RPC_FAIL


class MasterUnavailableError(RpcError, ConnectionError):
    code = -911  # (-901 is Mooncake's RPC_TIMEOUT: MasterTimeoutError)


class TlsError(RpcError, ConnectionError):
    """The TLS handshake with the master failed: its certificate is not trusted by the CA the
    client was given, or only one side speaks TLS.  Not retried: it fails the same way again."""

    code = -910


class MasterTimeoutError(RpcError, TimeoutError):
    """A master call got no reply within the client's `timeout_s`.  The call may or may not
    have taken effect; the client retries it only where repeating it is safe (lookups, and a
    PutEnd, which the master answers the same way twice)."""

    code = -901  # Mooncake RPC_TIMEOUT


OK = 0

_BY_CODE: dict[int, type[MooncakeError]] = {
    cls.code: cls
    for cls in (
        MooncakeError,
        InvalidArgumentError,
        InvalidKeyError,
        InvalidValueError,
        BufferTooSmallError,
        SegmentNotFoundError,
        IdentityConflictError,
        NoSpaceError,
        ObjectNotFoundError,
        ObjectBusyError,
        ObjectHasLeaseError,
        ReplicaUnavailableError,
        ChecksumMismatchError,
        IdentityMismatchError,
        ObjectConflictError,
        DataPathError,
        AccessDeniedError,
        GrantExpiredError,
        RpcError,
        MasterUnavailableError,
        TlsError,
        MasterTimeoutError,
    )
}


def error_for_code(code: int, message: str) -> MooncakeError:
    """Build the most specific exception for a wire code (unknown codes keep their number)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return MooncakeError(message, code=code)
    return cls(message)
