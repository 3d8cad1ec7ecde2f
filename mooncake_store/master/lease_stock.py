"""Leases minted ahead for a client, so that a steady put's reply carries its next lease without
minting it on the way (pure rules, no I/O; the master service mints: service_leases.py).

A leased put's reply hands out the next lease (master/leases.py).  Minting one (placement,
allocation, a signed grant per replica) cost ~44 us of the ~125 us the master spent on a 64 KiB
leased put, all of it while the client waited.  So the service mints the lease a connection
will ask for next *after* replying (on the event loop's next turn, while the client copies its
next value) and keeps it here; the next call that asks for that class takes it from here.

A stocked lease is an ordinary lease, granted a little earlier: the same owner, the same
room rules (free room only, within `LEASE_SHARE`), the same end with its connection, its
deadline or its node, and taken back for a put that needs the room like any other
(`release_all`).  Nothing here decides what a lease may do; this module only decides which
minted leases may still be handed out:

- only while `FRESH_SHARE` of its life is left, so a client gets nearly what an inline mint
  would have given it (the client uses a lease within its first half-life: client/leases.py);
  a stale one is released;
- only while the table still holds it (it may have expired, been taken back for room, or died
  with its node) where a lease minted now could be: every replica it was granted still on a
  node offered to puts (not suspect, dropped or draining to stop: review found a put placed on
  a draining node through a lease stocked before its drain began); one that is not is released;
- at most what the connection asked for last time, per (size, replicas) class, and at most
  `MAX_CLASSES` classes per connection (the oldest class is dropped, and released).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FRESH_SHARE = 0.75  # of a lease's life still ahead for it to be handed out from the stock
MAX_CLASSES = 4  # per connection
MAX_PER_CLASS = 64

Class = tuple[int, int]  # (size_bytes, replicas as asked)


@dataclass(slots=True)
class Stocked:
    lease_id: str
    minted_s: float
    deadline_s: float
    message: Any  # the pb.Lease to hand out (its expires_in_s is set when it is)

    def fresh(self, now: float) -> bool:
        return self.deadline_s - now >= FRESH_SHARE * (self.deadline_s - self.minted_s)


Usable = Callable[[Stocked], bool]  # still held by the table where a fresh mint could be


def _handable(lease: Stocked, now: float, usable: Usable) -> bool:
    """The one rule: a stocked lease is handed out while fresh and usable (else released)."""
    return lease.fresh(now) and usable(lease)


class LeaseStock:
    """Minted leases waiting for the connection that will ask for them."""

    def __init__(self) -> None:
        self._stock: dict[int, dict[Class, list[Stocked]]] = {}
        self._target: dict[int, dict[Class, int]] = {}  # how many to keep, as last asked

    def __len__(self) -> int:
        return sum(len(held) for classes in self._stock.values() for held in classes.values())

    def take(
        self, owner: int, cls: Class, count: int, now: float, usable: Usable
    ) -> tuple[list[Stocked], list[str], bool]:
        """Up to `count` fresh usable leases of `cls` for `owner`; the ids of stocked leases
        not to hand out (stale, unusable, or of a class no longer stocked: to release; one
        already gone is released by nobody); and whether to
        stock this class for `owner`: only once it asks for it again (a put of a size seen
        once holds no more than it asked for).  Remembers `count` as what to keep."""
        if owner == 0 or count <= 0:
            return [], [], False
        targets = self._target.setdefault(owner, {})
        again = targets.pop(cls, 0) > 0  # re-inserted last: the newest class
        targets[cls] = min(count, MAX_PER_CLASS)
        stale: list[str] = []
        classes = self._stock.get(owner, {})
        while len(targets) > MAX_CLASSES:  # the oldest class asked for: no longer stocked
            oldest = next(iter(targets))
            del targets[oldest]
            stale += [x.lease_id for x in classes.pop(oldest, ())]
        held = classes.get(cls)
        out: list[Stocked] = []
        while held and len(out) < count:
            lease = held.pop(0)
            if _handable(lease, now, usable):
                out.append(lease)
            else:
                stale.append(lease.lease_id)
        return out, stale, again

    def wanted(self, owner: int, cls: Class) -> int:
        """How many leases of `cls` to mint for `owner` to fill its stock."""
        target = self._target.get(owner, {}).get(cls, 0)
        return max(0, target - len(self._stock.get(owner, {}).get(cls, ())))

    def add(self, owner: int, cls: Class, leases: list[Stocked]) -> list[str]:
        """Keep `leases` for `owner`; return the ids dropped to stay within the caps (to
        release)."""
        if not leases:
            return []
        if cls not in self._target.get(owner, {}):  # no longer asked for (or owner closed)
            return [x.lease_id for x in leases]
        classes = self._stock.setdefault(owner, {})
        held = classes.pop(cls, [])  # re-inserted last: the newest class
        held.extend(leases)
        keep = self._target[owner][cls]
        dropped = [x.lease_id for x in held[keep:]]
        classes[cls] = held[:keep]
        while len(classes) > MAX_CLASSES:
            oldest = next(iter(classes))
            dropped += [x.lease_id for x in classes.pop(oldest)]
        return dropped

    def drop_owner(self, owner: int) -> list[str]:
        """Forget `owner`'s stock (its connection closed); the ids, to release."""
        self._target.pop(owner, None)
        classes = self._stock.pop(owner, {})
        return [x.lease_id for held in classes.values() for x in held]

    def prune(self, now: float, usable: Usable) -> list[str]:
        """Drop the leases not to hand out any more (their ids, to release), and the
        connections left with none."""
        stale_leases: list[Stocked] = []
        for owner in list(self._stock):
            classes = self._stock[owner]
            for cls in list(classes):
                keep: list[Stocked] = []
                for lease in classes[cls]:
                    (keep if _handable(lease, now, usable) else stale_leases).append(lease)
                if keep:
                    classes[cls] = keep
                else:
                    del classes[cls]
            if not classes:
                del self._stock[owner]
        return [x.lease_id for x in stale_leases]
