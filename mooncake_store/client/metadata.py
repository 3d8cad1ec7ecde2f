"""The client's metadata calls: existence probes, removes, metadata-only descriptions, key
listing, cluster stats and the node list (no data moves).

`MetadataFlows` holds the flows (`exists_many_flow`, `remove_many_flow`, ...), a base of
`ClientFlows` (flows.py) that both clients drive; `MetadataCalls`, a base of `AsyncClient`
(async_client.py), is their async API, with the two calls that are not flows (stats, list_nodes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeVar

from mooncake_store.client.master_client import (
    describe_call,
    exists_call,
    list_keys_call,
    remove_call,
)
from mooncake_store.client.speculative import LocationCache
from mooncake_store.client.steps import Flow
from mooncake_store.client.types import ClusterStats, KeyInfo, NodeStatus, ObjectInfo
from mooncake_store.common.errors import InvalidArgumentError, MooncakeError, ObjectNotFoundError
from mooncake_store.common.keys import validate_key

if TYPE_CHECKING:
    from mooncake_store.client.flows import ClientFlows

T = TypeVar("T")


class MetadataFlows:
    """The metadata flows (a mixin of ClientFlows, flows.py)."""

    _locations: LocationCache  # keys removed here are forgotten (speculative.py)

    def exists_many_flow(self, keys: Sequence[str]) -> Flow[list[bool]]:
        keys = [validate_key(k) for k in keys]
        return (yield exists_call(keys))  # type: ignore[no-any-return]

    def remove_many_flow(self, keys: Sequence[str]) -> Flow[list[bool]]:
        keys = [validate_key(k) for k in keys]
        self._locations.drop(keys)
        out = []
        for err in (yield remove_call(keys)):
            if err is not None and not isinstance(err, ObjectNotFoundError):
                raise err
            out.append(err is None)
        return out

    def remove_outcomes_flow(
        self, keys: Sequence[str], force: bool
    ) -> Flow[list[MooncakeError | None]]:
        keys = [validate_key(k) for k in keys]
        self._locations.drop(keys)
        return (yield remove_call(keys, unless_leased=not force))  # type: ignore[no-any-return]

    def describe_flow(self, keys: Sequence[str]) -> Flow[list[ObjectInfo | None]]:
        keys = [validate_key(k) for k in keys]
        out: list[ObjectInfo | None] = []
        for r in (yield describe_call(keys)):
            if isinstance(r, ObjectNotFoundError):
                out.append(None)
            elif isinstance(r, MooncakeError):
                raise r
            else:
                out.append(r)
        return out

    def list_keys_flow(
        self, prefix: str, cursor: str, limit: int
    ) -> Flow[tuple[list[KeyInfo], str]]:
        if not 0 < limit <= 10000:
            raise InvalidArgumentError(f"limit must be in 1..10000, got {limit}")
        return (yield list_keys_call(cursor, limit, prefix))  # type: ignore[no-any-return]


class MetadataCalls:
    """The metadata calls (see the module docstring; a mixin: the client's driver)."""

    flows: ClientFlows  # provided by AsyncClient

    if TYPE_CHECKING:  # provided by AsyncClient

        async def _drive(self, flow: Flow[T]) -> T: ...

    # ---- metadata ---------------------------------------------------------------------------

    async def exists(self, key: str) -> bool:
        """True when `key` is stored and readable.  Does not count as a read."""
        return (await self.exists_many([key]))[0]

    async def exists_many(self, keys: Sequence[str]) -> list[bool]:
        return await self._drive(self.flows.exists_many_flow(keys))

    async def remove(self, key: str) -> bool:
        """Remove `key`; True if it was stored, False if there was nothing to remove.

        Raises:
            ObjectBusyError: a put of `key` is in progress.
        """
        return (await self.remove_many([key]))[0]

    async def remove_many(self, keys: Sequence[str]) -> list[bool]:
        return await self._drive(self.flows.remove_many_flow(keys))

    async def remove_many_outcomes(
        self, keys: Sequence[str], *, force: bool = True
    ) -> list[MooncakeError | None]:
        """Remove `keys`; per key None (removed) or why not: ObjectNotFoundError,
        ObjectBusyError (a put in progress), ObjectHasLeaseError (`force=False` and the
        object is being read; with `force` it is removed and its bytes are freed when the
        read lease ends)."""
        return await self._drive(self.flows.remove_outcomes_flow(keys, force))

    async def describe_many(self, keys: Sequence[str]) -> list[ObjectInfo | None]:
        """Size and replica placement of each key from the master's metadata (no data read,
        no lease, not counted as a read); None for a key that is not stored."""
        return await self._drive(self.flows.describe_flow(keys))

    async def list_keys(
        self, prefix: str = "", *, cursor: str = "", limit: int = 1000
    ) -> tuple[list[KeyInfo], str]:
        """One page of the committed keys that start with `prefix`, and the cursor of the next
        page ("" after the last; pass it back as `cursor`).  A page may hold fewer than
        `limit` keys, even none, before the end: the master scans a bounded slice per call.
        An admin capability."""
        return await self._drive(self.flows.list_keys_flow(prefix, cursor, limit))

    async def stats(self) -> ClusterStats:
        """Cluster-wide counts from the master."""
        s = await self.flows.master_client().stats()
        return ClusterStats(
            s.objects,
            s.processing,
            s.bytes_stored,
            s.nodes,
            s.capacity_bytes,
            s.used_bytes,
            s.max_object_bytes,
            dict(s.counters),
            leases=s.leases,
            leased_bytes=s.leased_bytes,
        )

    async def list_nodes(self) -> list[NodeStatus]:
        """The mounted store nodes with their usage and state, suspect ones too (one row per
        node and tier; see NodeStatus)."""
        reply = await self.flows.master_client().list_nodes()
        return [
            NodeStatus(
                n.node_id,
                n.segment_id,
                n.endpoint,
                n.tier,
                n.size_bytes,
                n.used_bytes,
                n.objects,
                n.last_heartbeat_age_s,
                n.state or "valid",  # an older master lists valid nodes only, and no state
                n.drop_in_s,
                leases=n.leases,
                leased_bytes=n.leased_bytes,
            )
            for n in reply.nodes
        ]
