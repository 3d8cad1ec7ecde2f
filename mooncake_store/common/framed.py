"""Framed control calls: MasterService messages over one persistent, pipelined TCP connection.

gRPC stays the contract and the way other languages reach the master.  A Python client would
otherwise pay ~0.7 ms of grpc.aio machinery per call on both ends, which is the whole budget of
a 64 KiB put, so the master also serves the per-key calls on a framed endpoint (its port is
advertised by `Hello`).  The messages are the proto's own request and reply types and the master
runs the same servicer methods, so both endpoints behave identically.

Request:  length u32 | call id u32 | method u16 | `length` bytes of the serialized request
Reply:    length u32 | call id u32 | status u16 | `length` bytes: the serialized reply (status
          OK) or a UTF-8 error message

When the master requires tokens, the first call of a connection must be `Authenticate` with a
token; any other call before it is answered UNAUTHENTICATED and the connection closed.  The
identity holds for the connection's life.

Many calls may be in flight on one connection; replies come in completion order and are matched
to their call by id.  A frame longer than the receiver's cap closes the connection.
"""

from __future__ import annotations

import struct
from enum import IntEnum

from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb

HEADER = struct.Struct("<IIH")

# Method ids are positions in this tuple: append only.
METHODS: tuple[str, ...] = (
    "BatchPutStart",
    "BatchPutEnd",
    "BatchPutRevoke",
    "BatchGetReplicaList",
    "PrefixMatch",
    "GetPrefix",
    "BatchExists",
    "BatchRemove",
    "ListNodes",
    "Stats",
    "BatchReportCorrupt",
    "ListKeys",  # issue 13
    "BatchDescribe",  # issue 13
    "BatchLeasedPut",  # issue 14
    "Authenticate",  # issue 12: the first call of a connection to a master with auth on
)
METHOD_IDS = {name: i for i, name in enumerate(METHODS)}


class FrameStatus(IntEnum):
    OK = 0
    UNKNOWN_METHOD = 1
    BAD_REQUEST = 2
    INTERNAL = 3
    UNAUTHENTICATED = 4  # no valid Authenticate yet (the connection is then closed)
    PERMISSION_DENIED = 5  # the caller's role may not make this call


def message_types(name: str) -> tuple[type[Message], type[Message]]:
    """The (request, reply) message classes of MasterService method `name`."""
    method = pb.DESCRIPTOR.services_by_name["MasterService"].methods_by_name[name]
    return getattr(pb, method.input_type.name), getattr(pb, method.output_type.name)


def split_frames(
    buffer: bytearray, max_frame_bytes: int
) -> tuple[list[tuple[int, int, bytes]], int]:
    """Complete frames at the front of `buffer` as (call id, method or status, payload), and
    how many bytes they took.  Raises ValueError on a frame longer than `max_frame_bytes`."""
    frames: list[tuple[int, int, bytes]] = []
    pos, end = 0, len(buffer)
    size = HEADER.size
    while end - pos >= size:
        length, call_id, code = HEADER.unpack_from(buffer, pos)
        if length > max_frame_bytes:
            raise ValueError(f"frame of {length} bytes exceeds the {max_frame_bytes}-byte cap")
        stop = pos + size + length
        if stop > end:
            break
        frames.append((call_id, code, bytes(buffer[pos + size : stop])))
        pos = stop
    return frames, pos


REPLY_TYPES: dict[str, type[Message]] = {name: message_types(name)[1] for name in METHODS}
