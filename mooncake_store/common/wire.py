"""Binary framing of the node's TCP data path.

Request:  header (24 bytes) | grant (grant_len bytes) | payload (WRITE: `size_bytes` bytes)
    magic u16 | op u8 | reserved u8 | grant_len u16 | reserved u16 | offset u64 | size_bytes u64
Response: header (16 bytes) | payload (READ: `size_bytes` bytes; error: a UTF-8 message)
    status i32 | reserved u32 | size_bytes u64

`offset` is relative to the node's segment and must lie inside the grant.  A connection carries
one request at a time; after an error the node answers and, for a WRITE whose payload it did not
consume, closes the connection.
"""

from __future__ import annotations

import struct
from enum import IntEnum

MAGIC = 0x4D43  # "MC"
REQUEST = struct.Struct("<HBBHHQQ")
RESPONSE = struct.Struct("<iIQ")


class Op(IntEnum):
    READ = 1
    WRITE = 2
    PING = 3


def pack_request(op: Op, grant: bytes, offset: int, size_bytes: int) -> bytes:
    return REQUEST.pack(MAGIC, op, 0, len(grant), 0, offset, size_bytes) + grant


def pack_response(status: int, size_bytes: int) -> bytes:
    return RESPONSE.pack(status, 0, size_bytes)
