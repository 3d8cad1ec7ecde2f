"""Which address a daemon advertises: the rule that keeps 0.0.0.0 out of replica locations.

A daemon binds `host` (loopback by default) and tells others where to reach it: a node puts its
data and control endpoints in every replica location, the master names its framed endpoint in
`Hello`.  A wildcard bind (0.0.0.0, ::) is no address to dial (a remote client would dial
itself), so the advertised host is `--advertise-host`, else the bound host unless it is a
wildcard, and a daemon that would have to advertise a wildcard refuses to start.
"""

from __future__ import annotations

import ipaddress
import socket

from mooncake_store.common.errors import InvalidArgumentError


def is_wildcard(host: str) -> bool:
    """True for an address that means "every interface" (0.0.0.0, ::, the empty host)."""
    host = host.strip().strip("[]")
    if not host:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        # The resolver's other spellings of 0.0.0.0 ("0", "0.0", "0x0", "000.0.0.0"):
        # getaddrinfo reads them with inet_aton, so they bind every interface too.
        try:
            return socket.inet_aton(host) == b"\0\0\0\0"
        except OSError:
            return False
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:0.0.0.0
    return ip.is_unspecified or (mapped is not None and mapped.is_unspecified)


def advertised_host(host: str, advertise_host: str) -> str:
    """The host to advertise for a daemon bound to `host`.

    Raises:
        InvalidArgumentError: the result would be a wildcard address.
    """
    if advertise_host:
        if is_wildcard(advertise_host):
            raise InvalidArgumentError(
                f"--advertise-host {advertise_host} is not an address anyone can dial: pass the "
                "address (or DNS name) clients reach this daemon at"
            )
        return advertise_host
    if is_wildcard(host):
        raise InvalidArgumentError(
            f"--host {host or '(empty)'} binds every interface, but that is no address to "
            "advertise (remote clients would dial themselves): set --advertise-host to the "
            "address clients reach this daemon at"
        )
    return host


def join_host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 address in brackets."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def split_host_port(endpoint: str) -> tuple[str, int]:
    """(host, port) of host:port or [v6]:port (brackets removed).

    Raises:
        ValueError: no port.
    """
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        raise ValueError(f"{endpoint!r} is not host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)
