"""Settings of the store node daemon (`mooncake-store`): the one config object, passed down whole.

Every field is a setting with one name as flag, TOML key and env variable (see
`common/config.py`): `--dram`, `dram = "4GiB"`, `MOONCAKE_NODE_DRAM=4GiB`.
"""

from __future__ import annotations

import grp
from dataclasses import dataclass

from mooncake_store.common.addresses import advertised_host
from mooncake_store.common.auth import Role, node_secret_of
from mooncake_store.common.config import TlsSettings, duration_field, setting, size_field
from mooncake_store.common.credentials import discover_token, is_loopback, read_token_file
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError


@dataclass(frozen=True)
class NodeConfig(TlsSettings):
    master: str = setting("127.0.0.1:50051", "Master address host:port.")
    host: str = setting("127.0.0.1", "Address to bind.")
    advertise_host: str = setting(
        "",
        "Address clients and other nodes dial this node at (default: --host; required with "
        "0.0.0.0).",
    )
    port: int = setting(0, "TCP data port; 0 picks a free one.")
    control_port: int = setting(
        0, "gRPC port of the health and control services; 0 picks a free one."
    )
    metrics_port: int = setting(
        0,
        "Port of the Prometheus /metrics endpoint; 0 picks a free one (printed at start), -1: off.",
    )
    dram_bytes: int = size_field(
        1024**3, "DRAM pool, pre-faulted at start (at most the memory available).", flag="dram"
    )
    nvme_dir: str = setting("", "Directory of the NVMe tier (off when unset).")
    nvme_bytes: int = size_field(0, "NVMe tier size, e.g. 64GiB (needs --nvme-dir).", flag="nvme")
    io_threads: int = setting(2, "NVMe I/O queue depth (more on real NVMe).")
    gpu_bytes: int = size_field(0, "GPU tier size (needs a CUDA GPU and the [gpu] extra); 0: off.")
    node_id: str = setting("", "Stable node name (default hostname:port); a restart keeps it.")
    mount_timeout_s: float = duration_field(
        5.0,
        "How long a mount (the first, and every mount again after the master forgot this node) "
        "waits for the master's reply; heartbeats go on meanwhile.",
    )
    drain_timeout_s: float = duration_field(
        30.0,
        "On SIGTERM, how long to wait for the master to copy the blocks whose only replica is "
        "here to other nodes before unmounting (see master/drain.py); 0: no drain.",
    )
    # Timeouts and message caps of the node's calls (defaults as they were hard-coded).
    grpc_max_message_bytes: int = size_field(
        64 * 1024**2,
        "Largest gRPC message the node's control and data services send or receive.",
    )
    master_max_message_bytes: int = size_field(
        256 * 1024**2,
        "Largest gRPC message on the node's channel to the master (a mount carries the "
        "inventory of every block the node holds).",
    )
    master_call_timeout_s: float = duration_field(
        1.0,
        "Deadline of a heartbeat or a re-mount (the master's heartbeat interval when longer).",
    )
    drain_call_timeout_s: float = duration_field(
        5.0, "Deadline of each DrainNode call to the master while draining on SIGTERM."
    )
    drain_stall_s: float = duration_field(
        3.0,
        "A drain with nothing copied and nothing in flight for this long gives up (no other "
        "node can take the blocks).",
    )
    unmount_timeout_s: float = duration_field(
        2.0, "Deadline of the unmount call to the master at shutdown."
    )
    fetch_timeout_s: float = duration_field(
        30.0,
        "Deadline of connecting to and each read from the source node when the master has "
        "this node fetch a replica.",
    )
    shm_group: str = setting(
        "", "Group (name or gid) whose members, besides this uid, may map the pool (unset: none)."
    )

    token_file: str = setting(
        "",
        "File holding this node's token (mooncake-admin token create --role node --node-id ID); "
        "unset: MOONCAKE_TOKEN, MOONCAKE_TOKEN_FILE, then the master's local token file (same "
        "host, same user).  Required with a non-loopback --host.",
    )

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
                    f"--{name.replace('_', '-')} must be 0-65535 (0 picks a free one), got {value}"
                )
        if self.drain_timeout_s < 0:
            raise InvalidArgumentError(
                f"--drain-timeout must be >= 0 (0: no drain), got {self.drain_timeout_s}"
            )
        if not -1 <= self.metrics_port <= 65535:
            raise InvalidArgumentError(
                f"--metrics-port must be 0-65535 (0 picks a free one) or -1 (off), "
                f"got {self.metrics_port}"
            )
        if self.dram_bytes < 1024 * 1024:
            raise InvalidArgumentError(
                f"--dram must be at least 1MiB, got {self.dram_bytes} bytes: pass e.g. --dram 1GiB"
            )
        if self.nvme_bytes and not self.nvme_dir:
            raise InvalidArgumentError("--nvme needs --nvme-dir: pass --nvme-dir DIR")
        if self.nvme_dir and self.nvme_bytes < 1024 * 1024:
            raise InvalidArgumentError(
                f"--nvme must be at least 1MiB with an NVMe tier, got {self.nvme_bytes} bytes: "
                "pass e.g. --nvme 64GiB"
            )
        if self.io_threads < 1:
            raise InvalidArgumentError(f"--io-threads must be >= 1, got {self.io_threads}")
        for name in (
            "master_call_timeout_s",
            "drain_call_timeout_s",
            "drain_stall_s",
            "unmount_timeout_s",
            "fetch_timeout_s",
        ):
            if getattr(self, name) <= 0:
                flag = "--" + name.removesuffix("_s").replace("_", "-")
                raise InvalidArgumentError(f"{flag} must be > 0, got {getattr(self, name)}")
        for name in ("grpc_max_message_bytes", "master_max_message_bytes"):
            if not 1024**2 <= getattr(self, name) < 2**31:
                flag = "--" + name.replace("_", "-")
                raise InvalidArgumentError(
                    f"{flag} must be 1MiB-2GiB (gRPC's limit), got {getattr(self, name)} bytes"
                )
        if self.mount_timeout_s <= 0:
            raise InvalidArgumentError(f"--mount-timeout must be > 0, got {self.mount_timeout_s}")
        if ":" not in self.master:
            raise InvalidArgumentError(f"--master must be host:port, got {self.master!r}")


def resolve_node_token(config: NodeConfig) -> str:
    """The node's token: --token-file, else MOONCAKE_TOKEN(_FILE), else the master's local
    token file; "" when there is none (only for a loopback node of a master with --auth off).

    Raises:
        InvalidArgumentError: not a node token, or none for a node on a non-loopback address.
    """
    if config.token_file:
        token = read_token_file(config.token_file)
    else:
        token = discover_token(config.master, Role.NODE)
    if token:
        try:
            node_secret_of(token)
        except AccessDeniedError as exc:
            raise InvalidArgumentError(str(exc)) from None
    elif not is_loopback(config.host):
        raise InvalidArgumentError(
            f"a node on {config.host} needs a node token: create one on the master's host with "
            "`mooncake-admin token create --role node --node-id ID` and pass --token-file"
        )
    return token
