"""Settings of the store node daemon (`mooncake-store`)."""

from __future__ import annotations

import grp
from dataclasses import dataclass

from mooncake_store.common.addresses import advertised_host
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
    # Same-host clients of this uid get the DRAM pool over shared memory; a group (name or gid)
    # lets its members in too.  Everyone else uses TCP.
    shm_group: str = ""
    # The host put in this node's endpoints (clients and other nodes dial it); default: `host`,
    # which must then not be a wildcard (0.0.0.0, ::).
    advertise_host: str = ""

    @property
    def tls(self) -> TlsConfig:
        return TlsConfig(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)

    @property
    def shm_group_gid(self) -> int | None:
        """The gid of `shm_group` (None when unset)."""
        if not self.shm_group:
            return None
        if self.shm_group.isdigit():
            return int(self.shm_group)
        try:
            return grp.getgrnam(self.shm_group).gr_gid
        except KeyError:
            raise InvalidArgumentError(
                f"shm_group {self.shm_group!r} is not a group on this host: pass --shm-group "
                "with an existing group name or a numeric gid"
            ) from None

    @property
    def advertised_host(self) -> str:
        return advertised_host(self.host, self.advertise_host)

    def __post_init__(self) -> None:
        self.tls.check_daemon()
        self.advertised_host  # noqa: B018 (refuses to advertise a wildcard address)
        self.shm_group_gid  # noqa: B018 (resolves the group now: a bad name fails at start)
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
