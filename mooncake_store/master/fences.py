"""Write fences (pure): when a put's write grant has stopped working on its node.

A WRITE grant names its put's generation (`common/grant.py`).  Two rules end it on the node
(`node/write_gate.py`):

- A grant writes each byte once: the node seals a write's bytes against its generation as soon
  as they landed.  So whatever a put wrote over TCP or gRPC, its grant cannot change again: not
  after PutEnd, PutRevoke or Remove, with no message from the master.
- A fence ends the rest (bytes a grant never wrote): the master pushes each node a fence per
  DRAM segment after puts ended (each tick): generations below `floor` are ended unless listed
  `open` (puts still being written); and each mount reply carries the segment's first fence, so
  a node mounted afresh refuses every grant issued before the mount.

What a free must wait for, then: a put that ends without a commit (revoked, timed out, its
client gone, an unused allocation lease given back) may still have a write on its way, or its
grant may never have written, so its extent is given to nobody else until the node has
acknowledged a fence that ends the put (or the grant's own expiry has passed): the free is held
here.  A committed put's extent is freed as usual when the block is removed or evicted: its
writer's grant is sealed over the bytes it wrote.  The one window left is a client committing
bytes it never wrote through its grant (it wrote them over same-host shared memory, which
grants do not govern, or not at all): that grant could write into the extent's next owner until
the next fence, which the owner's checksum catches.  Generations are unique per put in the
master's lifetime, and on each segment a restarted master's start past every earlier master's
(the wall clock, a floor on its disk, and what its nodes report having seen when they mount:
master/generations.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from mooncake_store.master.segments import Segment


class HeldFree(NamedTuple):
    """An extent whose free waits for its put's write grant to end on the node."""

    generation: int  # the put's
    segment_generation: int
    offset: int
    size_bytes: int
    free_at_s: float  # a read lease may hold it longer
    until_s: float  # the grant's expiry (with slack): free by then, unless a node's reading...
    signed_s: float  # ...of the master's clock is behind the one its grants were signed by since


class WriteFences:
    """Fences the nodes acknowledged, and the frees waiting for them."""

    def __init__(self) -> None:
        # segment id -> (its generation, floor, open) of the last fence its node acknowledged
        self._acked: dict[int, tuple[int, int, frozenset[int]]] = {}
        self._held: dict[int, list[HeldFree]] = {}  # segment id -> frees waiting
        self.dirty = False  # a put ended since the last fences were taken

    def ended(self, seg: Segment, generation: int) -> bool:
        """True when the node of `seg` refuses write grants of `generation` now."""
        acked = self._acked.get(seg.segment_id)
        if acked is None or acked[0] != seg.generation:
            return False
        _, floor, open_ = acked
        return generation < floor and generation not in open_

    def hold(self, seg: Segment, free: HeldFree) -> None:
        self._held.setdefault(seg.segment_id, []).append(free)

    def acknowledged(self, seg: Segment, floor: int, open_: frozenset[int]) -> list[HeldFree]:
        """Record the fence `seg`'s node took; return the held frees it ends (drained)."""
        self._acked[seg.segment_id] = (seg.generation, floor, open_)
        held = self._held.get(seg.segment_id)
        if not held:
            return []
        done = [h for h in held if h.generation < floor and h.generation not in open_]
        if done:
            self._held[seg.segment_id] = [h for h in held if h not in done]
        return done

    def expired(
        self, now: float, behind: Callable[[float, float], float]
    ) -> list[tuple[int, HeldFree]]:
        """(segment id, free) of held frees whose grant expired anyway (drained).

        The node checks a grant's expiry against its reading of the master's clock: a reading
        from before a step forward of that clock that the grant was signed after makes the
        grant last that much longer there.  `behind(since, until)` says by how much for grants
        signed between two monotonic instants (common/clock.py OffsetLog.behind)."""
        out: list[tuple[int, HeldFree]] = []
        for segment_id, held in list(self._held.items()):
            keep: list[HeldFree] = []
            for h in held:
                if h.until_s <= now and h.until_s + behind(h.signed_s, h.until_s) <= now:
                    out.append((segment_id, h))
                else:
                    keep.append(h)
            if len(keep) == len(held):
                continue
            if keep:
                self._held[segment_id] = keep
            else:
                del self._held[segment_id]
        return out

    def held_extents(self, seg: Segment) -> list[tuple[int, int]]:
        """(offset, size) of the frees held in this mount of `seg` (for `validate`)."""
        return [
            (h.offset, h.size_bytes)
            for h in self._held.get(seg.segment_id, ())
            if h.segment_generation == seg.generation
        ]

    def held_bytes_in(self, segment_id: int) -> int:
        """Bytes of the frees held in `segment_id` (freed by the next fence its node takes)."""
        return sum(h.size_bytes for h in self._held.get(segment_id, ()))

    def held_bytes(self) -> int:
        return sum(h.size_bytes for held in self._held.values() for h in held)
