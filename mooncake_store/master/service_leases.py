"""The master service's lease grants: the leases a put's reply hands out for the next puts
(rules: master/leases.py), served from leases minted ahead after the previous reply
(master/lease_stock.py) so that minting is off the client's wait.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.grant import GrantMode
from mooncake_store.master.lease_stock import Class, LeaseStock, Stocked
from mooncake_store.master.leases import grant_leases, release_lease, short_now
from mooncake_store.master.service_base import ServicerBase, _location

MAX_CLASSES_PER_CALL = 16


class LeaseMethods(ServicerBase):
    """Grants leases (from the stock first), refills the stock once the reply is out."""

    lease_stock: LeaseStock
    _refills: set[tuple[int, Class]]  # (owner, class) to mint for on the loop's next turn

    def _lease_usable(self, lease: Stocked) -> bool:
        """Still an unused lease, with every replica it was granted on a node offered to puts
        (not suspect, dropped or draining), and as many as a lease minted now would get
        (`short_now`): where a lease minted now could be."""
        table = self.table
        slot = table._slot.get(lease.lease_id)
        if slot is None or lease.lease_id not in table._lease_keys:
            return False
        replicas = table._replicas(slot)
        if len(replicas) != len(lease.message.replicas):  # one died with its node
            return False
        wanted = lease.message.wanted_replicas or self.config.default_replicas
        if short_now(table, lease.lease_id, wanted):
            return False  # minted while fewer nodes had room: a put now gets more
        for replica in replicas:
            seg = table._offered.get(replica.segment_id)
            if seg is None or seg.node_id in table.draining:
                return False
        return True

    def _mint(self, owner: int, cls: Class, count: int) -> list[Stocked]:
        """Up to `count` new leases of `cls` for `owner`."""
        size, replicas = cls
        now = self.table._clock()
        out = []
        for lease_id, outcome in grant_leases(self.table, size, replicas, count, owner):
            message = pb.Lease(
                lease_id=lease_id, size_bytes=size,
                replicas=[_location(seg, r, size, outcome.deadline_s, GrantMode.WRITE,
                                    outcome.generation)
                          for seg, r in outcome.placements],
                expires_in_s=outcome.deadline_s - now, wanted_replicas=replicas,
            )  # fmt: skip
            out.append(Stocked(lease_id, now, outcome.deadline_s, message))
        return out

    def _grant_leases(self, wanted: Sequence[pb.LeaseRequest], owner: int) -> list[pb.Lease]:
        """The leases asked for: stocked ones first, the rest minted now.  The stock of each
        class asked for is refilled on the loop's next turn, after this reply is written.
        Minting writes nothing durable (`_refill`): the reply need not wait for a write."""
        out: list[pb.Lease] = []
        now = self.table._clock()
        for want in wanted[:MAX_CLASSES_PER_CALL]:
            cls = (want.size_bytes, want.replicas)
            stocked, stale, again = self.lease_stock.take(
                owner, cls, want.count, now, self._lease_usable
            )
            for lease_id in stale:
                release_lease(self.table, lease_id)
            if stocked:
                counters = self.table.counters
                counters["leases_from_stock"] = counters.get("leases_from_stock", 0) + len(stocked)
            for lease in stocked:
                lease.message.expires_in_s = lease.deadline_s - now
                out.append(lease.message)
            if want.count > len(stocked):
                out += [x.message for x in self._mint(owner, cls, want.count - len(stocked))]
            if again:
                self._schedule_refill(owner, cls)
        return out

    def _schedule_refill(self, owner: int, cls: Class) -> None:
        if not self._refills:
            # call_soon: after the handler returns and its reply is written (framed_server.py
            # writes a reply in the same turn its handler ends).
            asyncio.get_running_loop().call_soon(self._refill)
        self._refills.add((owner, cls))

    def _refill(self) -> None:
        """Mint what the connections that asked again will ask for next, and stock it, in this
        one turn of the loop: a lease evicts nothing and its key is new, so minting changes
        nothing durable and needs no write before it is handed out (tests/unit/test_leases.py).
        (Stocking after writing other calls' changes first, in a task of its own, left the stock
        empty when the client's next call came within two turns, as a same-host client's does
        under load.)"""
        due, self._refills = self._refills, set()
        for owner, cls in due:
            want = self.lease_stock.wanted(owner, cls)
            if want:
                minted = self._mint(owner, cls, want)
                for lease_id in self.lease_stock.add(owner, cls, minted):
                    release_lease(self.table, lease_id)

    def drop_lease_stock(self, owner: int) -> None:
        """`owner`'s connection closed: its stocked leases are released (with its puts)."""
        for lease_id in self.lease_stock.drop_owner(owner):
            release_lease(self.table, lease_id)

    def prune_lease_stock(self) -> None:
        """Release stocked leases gone stale or unusable (the master's tick)."""
        for lease_id in self.lease_stock.prune(self.table._clock(), self._lease_usable):
            release_lease(self.table, lease_id)
