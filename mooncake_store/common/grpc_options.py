"""gRPC channel and server options shared by every daemon and client."""

from __future__ import annotations

import errno
import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mooncake_store.common.tls import TlsConfig

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Raise both message caps: gRPC's 4 MiB default rejects a 4 MiB block plus framing."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


def server_options(max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Options of every gRPC server: the message caps, and no SO_REUSEPORT.

    gRPC sets SO_REUSEPORT by default, so a second daemon started on a port already served
    binds it too and the kernel splits connections between the two at random.  Without it the
    second bind fails and the daemon exits with "port in use".
    """
    return [*message_options(max_message_bytes), ("grpc.so_reuseport", 0)]


def port_in_use(what: str, address: str) -> OSError:
    """The one-line start-up failure of a daemon whose port is taken."""
    return OSError(
        f"port in use: cannot bind the {what} to {address} (another process listens there; "
        "stop it or pick another port)"
    )


def _check_free(address: str, what: str) -> None:
    """Raise "port in use" when a listener holds host:port (port 0 is always free)."""
    host, _, port_text = address.rpartition(":")
    port = int(port_text)
    if port == 0:
        return
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(
            host.strip("[]") or None, port, type=socket.SOCK_STREAM
        )[0]
    except OSError:
        return  # gRPC reports the bad address itself
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gRPC binds
        try:
            probe.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise port_in_use(what, address) from exc


def bind_grpc(server: Any, address: str, tls: TlsConfig, what: str) -> int:
    """Add `address` to a gRPC server (sync or aio), TLS when `tls` serves; the bound port.

    Raises:
        OSError: "port in use ..." when the address cannot be bound.
    """
    _check_free(address, what)  # before gRPC, which would log its own error lines first
    try:
        if tls.serves:
            port = int(server.add_secure_port(address, tls.grpc_server_credentials()))
        else:
            port = int(server.add_insecure_port(address))
    except RuntimeError as exc:  # recent gRPC raises instead of returning 0
        raise port_in_use(what, address) from exc
    if port == 0:
        raise port_in_use(what, address)
    return port
