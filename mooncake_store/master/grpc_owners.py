"""Owners of puts started over gRPC, and how the master learns that their connection is gone.

A framed connection tells the master when it closes, and its pending puts are revoked at once
(`MasterServicer.connection_closed`).  gRPC tells a server of no connection's end, so a client
that started puts over gRPC and vanished used to hold their space until `--put-timeout`.  Here
each gRPC connection is named by its peer address (`context.peer()`, e.g.
``ipv4:127.0.0.1:50312``: the client's port makes it one TCP connection), and the master's tick
asks the kernel which of those connections are still established (``/proc/net/tcp`` and
``tcp6``, the master's own network namespace).  The puts of a connection that is no longer
listed are revoked like a framed connection's.

The parsing is pure (`parse_peer`, `established_remotes`); `GrpcOwners` is the registry.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

#: Framed connections number their owners from 1 up; gRPC owners start here so the two never
#: meet.
GRPC_OWNER_BASE = 1 << 48

#: /proc/net/tcp's state column for ESTABLISHED.  Any other state (CLOSE_WAIT: the client
#: closed; or the line gone) means the connection will carry no PutEnd.
_ESTABLISHED = "01"

PROC_NET_TCP = ("/proc/net/tcp", "/proc/net/tcp6")

Remote = tuple[str, int]  # (normalised IP address, port)


def _normalise(ip: str) -> str:
    addr = ipaddress.ip_address(ip)
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


def parse_peer(peer: str) -> Remote | None:
    """``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` -> (ip, port); None for anything else (unix:...)."""
    try:
        kind, rest = peer.split(":", 1)
        if kind == "ipv4":
            host, port = rest.rsplit(":", 1)
        elif kind == "ipv6":
            host, port = rest.rsplit(":", 1)
            host = host.strip("[]")
        else:
            return None
        return _normalise(host), int(port)
    except ValueError:
        return None


def _hex_ip(text: str) -> str:
    """/proc/net/tcp's address: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(text)
    swapped = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return _normalise(str(ipaddress.ip_address(swapped)))


def established_remotes(lines: Iterable[str], local_port: int) -> set[Remote]:
    """The remote ends of ESTABLISHED connections to `local_port`, from /proc/net/tcp(6) text."""
    found: set[Remote] = set()
    for line in lines:
        fields = line.split()
        if len(fields) < 4 or fields[3] != _ESTABLISHED or ":" not in fields[1]:
            continue  # the header line, or a connection in another state
        try:
            _, local_port_hex = fields[1].split(":")
            if int(local_port_hex, 16) != local_port:
                continue
            remote_ip, remote_port_hex = fields[2].split(":")
            found.add((_hex_ip(remote_ip), int(remote_port_hex, 16)))
        except ValueError:
            continue
    return found


def read_established(local_port: int, paths: Iterable[str] = PROC_NET_TCP) -> set[Remote] | None:
    """What the kernel lists now; None when no table could be read (then nothing is revoked)."""
    found: set[Remote] = set()
    read_any = False
    for path in paths:
        try:
            with open(path) as f:
                found |= established_remotes(f, local_port)
            read_any = True
        except OSError:
            continue
    return found if read_any else None


class GrpcOwners:
    """gRPC peer -> owner id, for the puts a connection starts (`owner_for`), and the owners
    whose connection is gone (`closed`)."""

    def __init__(self) -> None:
        self._owner: dict[Remote, int] = {}
        self._next = GRPC_OWNER_BASE

    def __len__(self) -> int:
        return len(self._owner)

    def owner_for(self, peer: str) -> int:
        """The owner id of this gRPC connection (0: not a TCP peer; its puts are not tracked)."""
        remote = parse_peer(peer)
        if remote is None:
            return 0
        owner = self._owner.get(remote)
        if owner is None:
            owner = self._owner[remote] = self._next
            self._next += 1
        return owner

    def closed(self, established: set[Remote]) -> list[int]:
        """Forget and return the owners whose connection is not in `established`."""
        gone = [remote for remote in self._owner if remote not in established]
        return [self._owner.pop(remote) for remote in gone]
