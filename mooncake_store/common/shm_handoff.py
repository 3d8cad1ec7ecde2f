"""The shared-memory hand-off: what a node's unix socket sends a same-host client, and who may ask.

On connect, the node checks the peer's credentials (`SO_PEERCRED`): a process of the node's own
uid, or one in the node's configured group (`--shm-group`, primary or supplementary), gets
`HELLO` (segment id, pool size) with the pool's memfd attached (SCM_RIGHTS), and a read-only
descriptor of the page that shows the node's write fences (common/shm_fence.py).  Anyone else gets
`REFUSED` and no descriptor, and uses the TCP data path.  The rules and the parsing live here,
with no I/O, so both ends and the tests share them.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import dataclass

HELLO = struct.Struct("<QQ")  # segment id, size
REFUSED = b"REFUSED"  # sent without a descriptor; never HELLO.size bytes long
_PEERCRED = struct.Struct("3i")  # pid, uid, gid


@dataclass(frozen=True, slots=True)
class Peer:
    pid: int
    uid: int
    gids: frozenset[int]


def peer_allowed(peer: Peer, *, node_uid: int, group_gid: int | None) -> bool:
    """True when `peer` may map the pool: the node's uid, or a member of its shm group."""
    return peer.uid == node_uid or (group_gid is not None and group_gid in peer.gids)


def supplementary_groups(status_text: str) -> frozenset[int]:
    """The `Groups:` of a /proc/<pid>/status text (empty when absent or malformed)."""
    for line in status_text.splitlines():
        if line.startswith("Groups:"):
            try:
                return frozenset(int(g) for g in line.split()[1:])
            except ValueError:
                return frozenset()
    return frozenset()


def peer_of(conn: socket.socket) -> Peer:
    """The credentials of a connected unix socket's peer (the kernel's, not the peer's word).

    The supplementary groups come from /proc/<pid>/status; a process that exited already shows
    its primary group only.
    """
    pid, uid, gid = _PEERCRED.unpack(
        conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    )
    try:
        with open(f"/proc/{pid}/status") as status:
            extra = supplementary_groups(status.read())
    except OSError:
        extra = frozenset()
    return Peer(pid, uid, frozenset({gid}) | extra)


class HandoffRefused(Exception):
    """The node refused this process its pool (wrong uid and not in its shm group)."""


def parse_hello(msg: bytes, fds: list[int]) -> tuple[int, int, int, int | None]:
    """(segment id, size, pool descriptor, fence page descriptor or None) from a hand-off
    reply; closes any descriptor it rejects.  A node sends the pool and, read-only, the page
    of its write fences (common/shm_fence.py); one that sends no page gets no copies into
    leases (the client writes them over TCP).

    Raises:
        HandoffRefused: the node said REFUSED.
        ValueError: anything else that is not one HELLO with one or two descriptors.
    """
    if len(fds) in (1, 2) and len(msg) == HELLO.size:
        segment_id, size = HELLO.unpack(msg)
        if size > 0:
            return segment_id, size, fds[0], fds[1] if len(fds) == 2 else None
    for fd in fds:
        os.close(fd)
    if not fds and msg == REFUSED:
        raise HandoffRefused("the node refused its shared-memory pool to this process")
    raise ValueError(f"malformed shared-memory hand-off ({len(msg)} bytes, {len(fds)} fds)")
