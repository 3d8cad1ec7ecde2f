"""Binary framing of the node's TCP data path.

Request:  header (24 bytes) | grant (grant_len bytes) | payload (WRITE: `size_bytes` bytes)
    magic u16 | op u8 | reserved u8 | grant_len u16 | reserved u16 | offset u64 | size_bytes u64
Response: header (16 bytes) | payload (READ: `size_bytes` bytes; error: a UTF-8 message)
    status i32 | reserved u32 | size_bytes u64

`offset` is relative to the node's segment and must lie inside the grant.  A connection answers
its requests in order (a client may pipeline them); after an error the node answers and goes on
serving the connection: a refused WRITE's payload is read and discarded (the client sends it in
full, as always).  The node closes the connection only after a malformed header, or a refused
WRITE whose size_bytes is over MAX_DRAIN_BYTES (it would not read that much to stay in step).

READV reads many DRAM extents in one request: its header has grant_len 0, offset 0 and
size_bytes = the number of entries, followed by the entries, each
    grant_len u16 | offset u64 | size_bytes u64 | grant (grant_len bytes)
with every grant_len equal (the client sends the master's fixed-size grants).  The reply is one
response header with size_bytes = the sum of the sizes, then the extents back to back; if any
entry is refused, the reply is that one error and nothing is sent.

DIGESTS (issue 13) asks for the checksum chunk digests of a granted DRAM extent instead of its
bytes: a READ's request, and a reply of le64 xxh3_64 digests of the extent's 1 MiB chunks
(docs/CHECKSUM.md), hashed by the node in place.  With them a client verifies a ranged read
while moving only the chunks the range touches.
"""

from __future__ import annotations

import struct
from enum import IntEnum

MAGIC = 0x4D43  # a little-endian u16: wire bytes 43 4D ("CM"); see docs/PROTOCOL.md
REQUEST = struct.Struct("<HBBHHQQ")
RESPONSE = struct.Struct("<iIQ")


class Op(IntEnum):
    READ = 1
    WRITE = 2
    PING = 3
    READV = 4
    DIGESTS = 5  # issue 13: chunk digests of a granted extent (ranged reads)


READV_ENTRY = struct.Struct("<HQQ")
MAX_READV_ENTRIES = 4096
# An error reply's message is at most this long; a reader takes no more of a longer one (it
# came from a broken or hostile peer) and drops the connection.
MAX_ERROR_BYTES = 64 * 1024
# The largest refused WRITE payload a node reads and discards to keep the connection in step;
# it hangs up on a refused WRITE announcing more (a hostile or garbled length).
MAX_DRAIN_BYTES = 1 << 32


def pack_request(op: Op, grant: bytes, offset: int, size_bytes: int) -> bytes:
    return REQUEST.pack(MAGIC, op, 0, len(grant), 0, offset, size_bytes) + grant


def pack_response(status: int, size_bytes: int) -> bytes:
    return RESPONSE.pack(status, 0, size_bytes)


def pack_readv(entries: list[tuple[bytes, int, int]]) -> bytes:
    """A READV request for (grant, offset, size_bytes) entries."""
    parts = [REQUEST.pack(MAGIC, Op.READV, 0, 0, 0, 0, len(entries))]
    for grant, offset, size_bytes in entries:
        parts.append(READV_ENTRY.pack(len(grant), offset, size_bytes))
        parts.append(grant)
    return b"".join(parts)
