"""Settings of the store node daemon (`mooncake-store`)."""

from __future__ import annotations

from dataclasses import dataclass

from mooncake_store.common.config import duration_field, size_field
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.tls import TlsConfig


@dataclass(frozen=True)
class NodeConfig:
    master: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = 0
    control_port: int = 0
    dram_bytes: int = size_field(1024**3)
    nvme_dir: str = ""
    nvme_bytes: int = size_field(0)
    io_threads: int = 2
    gpu_bytes: int = size_field(0)
    node_id: str = ""
    mount_timeout_s: float = duration_field(5.0)
    # TLS (common/tls.py): PEM paths; cert + key serve TLS on the data port and the control
    # service, and every connection the node opens (master, other nodes) verifies against ca.
    tls_cert: str = ""
    tls_key: str = ""
    tls_ca: str = ""
    tls_require_client_cert: bool = True

    @property
    def tls(self) -> TlsConfig:
        return TlsConfig(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)

    def __post_init__(self) -> None:
        self.tls.check_daemon()
        for name in ("port", "control_port"):
            value = getattr(self, name)
            if not 0 <= value <= 65535:
                raise InvalidArgumentError(
                    f"{name} must be 0-65535 (0 picks a free one), got {value}"
                )
        if self.dram_bytes < 1024 * 1024:
            raise InvalidArgumentError(
                f"dram_bytes must be at least 1MiB, got {self.dram_bytes}: pass e.g. --dram 1GiB"
            )
        if self.nvme_bytes and not self.nvme_dir:
            raise InvalidArgumentError("nvme_bytes needs nvme_dir: pass --nvme-dir DIR")
        if self.nvme_dir and self.nvme_bytes < 1024 * 1024:
            raise InvalidArgumentError(
                f"nvme_bytes must be at least 1MiB with an NVMe tier, got {self.nvme_bytes}: "
                "pass e.g. --nvme 64GiB"
            )
        if self.io_threads < 1:
            raise InvalidArgumentError(f"io_threads must be >= 1, got {self.io_threads}")
        if ":" not in self.master:
            raise InvalidArgumentError(f"master must be host:port, got {self.master!r}")
