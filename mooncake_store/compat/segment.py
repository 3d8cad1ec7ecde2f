"""Client-contributed memory: the store node a Mooncake-style client starts for its segment.

In Mooncake every engine rank mounts `global_segment_size` bytes of its own memory into the
pool.  Here memory is served by store nodes, so `setup(..., global_segment_size=N)` starts one:
a `mooncake-store` child process of this client, with an N-byte DRAM pool, mounted on the same
master.  `close()` stops it with SIGTERM and waits for it: the node first drains (the master
copies every object whose only replica it holds to other nodes, for up to the node's
--drain-timeout, 30 s), and only what could not be copied goes with it (a Mooncake client's
objects all go when it closes).  The child runs in its own
session, so a signal to the engine's process group does not stop it before the client does.

A node mounts with a node token, not the engine's client token: the child gets
`MOONCAKE_NODE_TOKEN` / `MOONCAKE_NODE_TOKEN_FILE` as its `MOONCAKE_TOKEN` / `_FILE` when they
are set; otherwise the client's token variables are withheld from it, and it finds the node
token in the master's local token file (same host) like any node.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

from mooncake_store.cluster import NODE_READY, DaemonProcess

log = logging.getLogger("mooncake.compat")

MIN_SEGMENT_BYTES = 1 << 20  # a node's pool holds at least one 1 MiB block


def node_environment() -> dict[str, str]:
    """The child node's environment: the engine's, with the node token in place of the
    client's (see the module docstring)."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("MOONCAKE_TOKEN", "MOONCAKE_TOKEN_FILE")
    }
    for name in ("MOONCAKE_TOKEN", "MOONCAKE_TOKEN_FILE"):
        node_value = os.environ.get(name.replace("MOONCAKE_", "MOONCAKE_NODE_", 1))
        if node_value:
            env[name] = node_value
    return env


class ContributedSegment:
    """A store node owned by this client (see the module docstring)."""

    def __init__(
        self,
        master: str,
        size_bytes: int,
        *,
        host: str,
        node_id: str,
        extra_args: list[str] | None = None,
        start_timeout_s: float = 30.0,
    ) -> None:
        if size_bytes < MIN_SEGMENT_BYTES:
            raise ValueError(
                f"global_segment_size {size_bytes} is below {MIN_SEGMENT_BYTES} bytes; "
                "pass 0 to contribute no memory"
            )
        self.node_id = node_id
        self.size_bytes = size_bytes
        self._dir = Path(tempfile.mkdtemp(prefix="mooncake-compat-node-"))
        args = [
            sys.executable, "-m", "mooncake_store.node", "--master", master, "--host", host,
            "--port", "0", "--control-port", "0", "--dram", str(size_bytes),
            "--node-id", node_id, *(extra_args or []),
        ]  # fmt: skip
        self._process = DaemonProcess(
            args, self._dir / "node.log", NODE_READY, start_timeout_s, env=node_environment()
        )
        match = self._process.match
        self.endpoint = f"{match.group(2)}:{match.group(3)}"
        log.info(
            "contributed %d bytes to the pool: store node %s (pid %d) serving at %s",
            size_bytes, node_id, self._process.pid, self.endpoint,
        )  # fmt: skip

    @property
    def log_path(self) -> Path:
        return self._process.log_path

    def alive(self) -> bool:
        return self._process.alive()

    def stop(self, timeout_s: float = 45.0) -> int:
        """SIGTERM, wait for the node to drain and exit; SIGKILL after `timeout_s`."""
        code = self._process.stop(timeout_s)
        log.info("contributed store node %s stopped (exit code %d)", self.node_id, code)
        return code
