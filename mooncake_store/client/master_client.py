"""The client's view of the master: typed calls over grpc.aio, with errors translated once.

This is the one boundary where `grpc.RpcError` becomes a MooncakeError: an unreachable master
becomes MasterUnavailableError naming its address, per-key statuses become the exception class
their code names (`common.errors.error_for_code`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.client.types import PutPlan, PutSpec, ReplicaList, ReplicaLocation, Retry
from mooncake_store.common.errors import (
    OK,
    MasterUnavailableError,
    MooncakeError,
    RpcError,
    error_for_code,
)
from mooncake_store.common.grpc_options import DEFAULT_MAX_MESSAGE_BYTES, message_options

T = TypeVar("T")

_UNREACHABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


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


class MasterClient:
    def __init__(self, address: str, *, timeout_s: float, retry: Retry) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self.retry = retry
        self._channel = grpc.aio.insecure_channel(
            address, options=message_options(DEFAULT_MAX_MESSAGE_BYTES)
        )
        self._stub = pb_grpc.MasterServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def wait_ready(self, timeout_s: float) -> None:
        """Raise MasterUnavailableError unless the master answers within `timeout_s`."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), timeout_s)
        except TimeoutError:
            raise MasterUnavailableError(
                f"cannot reach the mooncake master at {self.address} within {timeout_s:g}s: "
                "is mooncake-master running there?"
            ) from None

    async def _call(self, method: Callable[..., Awaitable[T]], request: object) -> T:
        delays = self.retry.delays()
        for attempt in range(len(delays) + 1):
            try:
                return await method(request, timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() not in _UNREACHABLE:
                    raise RpcError(
                        f"master {self.address} failed the call: {exc.code().name}: {exc.details()}"
                    ) from exc
                if attempt == len(delays):
                    raise MasterUnavailableError(
                        f"mooncake master at {self.address} is unreachable "
                        f"({exc.code().name}: {exc.details()}); is mooncake-master running?"
                    ) from exc
                await asyncio.sleep(delays[attempt])
        raise AssertionError("unreachable")

    async def put_start(self, items: Sequence[PutSpec]) -> list[PutPlan | MooncakeError]:
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
                )
                for i in items
            ]
        )
        reply = await self._call(self._stub.BatchPutStart, request)
        out: list[PutPlan | MooncakeError] = []
        for result in reply.results:
            err = status_error(result.status)
            out.append(
                err or PutPlan(result.already_exists, [_location(r) for r in result.replicas])
            )
        return out

    async def put_end(
        self, items: Sequence[tuple[str, int, Sequence[int]]]
    ) -> list[int | MooncakeError]:
        request = pb.BatchPutEndRequest(
            items=[pb.PutEndItem(key=k, checksum=c, failed_segments=list(f)) for k, c, f in items]
        )
        reply = await self._call(self._stub.BatchPutEnd, request)
        return [status_error(r.status) or r.replicas for r in reply.results]

    async def put_revoke(self, keys: Sequence[str]) -> list[MooncakeError | None]:
        reply = await self._call(self._stub.BatchPutRevoke, pb.KeysRequest(keys=keys))
        return [status_error(s) for s in reply.statuses]

    async def get_replica_list(
        self, keys: Sequence[str], fingerprint: bytes = b""
    ) -> list[ReplicaList | MooncakeError]:
        request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
        reply = await self._call(self._stub.BatchGetReplicaList, request)
        return [_replica_list(r) for r in reply.results]

    async def prefix_match(self, keys: Sequence[str], fingerprint: bytes = b"") -> int:
        request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
        return (await self._call(self._stub.PrefixMatch, request)).matched

    async def get_prefix(
        self, keys: Sequence[str], fingerprint: bytes = b""
    ) -> list[ReplicaList | MooncakeError]:
        request = pb.KeysRequest(keys=keys, fingerprint=fingerprint)
        reply = await self._call(self._stub.GetPrefix, request)
        return [_replica_list(r) for r in reply.results]

    async def exists(self, keys: Sequence[str]) -> list[bool]:
        reply = await self._call(self._stub.BatchExists, pb.KeysRequest(keys=keys))
        return list(reply.exists)

    async def remove(self, keys: Sequence[str]) -> list[MooncakeError | None]:
        reply = await self._call(self._stub.BatchRemove, pb.KeysRequest(keys=keys))
        return [status_error(s) for s in reply.statuses]

    async def stats(self) -> pb.StatsResponse:
        return await self._call(self._stub.Stats, pb.StatsRequest())

    async def list_nodes(self) -> pb.ListNodesResponse:
        return await self._call(self._stub.ListNodes, pb.ListNodesRequest())
