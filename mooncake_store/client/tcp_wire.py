"""What both TCP data paths share: request planning, hashed sends and receives, errors."""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from functools import partial

from mooncake_store.client.transport import Buffer, Hasher, nbytes
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.checksum import CHUNK_BYTES
from mooncake_store.common.errors import (
    DataPathError,
)
from mooncake_store.common.grant import GRANT_BYTES
from mooncake_store.common.helper_thread import HelperThread
from mooncake_store.common.tls import describe_tls_failure
from mooncake_store.common.wire import (
    MAX_READV_ENTRIES,
    Op,
    pack_readv,
    pack_request,
)

_READV_BYTES = 64 * 1024 * 1024  # per READV reply: the node queues it all at once


def plan_node_requests(
    transfers: list[tuple[ReplicaLocation, Op, Buffer]], items: list[int], readv: bool
) -> list[tuple[bytes, Buffer | None, list[int]]]:
    """A node's requests as (frame, payload, transfers covered): its DRAM reads in READVs
    of up to MAX_READV_ENTRIES entries and _READV_BYTES bytes, the rest one by one."""
    out: list[tuple[bytes, Buffer | None, list[int]]] = []
    group: list[int] = []
    group_bytes = 0

    def flush() -> None:
        nonlocal group, group_bytes
        if len(group) == 1:
            loc, op, _ = transfers[group[0]]
            out.append((pack_request(op, loc.grant, loc.offset, loc.size_bytes), None, group))
        elif group:
            entries = [(transfers[i][0].grant, transfers[i][0].offset,
                        transfers[i][0].size_bytes) for i in group]  # fmt: skip
            out.append((pack_readv(entries), None, group))
        group, group_bytes = [], 0

    for i in items:
        loc, op, buffer = transfers[i]
        if readv and op is Op.READ and loc.tier == "DRAM" and len(loc.grant) == GRANT_BYTES:
            size = nbytes(buffer)
            if len(group) == MAX_READV_ENTRIES or group_bytes + size > _READV_BYTES:
                flush()
            group.append(i)
            group_bytes += size
            continue
        flush()
        frame = pack_request(op, loc.grant, loc.offset, loc.size_bytes)
        out.append((frame, buffer if op is Op.WRITE else None, [i]))
    flush()
    return out


_HASH_STEP = CHUNK_BYTES  # a payload is hashed this much at a time, just before it is sent
# From here the payload is hashed on the send-hash helper while it is sent.  On this 2-core
# VM, 4 MiB over loopback: ~1,120 us hashed a step at a time, ~700 us overlapped, ~680 us
# unhashed (the send stalls while a step is hashed; overlapped, it never does).  A put of one
# chunk gains nothing (the hand-off costs what the overlap saves: scripts/bench_send_hash.py).
OVERLAP_MIN = 2 * CHUNK_BYTES
# What one `write` sends at most: a socket's timeout bounds one call, so a big value is never
# one call that must end within it.
SEND_STEP = 4 * CHUNK_BYTES
_SEND_HASH = HelperThread("mooncake-send-hash")


def write_hashed(
    write: Callable[[memoryview], object], payload: Buffer, hasher: Hasher | None
) -> None:
    """Send `payload` (a buffer, or parts sent in order) with `write`, in steps of at most
    SEND_STEP bytes (a socket's timeout bounds each step, not the whole value), feeding
    `hasher` every byte in order.  From OVERLAP_MIN bytes, when the process's send-hash helper
    is free, the helper hashes the payload while the steps go out, and the call returns once
    both are done; otherwise each step is hashed just before it is sent, so the send reads it
    from cache instead of memory."""
    if not isinstance(payload, memoryview):
        for part in payload:
            write_hashed(write, part, hasher)
        return
    if (
        hasher is not None
        and len(payload) >= OVERLAP_MIN
        and _SEND_HASH.start(partial(hasher.update, payload))
    ):
        try:
            for start in range(0, len(payload), SEND_STEP):
                write(payload[start : start + SEND_STEP])
        except BaseException:
            try:
                _SEND_HASH.wait()  # the hasher is the caller's again only once it is done
            except Exception:
                pass  # the send's failure is the one to report
            raise
        _SEND_HASH.wait()
        return
    step = SEND_STEP if hasher is None else _HASH_STEP
    for start in range(0, len(payload), step):
        piece = payload[start : start + step]
        if hasher is not None:
            hasher.update(piece)
        write(piece)


def _send_requests(
    sock: socket.socket,
    requests: list[tuple[bytes, Buffer | None, list[int]]],
    hashers: Sequence[Hasher | None],
) -> tuple[int, OSError | None]:
    """Send (frame, payload) requests in order, feeding a payload's hasher (by the request's
    transfer): how many went out in full, and the failure."""
    sent = 0
    try:
        for frame, payload, covered in requests:
            sock.sendall(frame)
            if payload is not None:
                write_hashed(sock.sendall, payload, hashers[covered[0]])
            sent += 1
    except OSError as exc:
        return sent, exc
    return sent, None


class _StaleConnection(Exception):
    pass


def _connect_failed(endpoint: str, exc: BaseException) -> DataPathError:
    explained = describe_tls_failure(exc, f"store node {endpoint}")
    if explained is not None:
        return DataPathError(explained)
    return DataPathError(f"cannot connect to store node {endpoint}: {exc!r}")


def _recv_exactly(sock: socket.socket, view: memoryview, hasher: Hasher | None = None) -> None:
    while len(view):
        n = sock.recv_into(view)
        if n == 0:
            raise DataPathError("store node closed the connection mid-reply")
        if hasher is not None:
            hasher.update(view[:n])  # just landed: still in cache
        view = view[n:]
