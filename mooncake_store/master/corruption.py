"""Corrupt reports, checked (issue 11 item 7, hardened for issue 12's tenants).

A reader whose every replica of a key failed its checksum reports the key
(`BatchReportCorrupt`), so the next correct put heals it.  The master does not take the
reader's word for it: any client of a tenant could otherwise delete any key of that tenant,
leased or not.  Each reported replica that is still stored is hashed in place by the node that
holds it (NodeService.Verify, master-signed, awaited like every other node call: the serving
loop never blocks); only the replicas whose bytes really fail their recorded checksum are
dropped, and the object goes with its last one.  A report whose replicas all check out is
refuted: nothing is deleted, a warning is logged and `corrupt_reports_refuted` counted.

A report naming no replica asks for every stored replica to be checked: a client whose put of
a key conflicts with the stored checksum sends one, so a key committed with a wrong checksum
heals on the next correct put without a read in between.  A key whose replicas checked out is
not checked again for `RECHECK_AFTER_S` (reports about it are refuted unchecked meanwhile), so
no client can keep the nodes hashing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.errors import (
    OK,
    ChecksumMismatchError,
    InvalidArgumentError,
    MooncakeError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.master.batches import pause_every
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.segments import Segment

log = logging.getLogger("mooncake.master")

#: (segment, offset, size, checksum) -> one status code per extent: OK, ChecksumMismatchError's
#: code, or anything else when the node could not tell (NodeMover.verify).
RECHECK_AFTER_S = 10.0
MAX_REMEMBERED = 100_000  # keys whose recent check passed, at most (older ones forgotten first)

Verifier = Callable[[list[tuple[Segment, int, int, int]]], Awaitable[list[int]]]


class RecentChecks:
    """Keys whose replicas all checked out lately (monotonic clock): not checked again yet."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        #: key -> (when its check passed, its object's created_s), oldest first
        self._passed: dict[str, tuple[float, float]] = {}

    def fresh(self, key: str, created_s: float) -> bool:
        """True when this very object (`created_s`: not one put again since) passed lately."""
        at = self._passed.get(key)
        return at is not None and at[1] == created_s and self._clock() - at[0] < RECHECK_AFTER_S

    def passed(self, key: str, created_s: float) -> None:
        self._passed.pop(key, None)
        self._passed[key] = (self._clock(), created_s)
        while len(self._passed) > MAX_REMEMBERED:
            del self._passed[next(iter(self._passed))]

    def forget(self, key: str) -> None:
        self._passed.pop(key, None)


@dataclass(slots=True)
class _Check:
    report: int  # index of its report
    meta: ObjectMeta
    replica: Replica
    segment: Segment


def _checks(table: ObjectTable, n: int, report: pb.CorruptReport) -> list[_Check] | None:
    """The stored replicas of `report`'s object that it names (None: the object is not stored
    as reported: removed, written again, or none of its replicas named)."""
    meta = table.get(report.key)
    if meta is None or meta.state is not ObjectState.COMPLETE or meta.checksum != report.checksum:
        return None
    named = {Replica(r.segment_id, r.offset) for r in report.replicas} or set(meta.replicas)
    checks = []
    for replica in meta.replicas:
        seg = table.mounted_segment(replica.segment_id)
        if replica in named and seg is not None:
            checks.append(_Check(n, meta, replica, seg))
    return checks or None


def _refuted(key: str, named: bool) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{key!r} passes its checksum on its nodes; nothing deleted"
        + ("" if named else " (the stored value is a different one: remove it to replace it)")
    )


async def check_reports(
    table: ObjectTable,
    reports: Sequence[pb.CorruptReport],
    verify: Verifier | None,
    recent: RecentChecks,
) -> list[MooncakeError | None]:
    """Verify each report with the nodes; drop what really fails.  One outcome per report:
    None (replicas dropped) or the error that says why nothing was."""
    outcomes: list[MooncakeError | None] = [None] * len(reports)
    checks: list[_Check] = []
    for n, report in enumerate(reports):
        await pause_every(n)
        found = _checks(table, n, report)
        if found is None:
            outcomes[n] = ObjectNotFoundError(
                f"{report.key!r} is not stored as reported (removed, or written again)"
            )
        elif recent.fresh(report.key, found[0].meta.created_s):
            if report.replicas:
                table.counters["corrupt_reports_refuted"] += 1
            outcomes[n] = _refuted(report.key, bool(report.replicas))
        else:
            checks += found
    extents = [(c.segment, c.replica.offset, c.meta.size_bytes, c.meta.checksum) for c in checks]
    codes = await verify(extents) if verify is not None and extents else [-1] * len(extents)
    by_report: dict[int, list[tuple[_Check, int]]] = {}
    for check, code in zip(checks, codes, strict=True):
        by_report.setdefault(check.report, []).append((check, code))
    for n, results in by_report.items():
        key, meta = reports[n].key, results[0][0].meta
        bad = [c.replica for c, code in results if code == ChecksumMismatchError.code]
        unknown = sum(1 for _, code in results if code not in (OK, ChecksumMismatchError.code))
        if bad:
            recent.forget(key)
            deleted = table.drop_corrupt(meta, bad)
            log.warning(
                "%s %r: %s failed its checksum on its node, as a reader reported",
                "deleted" if deleted else "dropped replicas of", key,
                ", ".join(f"{r.segment_id:x}@{r.offset}" for r in bad),
            )  # fmt: skip
        elif unknown:
            log.warning("a corrupt report of %r could not be checked (%d replicas unreachable): "
                        "nothing deleted", key, unknown)  # fmt: skip
            outcomes[n] = ReplicaUnavailableError(
                f"the replicas of {key!r} could not be checked; nothing deleted"
            )
        elif reports[n].replicas:
            recent.passed(key, meta.created_s)
            table.counters["corrupt_reports_refuted"] += 1
            log.warning("refuted a corrupt report of %r: every replica named passes its "
                        "checksum on its node; nothing deleted", key)  # fmt: skip
            outcomes[n] = _refuted(key, True)
        else:  # a conflicting put's check: the stored value is sound, the conflict stands
            recent.passed(key, meta.created_s)
            outcomes[n] = _refuted(key, False)
    return outcomes
