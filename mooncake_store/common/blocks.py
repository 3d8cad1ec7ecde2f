"""A block held in a persistent tier: what a node indexes on disk and reports when it mounts."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BlockRecord:
    key: str
    offset: int
    size_bytes: int
    checksum: int
    fingerprint: bytes = b""
    parent_key: str = ""
    tag: bytes = b""
