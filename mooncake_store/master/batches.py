"""Batch calls that cannot hold the master's serving loop: a cap on their size, and slices.

The master serves every client on one asyncio loop.  A batch call (BatchGetReplicaList,
BatchPutStart, ...) is processed in slices of `SLICE_ITEMS` items with a yield to the loop
between slices, so other clients' calls run in between instead of waiting for a 100k-key batch
to finish.  A batch of more than the master's `max_batch_items` is refused as a whole with an
InvalidArgumentError naming the cap (gRPC: INVALID_ARGUMENT; framed endpoint: BAD_REQUEST):
the client splits it, learning the cap from Hello (`max_batch_items`; common/batching.py).
(Heartbeats do not depend on this loop at all: see `liveness.py`.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import grpc

from mooncake_store.common.batching import too_many_message
from mooncake_store.common.errors import InvalidArgumentError

SLICE_ITEMS = 1024  # items processed between two yields to the loop

T = TypeVar("T")
R = TypeVar("R")
Method = Callable[[Any, Any, Any], Awaitable[Any]]


async def each(items: Sequence[T], fn: Callable[[T], R]) -> list[R]:
    """`[fn(item) for item in items]`, yielding to the loop between slices."""
    if len(items) <= SLICE_ITEMS:
        return [fn(item) for item in items]
    out: list[R] = []
    for start in range(0, len(items), SLICE_ITEMS):
        if start:
            await asyncio.sleep(0)
        out.extend(fn(item) for item in items[start : start + SLICE_ITEMS])
    return out


async def pause_every(done: int) -> None:
    """Yield to the loop when `done` (items processed so far) ends a slice."""
    if done and done % SLICE_ITEMS == 0:
        await asyncio.sleep(0)


def too_many(method: str, count: int, cap: int) -> InvalidArgumentError:
    return InvalidArgumentError(too_many_message(method, count, cap))


def capped(field: str) -> Callable[[Method], Method]:
    """Refuse a call whose `request.<field>` holds more than the master's `max_batch_items`.

    gRPC calls are aborted with INVALID_ARGUMENT; framed calls raise the InvalidArgumentError,
    which the framed server answers with BAD_REQUEST.
    """

    def wrap(method: Method) -> Method:
        @functools.wraps(method)
        async def call(self: Any, request: Any, context: Any) -> Any:
            count = len(getattr(request, field))
            cap = self.config.max_batch_items
            if count > cap:
                exc = too_many(method.__name__, count, cap)
                abort = getattr(context, "abort", None)
                if abort is not None:  # a gRPC servicer context
                    await abort(grpc.StatusCode.INVALID_ARGUMENT, exc.message)
                raise exc
            return await method(self, request, context)

        return call

    return wrap
