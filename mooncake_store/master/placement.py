"""Replica placement (pure): which segments receive the replicas of a new object."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol, TypeVar


class Placeable(Protocol):
    @property
    def node_id(self) -> str: ...
    @property
    def free_bytes(self) -> int: ...
    @property
    def largest_free(self) -> int: ...


S = TypeVar("S", bound="Placeable")


def choose_segments(
    segments: Iterable[S], extent_bytes: int, replicas: int, preferred: Collection[str] = ()
) -> list[S]:
    """Pick up to `replicas` segments on distinct nodes that can hold `extent_bytes`.

    Nodes in `preferred` (node ids: the caller's placement hint) that have room go first; then
    the most free bytes, which spreads load and keeps room on full nodes.  Returns fewer than
    `replicas` when fewer nodes have room (best effort); an empty list when none has.
    """
    best: dict[str, S] = {}
    for seg in segments:
        if seg.largest_free < extent_bytes:
            continue
        current = best.get(seg.node_id)
        if current is None or seg.free_bytes > current.free_bytes:
            best[seg.node_id] = seg
    ranked = sorted(
        best.values(), key=lambda s: (s.node_id not in preferred, -s.free_bytes, s.node_id)
    )
    return ranked[:replicas]
