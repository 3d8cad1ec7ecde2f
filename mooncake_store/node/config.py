"""Settings of the store node daemon (`mooncake-store`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_store.common.config import duration_field, size_field
from mooncake_store.common.errors import InvalidArgumentError


@dataclass(frozen=True)
class NodeConfig:
    master: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = 0
    health_port: int = 0
    dram_bytes: int = size_field(1024**3)
    node_id: str = ""
    mount_timeout_s: float = duration_field(5.0)

    def __post_init__(self) -> None:
        for name in ("port", "health_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgumentError(
                    f"{name} must be 0-65535 (0 picks a free one), got {value}"
                )
        if self.dram_bytes < 1024 * 1024:
            raise InvalidArgumentError(
                f"dram_bytes must be at least 1MiB, got {self.dram_bytes}: pass e.g. --dram 1GiB"
            )
        if ":" not in self.master:
            raise InvalidArgumentError(f"master must be host:port, got {self.master!r}")
