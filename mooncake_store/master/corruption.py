"""Corrupt reports, checked (issue 11 item 7, hardened for issue 12's tenants).

A reader whose every replica of a key failed its checksum reports the key
(`BatchReportCorrupt`), so the next correct put heals it.  The master does not take the
reader's word for it: any client of a tenant could otherwise delete any key of that tenant,
leased or not.  Each reported replica that is still stored is hashed in place by the node that
holds it (NodeService.Verify, master-signed, awaited like every other node call: the serving
loop never blocks); only the replicas whose bytes really fail their recorded checksum are
dropped, and the object goes with its last one.  A report whose replicas all check out is
refuted: nothing is deleted, a warning is logged and `corrupt_reports_refuted` counted.
"""

from __future__ import annotations

import logging
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
from mooncake_store.master.object_table import ObjectTable
from mooncake_store.master.objects import ObjectMeta, ObjectState, Replica
from mooncake_store.master.segments import Segment

log = logging.getLogger("mooncake.master")

#: (segment, offset, size, checksum) -> one status code per extent: OK, ChecksumMismatchError's
#: code, or anything else when the node could not tell (NodeMover.verify).
Verifier = Callable[[list[tuple[Segment, int, int, int]]], Awaitable[list[int]]]


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
    named = {Replica(r.segment_id, r.offset) for r in report.replicas}
    checks = []
    for replica in meta.replicas:
        seg = table.mounted_segment(replica.segment_id)
        if replica in named and seg is not None:
            checks.append(_Check(n, meta, replica, seg))
    return checks or None


async def check_reports(
    table: ObjectTable, reports: Sequence[pb.CorruptReport], verify: Verifier | None
) -> list[MooncakeError | None]:
    """Verify each report with the nodes; drop what really fails.  One outcome per report:
    None (replicas dropped) or the error that says why nothing was."""
    outcomes: list[MooncakeError | None] = [None] * len(reports)
    checks: list[_Check] = []
    for n, report in enumerate(reports):
        found = _checks(table, n, report)
        if found is None:
            outcomes[n] = ObjectNotFoundError(
                f"{report.key!r} is not stored as reported (removed, or written again)"
            )
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
        else:
            table.counters["corrupt_reports_refuted"] += 1
            log.warning("refuted a corrupt report of %r: every replica named passes its "
                        "checksum on its node; nothing deleted", key)  # fmt: skip
            outcomes[n] = InvalidArgumentError(
                f"{key!r} passes its checksum on its nodes; nothing deleted"
            )
    return outcomes
