"""gRPC channel and server options shared by every daemon and client."""

from __future__ import annotations


def message_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Raise both message caps: gRPC's 4 MiB default rejects a 4 MiB block plus framing."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]


DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
