"""ClientFlows: the interface between the client's operations and the two clients that run them.

Every operation is a flow of steps (`steps.py`), written once in `writes.py` (put),
`reads.py` (get), `ranges.py` (ranged reads) and `metadata.py` (exists, remove, describe,
list).  `ClientFlows` holds what the flows share: the settings, the counters, the master
client, the same-host transport (`shm`, the mapped pools the flows copy to and from) and the
staging buffers.  Its public methods are the whole interface:

- the flow factories (`put_flow`, `put_many_flow`, `get_many_flow`, `get_many_into_flow`,
  `read_parts_flow`, `prefix_match_flow`, `get_prefix_into_flow`, `session_flow`,
  `ranges_flow`, `exists_many_flow`, `remove_many_flow`, `remove_outcomes_flow`,
  `describe_flow`, `list_keys_flow`), each returning a generator of steps;
- what a runner needs to take the steps: `master_client()` (master calls), `unmapped()` and
  `shm.map()` (a `MapPools` step), and `close()`.

Each client drives the flows with its own runner and its own TCP transport: `AsyncClient` on
its event loop (`TcpPool`), the sync `Client` in the calling thread (blocking sockets per
thread, see sync_client.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from mooncake_store.client.device import HostStaging, PinnedStaging
from mooncake_store.client.leases import LeasePool, leased_put_call
from mooncake_store.client.master_client import MasterClient
from mooncake_store.client.metadata import MetadataFlows
from mooncake_store.client.put_attempts import PutAttempts
from mooncake_store.client.ranges import RangeFlows
from mooncake_store.client.reads import ReadFlows
from mooncake_store.client.shm import ShmMapper
from mooncake_store.client.speculative import LocationCache
from mooncake_store.client.types import ReplicaLocation, Retry
from mooncake_store.client.writes import WriteFlows
from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.tls import TlsConfig

DEFAULT_MASTER = "127.0.0.1:50051"
DEFAULT_MAX_VALUE_BYTES = 1 << 30
RELEASE_WAIT_S = 1.0  # a closing gRPC client gives its unused leases back within this

log = logging.getLogger("mooncake.client")


class ClientFlows(ReadFlows, WriteFlows, RangeFlows, MetadataFlows):
    """The operations of one client as flows, over its settings and shared state.

    Takes the arguments of AsyncClient (whose docstring describes them).
    """

    def __init__(
        self,
        master: str = DEFAULT_MASTER,
        *,
        replicas: int | None = None,
        timeout_s: float = 10.0,
        local_shm: bool = True,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        retry: Retry | None = None,
        framed: bool = True,
        tls: TlsConfig | None = None,
        tls_ca: str | None = None,
        tls_cert: str | None = None,
        tls_key: str | None = None,
        leases: bool = True,
        token: str | None = None,
    ) -> None:
        if replicas is not None and replicas < 1:
            raise InvalidArgumentError(f"replicas must be >= 1, got {replicas}")
        if timeout_s <= 0:
            raise InvalidArgumentError(f"timeout_s must be > 0, got {timeout_s}")
        self.master = master
        self.replicas = replicas
        self.timeout_s = timeout_s
        self.local_shm = local_shm
        self.max_value_bytes = max_value_bytes
        self.retry = retry or Retry()
        self.framed = framed
        if tls is None:
            if tls_ca or tls_cert or tls_key:
                tls = TlsConfig(cert=tls_cert or "", key=tls_key or "", ca=tls_ca or "")
            else:
                tls = TlsConfig.from_env()
        self.tls = tls
        #: The client TLS context of TCP connections (None: plaintext).
        self.ssl_context = tls.client_context() if tls.enabled else None
        #: The caller's token; None: MOONCAKE_TOKEN, MOONCAKE_TOKEN_FILE, then the master's
        #: local token file (same host, same uid).  See common/credentials.py.
        self.token = token
        self._master: MasterClient | None = None
        #: The same-host transport: node pools mapped into this process (client/shm.py).
        self.shm = ShmMapper()
        #: Where keys put or read here live in same-host pools (client/speculative.py).
        self._locations = LocationCache()
        self._pinned = PinnedStaging()
        #: Allocation leases (client/leases.py): one master round trip per steady put.
        self._leases: LeasePool | None = LeasePool() if leases else None
        #: Puts whose call got no reply, named again by the next put of their key.
        self._attempts = PutAttempts()
        self._staging = HostStaging()
        #: Transfers by data path, and replicas that failed their checksum on read.
        #: Reads served per tier (dram_reads, nvme_reads, gpu_reads).  Master calls by
        #: endpoint (framed_calls, grpc_calls).  Objects whose every replica failed its
        #: checksum, reported to the master for deletion (corrupt_reported).  Reads served
        #: by a copy overlapped with the lookup, and those whose copy was refused and read
        #: again (speculative_reads, speculative_misses; client/speculative.py).  Puts made
        #: again from a new PutStart after the data path refused every replica (put_retries).
        self.counters: dict[str, int] = dict.fromkeys(
            ("shm_writes", "tcp_writes", "shm_reads", "tcp_reads", "checksum_failures",
             "dram_reads", "nvme_reads", "gpu_reads", "framed_calls", "grpc_calls", "leased_puts",
             "corrupt_reported", "put_conflicts", "speculative_reads", "speculative_misses",
             "put_retries"), 0,
        )  # fmt: skip

    @property
    def master_created(self) -> MasterClient | None:
        """The MasterClient once `master_client()` created it, else None."""
        return self._master

    def master_client(self) -> MasterClient:
        """The MasterClient, created on first use (call it on the event loop that will carry
        its gRPC calls: grpc.aio binds to the loop)."""
        if self._master is None:
            self._master = MasterClient(
                self.master, timeout_s=self.timeout_s, retry=self.retry, framed=self.framed,
                counters=self.counters, tls=self.tls, token=self.token,
            )  # fmt: skip
        return self._master

    def unmapped(self, replicas: Sequence[ReplicaLocation]) -> list[ReplicaLocation]:
        """One replica per same-host-candidate DRAM pool that is not mapped yet (what a
        `MapPools` step asks the runner to `shm.map`)."""
        if not self.local_shm:
            return []
        seen: dict[int, ReplicaLocation] = {}
        for loc in replicas:
            if loc.tier != "DRAM" or self.shm.cached(loc) is not None:
                continue
            if self.shm.worth_probing(loc):
                seen.setdefault(loc.segment_id, loc)
        return list(seen.values())

    @staticmethod
    async def _release_leases(master: MasterClient, held: list[str]) -> None:
        """Give unused leases back as the client closes, best effort.  Only over gRPC: a
        framed connection's close ends them on the master at once, while gRPC tells the master
        of no closed connection (it finds them within a second, master/grpc_owners.py, but not
        while another client of this process shares the connection)."""
        try:
            await asyncio.wait_for(master.run(leased_put_call([], [], held)), RELEASE_WAIT_S)
        except Exception as exc:  # the master ends them with their put timeout anyway
            log.info("could not give back %d leases as the client closed: %r", len(held), exc)

    async def close(self) -> None:
        """Close the master client (on its loop) and unmap the pools."""
        if self._master is not None:
            held = self._leases.drain() if self._leases is not None else []
            if held and not self._master.framed_wanted:
                await self._release_leases(self._master, held)
            await self._master.close()
            self._master = None
        self.shm.close()
