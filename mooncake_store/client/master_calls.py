"""The master calls as values: each request, the function that parses its reply, and whether
it may be sent twice (`MasterCall`), with the parsers of the master's replies.

`master_client.py` sends them (grpc.aio or the framed endpoint); the sync client sends them on a
blocking framed socket.  Every name here is importable from `master_client.py` too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence, Sized
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from google.protobuf.message import Message

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.client.types import (
    KeyInfo,
    ObjectInfo,
    PutPlan,
    PutSpec,
    ReplicaInfo,
    ReplicaList,
    ReplicaLocation,
)
from mooncake_store.common.errors import OK, MooncakeError, error_for_code

R = TypeVar("R")


def _location(loc: pb.ReplicaLocation) -> ReplicaLocation:
    return ReplicaLocation(
        loc.node_id,
        loc.segment_id,
        loc.endpoint,
        loc.shm_socket,
        loc.offset,
        loc.size_bytes,
        bytes(loc.grant),
        loc.tier or "DRAM",
    )


def _replica_list(result: pb.ReplicaListResult) -> ReplicaList | MooncakeError:
    err = status_error(result.status)
    if err is not None:
        return err
    replicas = [_location(r) for r in result.replicas]
    return ReplicaList(
        result.size_bytes, result.checksum, replicas, bytes(result.tag), result.parent_key
    )


def status_error(status: pb.Status) -> MooncakeError | None:
    return None if status.code == OK else error_for_code(status.code, status.message)


# ---- calls as values -------------------------------------------------------------------------
# A MasterCall is a request and the function that parses its reply.  The client's operations
# yield them (see AsyncClient._drive): the async client awaits them on the MasterClient, the sync
# Client sends them on a blocking framed socket of the calling thread.


@dataclass(frozen=True, slots=True)
class MasterCall(Generic[R]):
    """A request, the function that parses its reply, and whether sending it twice is safe
    (the master's answer and state are the same after a repeat): only such calls are retried
    after they may have reached the master.

    A batch call names its repeated field the master caps (`batch`, see common/batching.py):
    a bigger one is sent as `slices` of at most the cap, and their parsed replies `join`
    again in order.  The other fields go with every slice, except repeated ones (leases
    asked for or given back), which go with the first slice only, and those named in
    `beside` (one entry per item of `batch`, when given), which are sliced with it.
    `slice_failed` says what each item of a slice whose call failed reads as (its error, item
    by item); None: the whole call fails.  A prefix call (`then`) sends its slices one after
    another, the next only while `then(reply, items)` says the run went through the whole
    slice.
    """

    name: str
    request: Message
    parse: Callable[[Any], R]
    idempotent: bool = False
    batch: str = ""
    merge: Callable[[list[Any]], R] | None = None  # None: the slices' lists concatenated
    slice_failed: Callable[[MooncakeError, int], Any] | None = None
    then: Callable[[Any, int], bool] | None = None
    beside: tuple[str, ...] = ()

    def items(self) -> int:
        """How many items the batch carries (0: not a batch call)."""
        return len(getattr(self.request, self.batch)) if self.batch else 0

    def slices(self, cap: int) -> list[MasterCall[R]]:
        """This call as calls of at most `cap` items each, in order; [] when it fits in one."""
        count = self.items()
        if count <= cap:
            return []
        return [
            replace(self, request=_slice_request(self.request, self.batch, start, cap, self.beside))
            for start in range(0, count, cap)
        ]

    def join(self, parts: list[MasterCall[R]], outcomes: list[R | BaseException]) -> R:
        """The parsed replies (or the errors) of `parts`, this call's slices, as one reply.

        Raises:
            the error of the first slice that failed, when every slice failed, when the call
            has no per-item reading of a failure (`slice_failed`), or when it is no
            MooncakeError.
        """
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        for failure in failures:
            if not isinstance(failure, MooncakeError):
                raise failure
        if failures and (len(failures) == len(outcomes) or self.slice_failed is None):
            raise failures[0]
        replies: list[Any] = [
            self.slice_failed(o, p.items()) if isinstance(o, MooncakeError) else o  # type: ignore[misc]
            for p, o in zip(parts, outcomes, strict=True)
        ]
        if self.merge is not None:
            return self.merge(replies)
        joined: Any = [item for reply in replies for item in reply]
        return joined  # type: ignore[no-any-return]


def _slice_request(
    request: Message, field: str, start: int, count: int, beside: tuple[str, ...] = ()
) -> Message:
    """`request` with `count` items of its repeated `field` (and of the fields `beside` it)
    from `start` (see MasterCall)."""
    out = type(request)()
    for desc, value in request.ListFields():
        if desc.name == field or desc.name in beside:
            getattr(out, desc.name).extend(value[start : start + count])
        elif desc.is_repeated:
            if start == 0:
                getattr(out, desc.name).extend(value)
        elif desc.message_type is not None:
            getattr(out, desc.name).CopyFrom(value)
        else:
            setattr(out, desc.name, value)
    return out


def each_failed(error: MooncakeError, count: int) -> list[MooncakeError]:
    """A failed slice of a call whose reply is one outcome per item: each item's is the error."""
    return [error] * count


def put_start_call(
    items: Sequence[PutSpec], attempts: Sequence[tuple[int, int]] | None = None
) -> MasterCall[list[PutPlan | MooncakeError]]:
    """BatchPutStart of `items`; `attempts`: each one's (attempt id, retry count), see
    client/put_attempts.py."""
    tries = attempts if attempts is not None else [(0, 0)] * len(items)
    request = pb.BatchPutStartRequest(
        items=[
            pb.PutStartItem(
                key=i.key,
                size_bytes=i.size_bytes,
                replicas=i.replicas,
                fingerprint=i.fingerprint,
                parent_key=i.parent_key,
                tag=i.tag,
                pin=i.pin,
                pin_ttl_s=i.pin_ttl_s,
                soft_pin_ttl_s=i.soft_pin_ttl_s,
                preferred_nodes=i.preferred_nodes,
                attempt=attempt,
                retry=retry,
            )
            for i, (attempt, retry) in zip(items, tries, strict=True)
        ]
    )

    def parse(reply: pb.BatchPutStartResponse) -> list[PutPlan | MooncakeError]:
        out: list[PutPlan | MooncakeError] = []
        for result in reply.results:
            err = status_error(result.status)
            out.append(
                err
                or PutPlan(
                    result.already_exists,
                    [_location(r) for r in result.replicas],
                    result.existing_checksum if result.has_existing_checksum else None,
                )
            )
        return out

    return MasterCall("BatchPutStart", request, parse, batch="items", slice_failed=each_failed)


PutEndTuple = tuple[str, int, Sequence[int], int]


def put_end_items(items: Sequence[PutEndTuple]) -> list[pb.PutEndItem]:
    """PutEnd items of (key, checksum, failed segments, put generation; 0: whichever put of
    the key is pending)."""
    return [
        pb.PutEndItem(key=k, checksum=c, failed_segments=list(f), generation=g)
        for k, c, f, g in items
    ]


def put_end_call(items: Sequence[PutEndTuple]) -> MasterCall[list[int | MooncakeError]]:
    request = pb.BatchPutEndRequest(items=put_end_items(items))
    # Idempotent: the master answers a repeated PutEnd of a put it committed with the same
    # checksum as it answered the first (a retry whose first reply was lost reports success).
    return MasterCall(
        "BatchPutEnd",
        request,
        lambda reply: [status_error(r.status) or r.replicas for r in reply.results],
        idempotent=True,
        batch="items",
        slice_failed=each_failed,
    )


def put_revoke_call(
    keys: Sequence[str], generations: Sequence[int] = ()
) -> MasterCall[list[MooncakeError | None]]:
    """BatchPutRevoke of `keys`; `generations`: each one's put (0: whichever is pending)."""
    return MasterCall(
        "BatchPutRevoke",
        pb.KeysRequest(keys=keys, generations=generations),
        lambda reply: [status_error(s) for s in reply.statuses],
        batch="keys",
        slice_failed=each_failed,
        beside=("generations",),
    )


def _replica_lists(reply: pb.BatchGetReplicaListResponse) -> list[ReplicaList | MooncakeError]:
    return [_replica_list(r) for r in reply.results]


def get_replica_list_call(
    keys: Sequence[str], fingerprint: bytes = b""
) -> MasterCall[list[ReplicaList | MooncakeError]]:
    request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
    return MasterCall(
        "BatchGetReplicaList", request, _replica_lists, idempotent=True, batch="keys",
        slice_failed=each_failed,
    )  # fmt: skip


def get_prefix_call(
    keys: Sequence[str], fingerprint: bytes = b""
) -> MasterCall[list[ReplicaList | MooncakeError]]:
    request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
    return MasterCall(
        "GetPrefix", request, _replica_lists, idempotent=True, batch="keys", then=_whole_run
    )


def _whole_run(reply: Sized | int, items: int) -> bool:
    """A prefix slice's run covered all its `items`: the next slice continues it."""
    return (reply if isinstance(reply, int) else len(reply)) == items


def prefix_match_call(keys: Sequence[str], fingerprint: bytes = b"") -> MasterCall[int]:
    request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
    return MasterCall(
        "PrefixMatch", request, lambda reply: int(reply.matched), idempotent=True,
        batch="keys", merge=sum, then=_whole_run,
    )  # fmt: skip


def exists_call(keys: Sequence[str]) -> MasterCall[list[bool]]:
    return MasterCall(
        "BatchExists", pb.KeysRequest(keys=keys), lambda reply: list(reply.exists),
        idempotent=True, batch="keys",
    )  # fmt: skip


def report_corrupt_call(
    reports: Sequence[tuple[str, int, Sequence[ReplicaLocation]]],
) -> MasterCall[list[MooncakeError | None]]:
    """Report objects (key, the checksum given, the replicas read) whose every replica failed
    its checksum; the master deletes those still stored exactly so."""
    request = pb.ReportCorruptRequest(
        reports=[
            pb.CorruptReport(
                key=key,
                checksum=checksum,
                replicas=[pb.ReplicaRef(segment_id=r.segment_id, offset=r.offset) for r in locs],
            )
            for key, checksum, locs in reports
        ]
    )
    return MasterCall(
        "BatchReportCorrupt",
        request,
        lambda reply: [status_error(s) for s in reply.statuses],
        batch="reports",
        slice_failed=each_failed,
    )


def remove_call(
    keys: Sequence[str], *, unless_leased: bool = False
) -> MasterCall[list[MooncakeError | None]]:
    return MasterCall(
        "BatchRemove",
        pb.KeysRequest(keys=keys, unless_leased=unless_leased),
        lambda reply: [status_error(s) for s in reply.statuses],
        batch="keys",
        slice_failed=each_failed,
    )


def list_keys_call(
    cursor: str, limit: int, prefix: str = ""
) -> MasterCall[tuple[list[KeyInfo], str]]:
    """One page of the committed keys and the cursor of the next ("" after the last)."""

    def parse(reply: pb.ListKeysResponse) -> tuple[list[KeyInfo], str]:
        keys = [KeyInfo(k.key, k.size_bytes, k.replicas) for k in reply.keys]
        return keys, reply.next_cursor

    request = pb.ListKeysRequest(cursor=cursor, limit=limit, prefix=prefix)
    return MasterCall("ListKeys", request, parse)


def describe_call(keys: Sequence[str]) -> MasterCall[list[ObjectInfo | MooncakeError]]:
    """Sizes and placement of committed objects (no lease, counts no access)."""

    def parse(reply: pb.BatchDescribeResponse) -> list[ObjectInfo | MooncakeError]:
        out: list[ObjectInfo | MooncakeError] = []
        for r in reply.results:
            err = status_error(r.status)
            replicas = [
                ReplicaInfo(i.node_id, i.segment_id, i.endpoint, i.tier, i.offset)
                for i in r.replicas
            ]
            out.append(err or ObjectInfo(r.size_bytes, replicas))
        return out

    return MasterCall(
        "BatchDescribe", pb.KeysRequest(keys=keys), parse, batch="keys", slice_failed=each_failed
    )
