"""Eviction policies (pure): which block of a segment goes first when room is needed.

One interface, two policies:

- `LruPolicy`: plain least-recently-read first.
- `WeightedPolicy` (default): GreedyDual-Size-Frequency, chain-aware.  A block's priority is
  `L + cost(depth) * (1 + reads + readmissions)`, where `L` is the segment's inflation clock
  (the priority of the last block evicted from it, so idle blocks age), `reads` counts reads
  (never probes: `exists` and `prefix_match` do not keep a block alive), `readmissions` counts
  puts of the key after it had been evicted (remembered in a bounded ghost table: a block that
  comes back has proven it is reused), and `cost(depth) = 1 + depth_cost * depth` is the prefill
  a hit saves (attention over the prefix makes deep blocks dearer to recompute; the default
  0.02 ~ tokens_per_block / (6 * hidden size) for 512-token blocks of a 4096-wide model).
  Chain-aware: a block whose parent is not cached is worth nothing (nobody can reach it by
  prefix) and goes first; otherwise only leaves (blocks with no cached child) are evicted, so a
  chain is cut from its tail and never orphans its own suffix.

Policies see keys and segments only; the object table tells them about inserts, reads and
removals, and asks `pick(segment_id, evictable)` for the next victim.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable


class EvictionPolicy(ABC):
    name: str

    @abstractmethod
    def insert(self, key: str, segment_id: int, *, parent: str = "") -> None:
        """A replica of `key` now lives in `segment_id`."""

    @abstractmethod
    def access(self, key: str) -> None:
        """`key` was read."""

    @abstractmethod
    def discard(self, key: str, segment_id: int) -> None:
        """The replica of `key` in `segment_id` is gone (the key may live on elsewhere)."""

    @abstractmethod
    def pick(self, segment_id: int, evictable: Callable[[str], bool]) -> str | None:
        """The lowest-value evictable key in `segment_id`, or None.  Does not remove it."""


class LruPolicy(EvictionPolicy):
    name = "lru"

    def __init__(self) -> None:
        self._order: dict[int, OrderedDict[str, None]] = {}
        self._where: dict[str, set[int]] = {}

    def insert(self, key: str, segment_id: int, *, parent: str = "") -> None:
        self._order.setdefault(segment_id, OrderedDict())[key] = None
        self._where.setdefault(key, set()).add(segment_id)

    def access(self, key: str) -> None:
        for segment_id in self._where.get(key, ()):
            self._order[segment_id].move_to_end(key)

    def discard(self, key: str, segment_id: int) -> None:
        order = self._order.get(segment_id)
        if order is not None:
            order.pop(key, None)
        where = self._where.get(key)
        if where is not None:
            where.discard(segment_id)
            if not where:
                del self._where[key]

    def pick(self, segment_id: int, evictable: Callable[[str], bool]) -> str | None:
        for key in self._order.get(segment_id, ()):
            if evictable(key):
                return key
        return None


class _KeyState:
    """Per-key policy state, kept small: there is one per cached block (10M on a big master).
    `children` is None, one key, or a set of keys (a prefix chain has one child per block);
    `segments` is a tuple (almost every block has one replica)."""

    __slots__ = (
        "children", "depth", "parent", "readmissions", "reads", "segments", "touched", "version"
    )  # fmt: skip

    def __init__(self, parent: str, depth: int) -> None:
        self.reads = 0
        self.readmissions = 0
        self.depth = depth
        self.parent = parent
        self.children: str | set[str] | None = None
        self.version = 0
        self.segments: tuple[int, ...] = ()
        # Read since its heap entries were pushed: the segments' clocks at the last read.  The
        # entries are re-pushed when they reach the top of a heap, with the priority an eager
        # re-push at read time would have given (reads only raise priorities, so the heap
        # order stays right), which keeps a read O(1): ~5 us less per key of a lookup.
        self.touched: tuple[float, ...] | None = None

    def add_child(self, key: str) -> None:
        if self.children is None or self.children == key:
            self.children = key
        elif isinstance(self.children, str):
            self.children = {self.children, key}
        else:
            self.children.add(key)

    def remove_child(self, key: str) -> None:
        if isinstance(self.children, set):
            self.children.discard(key)
            if len(self.children) == 1:
                self.children = next(iter(self.children))
        elif self.children == key:
            self.children = None

    def child_keys(self) -> tuple[str, ...] | set[str]:
        if self.children is None:
            return ()
        return (self.children,) if isinstance(self.children, str) else self.children


# A heap entry: (priority, version, key).  Versions are unique and increasing, so they also
# break priority ties in insertion order; an entry whose version is not its key's is stale.
_Entry = tuple[float, int, str]


class WeightedPolicy(EvictionPolicy):
    name = "weighted"

    def __init__(self, *, depth_cost: float = 0.02, ghost_entries: int = 1_000_000) -> None:
        self.depth_cost = depth_cost
        self.ghost_entries = ghost_entries
        self._keys: dict[str, _KeyState] = {}
        self._ghost: OrderedDict[str, tuple[int, int]] = OrderedDict()  # key -> reads, readmits
        self._heaps: dict[int, list[_Entry]] = {}
        self._clock: dict[int, float] = {}
        self._seq = itertools.count(1)
        self._tuples: dict[tuple[int, ...], tuple[int, ...]] = {}

    def _shared(self, segments: tuple[int, ...]) -> tuple[int, ...]:
        """One tuple object per set of segments, shared by every block placed there (a
        cluster has a few hundred segments and millions of blocks: 48 bytes a block)."""
        known = self._tuples.get(segments)
        if known is not None:
            return known
        if len(self._tuples) < 65536:
            self._tuples[segments] = segments
        return segments

    def _value(self, state: _KeyState) -> float:
        return (1.0 + self.depth_cost * state.depth) * (1 + state.reads + state.readmissions)

    def _orphan(self, state: _KeyState) -> bool:
        return bool(state.parent) and state.parent not in self._keys

    def _push(self, key: str, state: _KeyState, segment_id: int) -> None:
        clock = self._clock.setdefault(segment_id, 0.0)
        priority = clock if self._orphan(state) else clock + self._value(state)
        heap = self._heaps.setdefault(segment_id, [])
        heapq.heappush(heap, (priority, state.version, key))
        if len(heap) > 4 * len(self._keys) + 1024:
            self._compact(segment_id)

    def _refresh(self, key: str, state: _KeyState) -> None:
        state.version = next(self._seq)  # unique across re-inserts: old entries stay stale
        state.touched = None
        for segment_id in state.segments:
            self._push(key, state, segment_id)

    def _catch_up(self, key: str, state: _KeyState, touched: tuple[float, ...]) -> None:
        """Push the entries a read deferred, priced at the clocks of that read."""
        state.version = next(self._seq)
        state.touched = None
        orphan = self._orphan(state)
        value = self._value(state)
        for segment_id, clock in zip(state.segments, touched, strict=True):
            heap = self._heaps.setdefault(segment_id, [])
            heapq.heappush(heap, (clock if orphan else clock + value, state.version, key))

    def _compact(self, segment_id: int) -> None:
        """Drop stale entries (refreshes leave old ones behind)."""
        heap = self._heaps[segment_id]
        live = []
        for entry in heap:
            state = self._keys.get(entry[2])
            if state is not None and state.version == entry[1] and segment_id in state.segments:
                live.append(entry)
        heapq.heapify(live)
        self._heaps[segment_id] = live

    def insert(self, key: str, segment_id: int, *, parent: str = "") -> None:
        state = self._keys.get(key)
        if state is None:
            parent_state = self._keys.get(parent) if parent else None
            depth = parent_state.depth + 1 if parent_state is not None else 0
            state = _KeyState(parent, depth)
            remembered = self._ghost.pop(key, None)
            if remembered is not None:
                state.reads, state.readmissions = remembered[0], remembered[1] + 1
            self._keys[key] = state
            if parent_state is not None:
                parent_state.add_child(key)
        if segment_id not in state.segments:
            state.segments = self._shared((*state.segments, segment_id))
        self._refresh(key, state)

    def access(self, key: str) -> None:
        state = self._keys.get(key)
        if state is not None:
            state.reads += 1
            clocks = self._clock
            segments = state.segments
            if len(segments) == 1:
                state.touched = (clocks.get(segments[0], 0.0),)
            else:
                state.touched = tuple(clocks.get(s, 0.0) for s in segments)

    def discard(self, key: str, segment_id: int) -> None:
        state = self._keys.get(key)
        if state is None:
            return
        state.segments = self._shared(tuple(s for s in state.segments if s != segment_id))
        state.version = next(self._seq)
        if state.segments:
            self._refresh(key, state)
            return
        del self._keys[key]
        parent_state = self._keys.get(state.parent) if state.parent else None
        if parent_state is not None:
            # The parent may now be a leaf; its heap entry stays valid and keeps its priority
            # (becoming a leaf is not an access).
            parent_state.remove_child(key)
        for child in state.child_keys():  # now unreachable by prefix: worth nothing
            child_state = self._keys.get(child)
            if child_state is not None:
                self._refresh(child, child_state)
        self._ghost[key] = (state.reads, state.readmissions)
        self._ghost.move_to_end(key)
        while len(self._ghost) > self.ghost_entries:
            self._ghost.popitem(last=False)

    def pick(self, segment_id: int, evictable: Callable[[str], bool]) -> str | None:
        heap = self._heaps.get(segment_id)
        if not heap:
            return None
        stash: list[_Entry] = []
        fallback: _Entry | None = None
        chosen: _Entry | None = None
        while heap:
            entry = heapq.heappop(heap)
            _, version, key = entry
            state = self._keys.get(key)
            if state is None or state.version != version or segment_id not in state.segments:
                continue  # stale
            if state.touched is not None:
                self._catch_up(key, state, state.touched)
                continue  # its new entry is further down this heap
            stash.append(entry)
            if not evictable(key):
                continue
            if state.children is not None and not self._orphan(state):
                if fallback is None:
                    fallback = entry  # only if no leaf can go
                continue
            chosen = entry
            break
        chosen = chosen or fallback
        for entry in stash:
            heapq.heappush(heap, entry)
        if chosen is None:
            return None
        self._clock[segment_id] = max(self._clock.get(segment_id, 0.0), chosen[0])
        return chosen[2]

    def ghost_size(self) -> int:
        return len(self._ghost)


def make_policy(name: str, **options: float) -> EvictionPolicy:
    if name == "lru":
        return LruPolicy()
    if name == "weighted":
        return WeightedPolicy(**options)  # type: ignore[arg-type]
    raise ValueError(f"unknown eviction policy {name!r}: use 'weighted' or 'lru'")
