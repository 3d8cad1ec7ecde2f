"""A put's items as the client's write flows carry them (`PendingPut`), and the rule on a put
of a key already stored with another value: a conflict, not a duplicate (`check_conflicts`),
healed when every stored replica fails its checksum (`heal_conflicts`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mooncake_store.client.device import to_host
from mooncake_store.client.master_client import put_start_call, report_corrupt_call
from mooncake_store.client.put_attempts import PutAttempts, unanswered
from mooncake_store.client.steps import Flow, as_readable, parts_checksum
from mooncake_store.client.transport import Buffer
from mooncake_store.client.types import PutPlan, PutSpec, ReplicaLocation
from mooncake_store.common.errors import MooncakeError, ObjectConflictError
from mooncake_store.common.grant import grant_generation


@dataclass(slots=True)
class PendingPut:
    """One item of a put as the write flows carry it (client/writes.py)."""

    key: str
    parts: list[memoryview]  # the value, in order (one part for a plain put)
    spec: PutSpec
    plan: PutPlan | None = None
    failed: list[int] | None = None
    error: MooncakeError | None = None
    checksum: int = 0
    device: Any = None  # a device value (flat uint8 cupy view); `parts` empty until needed
    leased: bool = False  # written into a lease (plan: the lease's extents)
    retryable: bool = False  # every failed write of it was a data-path refusal or failure
    attempt: tuple[int, int] = (0, 0)  # its PutStart's (attempt id, retry): put_attempts.py

    @property
    def generation(self) -> int:
        """The put's generation, as its write grants name it (0: unknown), which its PutEnd
        and revoke name so that they end this put only (master/puts.py `put_end`)."""
        if self.plan is None or not self.plan.replicas:
            return 0
        return grant_generation(self.plan.replicas[0].grant)

    def host_parts(self) -> list[memoryview]:
        """The value in host memory: a device value is copied to the host the first time."""
        if self.device is not None and not self.parts:
            self.parts = [as_readable(to_host(self.device))]
        return self.parts

    @property
    def payload(self) -> Buffer:
        return self.parts[0] if len(self.parts) == 1 else self.parts

    def landed(self) -> bool:
        """True once at least one replica was written."""
        return (
            self.plan is not None
            and self.failed is not None
            and len(self.failed) < len(self.plan.replicas)
        )


def check_conflicts(pending: list[PendingPut], counters: dict[str, int]) -> None:
    """A key already stored with another value is a conflict, not a duplicate: the stored
    value stays and the put fails with ObjectConflictError (a cache-poisoning attempt, or
    two writers disagreeing about a content-addressed key).  Hashes only deduplicated puts."""
    for p in pending:
        plan = p.plan
        if plan is None or not plan.already_exists or plan.existing_checksum is None:
            continue
        mine = parts_checksum(p.parts)
        if mine != plan.existing_checksum:
            counters["put_conflicts"] += 1
            p.error = ObjectConflictError(
                f"{p.key!r} is already stored with a different value (checksum "
                f"{plan.existing_checksum:016x}, this put's {mine:016x}); the "
                "stored value is kept: remove it first to replace it"
            )


def heal_conflicts(
    conflicted: list[PendingPut], counters: dict[str, int], attempts: PutAttempts
) -> Flow[None]:
    """Ask the master to check the stored replicas of conflicting keys (a report naming no
    replica): where every one fails its checksum (a put committed with a wrong one), the
    master deletes the key and this put starts again, so it heals without a read first.
    A sound stored value keeps the conflict."""
    reports: list[tuple[str, int, list[ReplicaLocation]]] = [
        (p.key, (p.plan.existing_checksum or 0) if p.plan else 0, []) for p in conflicted
    ]
    try:
        outcomes = yield report_corrupt_call(reports)
    except MooncakeError:
        return  # best effort: the conflict stands
    healed = [p for p, err in zip(conflicted, outcomes, strict=True) if err is None]
    if not healed:
        return
    counters["put_conflicts"] -= len(healed)
    yield from start_puts(healed, attempts)
    check_conflicts(healed, counters)


def start_puts(pending: list[PendingPut], attempts: PutAttempts) -> Flow[None]:
    """PutStart of `pending`, each naming its attempt (client/put_attempts.py); sets each
    one's plan or error.  The attempt of a call that got no reply is kept for the next put of
    its key, and so is a retry's that was refused (its lost try may still be pending)."""
    tries = attempts.start([p.key for p in pending])
    try:
        plans = yield put_start_call([p.spec for p in pending], tries)
    except BaseException as exc:
        if unanswered(exc):
            for p, attempt in zip(pending, tries, strict=True):
                attempts.lost(p.key, attempt)
        raise
    for p, plan, attempt in zip(pending, plans, tries, strict=True):
        p.attempt = attempt
        if isinstance(plan, MooncakeError):
            p.error, p.plan = plan, None
            if unanswered(plan) or attempt[1]:
                attempts.lost(p.key, attempt)
        else:
            p.error, p.plan = None, plan
