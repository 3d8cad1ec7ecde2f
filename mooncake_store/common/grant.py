"""Signed access grants: the capability a store node checks on every data-path access.

The master owns allocation inside every mounted segment.  When it hands a client a replica
location (PutStart for writing, GetReplicaList for reading) it signs a grant with the secret the
node gave it at mount time.  The node verifies the signature, the segment, the mode, the expiry
and that the access lies inside the granted extent, so a client can touch only allocations the
master told it about, and only while its put window or read lease lasts.  Expiry is the
master's wall clock (milliseconds since the epoch); a node checks it against the master's clock
as heartbeat replies carry it (node/master_clock.py), not against its own.

A WRITE grant also names its put's `generation` (unique per put in the master's lifetime; a
READ grant names the generation of the put that stored the object, 0 for an object restored
from RocksDB or adopted from a node's inventory, and nodes ignore it on reads).  A
node seals the bytes each write put in place against its generation, so a grant never writes
the same byte twice; and the master gives each node write fences per segment (`WriteFence`, in
the mount reply and pushed after puts end): generations below `floor` are ended unless listed
`open`, so a write grant stops working once its put was committed, revoked or removed (within a
master tick), long before its expiry.  See node/write_gate.py and master/fences.py.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from dataclasses import dataclass
from enum import IntFlag

_BODY = struct.Struct("<QQQQBQ")  # segment, offset, size, expiry, mode, put generation
_MAC_BYTES = 16
GRANT_BYTES = _BODY.size + _MAC_BYTES


class GrantMode(IntFlag):
    READ = 1
    WRITE = 2


@dataclass(frozen=True, slots=True)
class Grant:
    segment_id: int
    offset: int
    size_bytes: int
    expires_ms: int
    mode: GrantMode
    generation: int = 0  # the put of a WRITE grant, or that stored a READ grant's object (0: none)

    def covers(self, offset: int, size_bytes: int, mode: GrantMode) -> bool:
        """True when [offset, offset+size_bytes) lies in the grant and `mode` is allowed."""
        return (
            bool(self.mode & mode)
            and offset >= self.offset
            and offset + size_bytes <= self.offset + self.size_bytes
        )


_KEYED: dict[bytes, hashlib.blake2b] = {}  # secret -> BLAKE2b with the key absorbed


def _mac(secret: bytes, body: bytes) -> bytes:
    # Keyed BLAKE2b is a MAC by design (no HMAC construction needed): ~0.4 us from a copy of a
    # state that has absorbed the key (~0.6 us keying it each time), against ~2.5 us for
    # HMAC-SHA256.  The master signs one grant per replica per read.
    keyed = _KEYED.get(secret)
    if keyed is None:
        keyed = hashlib.blake2b(key=secret[:64], digest_size=_MAC_BYTES)
        if len(_KEYED) < 4096:  # one per node secret
            _KEYED[secret] = keyed
    h = keyed.copy()
    h.update(body)
    return h.digest()


def sign_grant(secret: bytes, grant: Grant) -> bytes:
    """Serialise and sign `grant` with the node's secret."""
    return sign(
        secret, grant.segment_id, grant.offset, grant.size_bytes, grant.expires_ms, grant.mode,
        grant.generation,
    )  # fmt: skip


def sign(
    secret: bytes,
    segment_id: int,
    offset: int,
    size_bytes: int,
    expires_ms: int,
    mode: int,
    generation: int = 0,
) -> bytes:
    """`sign_grant` from the fields, without building a Grant (the master's read path)."""
    body = _BODY.pack(segment_id, offset, size_bytes, expires_ms, mode, generation)
    return body + _mac(secret, body)


def verify_grant(secret: bytes, blob: bytes) -> Grant | None:
    """Return the grant if `blob` is well-formed and signed with `secret`, else None."""
    if len(blob) != GRANT_BYTES:
        return None
    body, mac = blob[: _BODY.size], blob[_BODY.size :]
    if not hmac.compare_digest(mac, _mac(secret, body)):
        return None
    segment_id, offset, size_bytes, expires_ms, mode, generation = _BODY.unpack(body)
    return Grant(segment_id, offset, size_bytes, expires_ms, GrantMode(mode), generation)


def grant_expires_ms(blob: bytes) -> int | None:
    """The expiry (wall-clock ms) a grant names, unverified (a client reading its own lease);
    None when the blob is not a grant."""
    if len(blob) != GRANT_BYTES:
        return None
    return int(_BODY.unpack_from(blob)[3])


def grant_generation(blob: bytes) -> int:
    """The put generation a grant names, unverified (0: none, or the blob is not a grant).

    A client cannot verify a grant (the node's secret signs it); it only compares what two
    grants from its master name: the WRITE grant of its put and a later READ grant of the
    object both name that put's generation (client/speculative.py), and whether the write
    fences its node shows in shared memory still admit a WRITE grant (common/shm_fence.py)."""
    if len(blob) != GRANT_BYTES:
        return 0
    return int(_BODY.unpack_from(blob)[5])


@dataclass(frozen=True, slots=True)
class WriteFence:
    """Which write grants of one segment still work: those of generation >= `floor` (puts the
    node has not heard of yet) and those listed in `open` (puts still being written)."""

    floor: int
    open: frozenset[int]

    def admits(self, generation: int) -> bool:
        return generation >= self.floor or generation in self.open
