"""Tenants as key namespaces, applied at the service boundary (one rule table, one wrapper).

A client's keys live in its token's tenant: the master stores tenant T's key K as `T NUL K`
(`Caller.internal`; the `default` tenant's keys are stored as they are, and no caller may name
a key holding NUL).  `TenantServicer` wraps the MasterServicer as gRPC and the framed endpoint
see it: before a method runs, the keys of its request are renamed in place to the caller's
stored keys (`REQUEST_KEYS`); after, the keys in its reply are renamed back, and another
tenant's are dropped (`REPLY_KEYS`).  The servicer and the object table below never see a
tenant: one tenant can neither read, dedupe against, overwrite, remove, prefix-match nor list
another's blocks, because it cannot name them.

Every MasterService method is either in `REQUEST_KEYS` or in `KEYLESS`; a test pins that, so a
method added later has to say how its keys are named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.message import Message

from mooncake_store.common.errors import MooncakeError
from mooncake_store.master.access import TENANT_SEPARATOR, AccessControl, Caller

Rename = Callable[[Message, Caller], None]


def _stored(key: str, caller: Caller) -> str:
    """The stored key of a caller's key; "" (which nothing is stored under) for a bad one."""
    if not key:
        return key
    try:
        return caller.internal(key)
    except MooncakeError:
        return ""


def _key(field: str = "key") -> Rename:
    def rename(request: Message, caller: Caller) -> None:
        setattr(request, field, _stored(getattr(request, field), caller))

    return rename


def _keys(request: Message, caller: Caller) -> None:
    keys = request.keys  # type: ignore[attr-defined]
    if caller.has_prefix or any(TENANT_SEPARATOR in k for k in keys):
        stored = [_stored(k, caller) for k in keys]
        del keys[:]
        keys.extend(stored)


def _put_item(item: Any, caller: Caller) -> None:
    item.key = _stored(item.key, caller)
    if item.parent_key:
        item.parent_key = _stored(item.parent_key, caller)


def _each(field: str, rename: Callable[[Any, Caller], None]) -> Rename:
    def each(request: Message, caller: Caller) -> None:
        for item in getattr(request, field):
            rename(item, caller)

    return each


def _prefix(request: Message, caller: Caller) -> None:
    prefix = request.prefix  # type: ignore[attr-defined]
    try:
        request.prefix = caller.internal_prefix(prefix)  # type: ignore[attr-defined]
    except MooncakeError:  # NUL in it: what it matches is nobody's to list (filtered below)
        request.prefix = TENANT_SEPARATOR  # type: ignore[attr-defined]


#: How each key-addressed method's request names keys.
REQUEST_KEYS: dict[str, Rename] = {
    "PutStart": _put_item,
    "BatchPutStart": _each("items", _put_item),
    "PutEnd": _key(),
    "BatchPutEnd": _each("items", _key()),
    "PutRevoke": _key(),
    "BatchPutRevoke": _keys,
    "GetReplicaList": _key(),
    "BatchGetReplicaList": _keys,
    "Exists": _key(),
    "BatchExists": _keys,
    "Remove": _key(),
    "BatchRemove": _keys,
    "PrefixMatch": _keys,
    "GetPrefix": _keys,
    "BatchReportCorrupt": _each("reports", _key()),
    "ListKeys": _prefix,
    "BatchDescribe": _keys,
    "BatchLeasedPut": _each("items", lambda item, caller: _put_item(item.spec, caller)),
}

#: Methods whose requests and replies name no object key.
KEYLESS = frozenset({
    "Hello", "MountSegment", "Heartbeat", "UnmountSegment", "ListNodes", "Stats",
    "Authenticate", "CreateToken", "RevokeToken", "ListRevokedTokens", "DrainNode",
})  # fmt: skip


def _parents(results: Any, caller: Caller) -> None:
    for result in results:
        if result.parent_key:
            result.parent_key = caller.external(result.parent_key)


def _listed(reply: Any, caller: Caller) -> None:
    mine = [k for k in reply.keys if caller.owns(k.key)]
    for info in mine:
        info.key = caller.external(info.key)
    del reply.keys[:]
    reply.keys.extend(mine)


#: How replies name keys (renamed back to the caller's names).
REPLY_KEYS: dict[str, Callable[[Any, Caller], None]] = {
    "GetReplicaList": lambda reply, caller: _parents([reply], caller),
    "BatchGetReplicaList": lambda reply, caller: _parents(reply.results, caller),
    "GetPrefix": lambda reply, caller: _parents(reply.results, caller),
    "ListKeys": _listed,
}


class TenantServicer:
    """The servicer with every key-addressed method confined to the caller's tenant.

    Every other attribute is the servicer's own.
    """

    def __init__(self, servicer: object, access: AccessControl) -> None:
        self._servicer = servicer
        self._access = access
        for name, rename in REQUEST_KEYS.items():
            handler = getattr(servicer, name, None)
            if handler is not None:
                setattr(self, name, self._wrap(handler, rename, REPLY_KEYS.get(name)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._servicer, name)

    def _wrap(
        self,
        handler: Callable[..., Any],
        rename: Rename,
        rename_back: Callable[[Any, Caller], None] | None,
    ) -> Callable[..., Any]:
        access = self._access

        async def call(request: Any, context: Any) -> Any:
            caller = access.caller(context)
            rename(request, caller)
            reply = await handler(request, context)
            if rename_back is not None:
                rename_back(reply, caller)
            return reply

        return call
