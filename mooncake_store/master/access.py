"""Who may call what on the master: callers, the role table, tenants as key namespaces.

Every call is made by a `Caller` (role, tenant, node id) established once per framed connection
(its first call is `Authenticate`) and per gRPC call (the `authorization: Bearer <token>`
metadata, checked by `AuthInterceptor` before any servicer code runs).  `allowed` is the one
table of which role may call which method.

Tenants: the master stores the keys of tenant T under `T + "\\0" + key` (keys may not contain
NUL), and the default tenant's keys as they are; `tenancy.py` applies that to every method.
"""

from __future__ import annotations

import threading
import time

import grpc
from google.protobuf.message import Message

from mooncake_store.common.auth import (
    ANY_NODE,
    HOW_TO_GET_A_TOKEN,
    SIGNATURE_METADATA,
    Claims,
    RequestVerifier,
    Role,
    TokenAuthority,
    node_proof_key,
    validate_tenant,
)
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError, InvalidKeyError
from mooncake_store.common.keys import validate_key
from mooncake_store.master.revocations import RevokedTokens

DEFAULT_TENANT = "default"
TENANT_SEPARATOR = "\0"
SERVICE = "mooncake_store.v1.MasterService"
TENANT_METADATA = "x-mooncake-tenant"

# Methods only a node (or an admin) calls; only an admin; anyone who authenticated.
NODE_METHODS = frozenset({"MountSegment", "Heartbeat", "UnmountSegment", "DrainNode"})
ADMIN_METHODS = frozenset({"CreateToken", "RevokeToken", "ListRevokedTokens"})
ANY_METHODS = frozenset({"Hello", "Authenticate"})


class PermissionDeniedError(AccessDeniedError):
    """The caller is authenticated, but its role may not make this call."""


def allowed(role: Role, method: str) -> bool:
    """The role table: may a caller of `role` call MasterService `method`?"""
    if role is Role.ADMIN or method in ANY_METHODS:
        return True
    if role is Role.NODE:
        return method in NODE_METHODS
    return method not in NODE_METHODS and method not in ADMIN_METHODS  # a client: data calls


class Caller:
    """An authenticated caller, and its key namespace."""

    __slots__ = ("_prefix", "node_id", "role", "tenant", "token_id")

    def __init__(self, role: Role, tenant: str, node_id: str = "", token_id: str = "") -> None:
        self.role = role
        self.tenant = tenant
        self.node_id = node_id
        self.token_id = token_id
        self._prefix = "" if tenant == DEFAULT_TENANT else tenant + TENANT_SEPARATOR

    @classmethod
    def of(cls, claims: Claims, tenant: str = "") -> Caller:
        if tenant and tenant != claims.tenant:
            if claims.role is not Role.ADMIN:
                raise PermissionDeniedError(
                    f"a {claims.role.value} token of tenant {claims.tenant!r} cannot act in "
                    f"tenant {tenant!r}; only admin tokens may choose a tenant"
                )
            try:
                validate_tenant(tenant)
            except InvalidArgumentError as exc:
                raise PermissionDeniedError(str(exc)) from None
        return cls(claims.role, tenant or claims.tenant, claims.node_id, claims.token_id)

    @property
    def has_prefix(self) -> bool:
        """True for a tenant other than the default one (its stored keys carry a prefix)."""
        return bool(self._prefix)

    def may_act_as_node(self, node_id: str) -> bool:
        if self.role is Role.ADMIN:
            return True
        return self.role is Role.NODE and self.node_id in (node_id, ANY_NODE)

    def internal(self, key: str) -> str:
        """The stored key for this caller's `key`.

        Raises:
            InvalidKeyError: empty, too long, or holding NUL.
        """
        validate_key(key)
        return self._prefix + key if self._prefix else key

    def internal_prefix(self, prefix: str) -> str:
        """The stored-key prefix of this caller's keys that start with `prefix`."""
        if TENANT_SEPARATOR in prefix:
            raise InvalidKeyError("key prefix must not contain NUL (U+0000)")
        return self._prefix + prefix

    def internal_parent(self, key: str) -> str:
        return self.internal(key) if key else ""

    def external(self, stored: str) -> str:
        """This caller's name for a stored key of its own tenant ("" for another tenant's)."""
        if not self._prefix:
            return "" if TENANT_SEPARATOR in stored else stored
        return stored[len(self._prefix) :] if stored.startswith(self._prefix) else ""

    def owns(self, stored: str) -> bool:
        """True when a stored key belongs to this caller's tenant."""
        if not self._prefix:
            return TENANT_SEPARATOR not in stored
        return stored.startswith(self._prefix)


#: The caller of an in-process call and of every call when the master runs with --auth off.
TRUSTED = Caller(Role.ADMIN, DEFAULT_TENANT, ANY_NODE)


def _metadata_value(metadata: object, name: str) -> str:
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == name:
            return value if isinstance(value, str) else value.decode()
    return ""


class AccessControl:
    """Turns credentials into Callers.  `authority` None: authentication is off."""

    def __init__(self, authority: TokenAuthority | None) -> None:
        self.authority = authority
        #: Tokens revoked one by one (revocations.py), refused however genuine.
        self.revoked = RevokedTokens(clock=time.time)
        self.denied = 0
        # (node id, incarnation, method) -> stamp (ms) of the last node proof accepted
        self._proof_stamps: dict[tuple[str, int, str], int] = {}
        self._proof_lock = threading.Lock()  # heartbeats are checked on the liveness threads

    @property
    def enabled(self) -> bool:
        return self.authority is not None

    def authenticate(self, token: str, tenant: str = "") -> Caller:
        """The Caller a token (its bearer part) stands for.

        Raises:
            AccessDeniedError: no token, a forged, malformed or expired one; says how to get one.
        """
        if self.authority is None:
            return TRUSTED
        if not token:
            self.denied += 1
            raise AccessDeniedError(f"this master requires a token; {HOW_TO_GET_A_TOKEN}")
        try:
            claims = self.authority.verify(token)
            if claims.token_id in self.revoked:
                raise AccessDeniedError(
                    f"this token was revoked (mooncake-admin token revoke); {HOW_TO_GET_A_TOKEN}"
                )
            return Caller.of(claims, tenant)
        except AccessDeniedError:
            self.denied += 1
            raise

    def from_metadata(self, metadata: object) -> Caller:
        if self.authority is None:
            return TRUSTED
        header = _metadata_value(metadata, "authorization")
        token = header[7:] if header.startswith("Bearer ") else header
        return self.authenticate(token, _metadata_value(metadata, TENANT_METADATA))

    def caller(self, context: object) -> Caller:
        """The caller behind a servicer call: the framed connection's Caller, a gRPC context's
        metadata (already checked by the interceptor), or TRUSTED for in-process calls."""
        if isinstance(context, Caller):
            return context
        if context is None:
            return TRUSTED
        framed = getattr(context, "caller", None)  # a framed connection, once authenticated
        if isinstance(framed, Caller):
            return framed
        return self.from_metadata(context.invocation_metadata())  # type: ignore[attr-defined]

    def check(self, caller: Caller, method: str) -> None:
        """Raises PermissionDeniedError unless `caller` may call `method`."""
        if not allowed(caller.role, method):
            self.denied += 1
            raise PermissionDeniedError(
                f"a {caller.role.value} token may not call {method}"
                + ("; node tokens only mount and heartbeat" if caller.role is Role.NODE else "")
            )

    def check_node_proof(
        self, caller: Caller, method: str, request: Message, metadata: object
    ) -> None:
        """A node token's caller must also prove that it holds the token's node secret: its
        MountSegment, Heartbeat, UnmountSegment and DrainNode are signed (`x-mooncake-signature`)
        with the node incarnation's proof key, each stamp later than the last one accepted for
        that node incarnation and method (a replay is refused).  The stamps are the node's
        clock and are not compared with this one: a wall-clock step on either host must not
        refuse heartbeats (it would drop every node).  The bearer alone, which a process on the
        master's port while the master is down receives, does nothing.  Admins are exempt; so
        is everyone with authentication off.

        Raises:
            AccessDeniedError: no signature, a wrong one, or a replay.
        """
        if self.authority is None or caller.role is not Role.NODE:
            return
        node_id, incarnation = request.node_id, request.incarnation  # type: ignore[attr-defined]
        signature = _metadata_value(metadata, SIGNATURE_METADATA)
        secret = self.authority.node_secret(caller.node_id, caller.token_id)
        try:
            stamp = int(signature.partition(".")[0])
        except ValueError:
            stamp = -1
        # Checked at the signature's own stamp: only the MAC counts here (see above).
        verifier = RequestVerifier(
            node_proof_key(secret, node_id, incarnation), clock=lambda: stamp / 1000
        )
        try:
            verifier.verify(method, request.SerializeToString(deterministic=True), signature)
        except AccessDeniedError as exc:
            self.denied += 1
            raise AccessDeniedError(
                f"{method} of node {node_id!r} must be signed with the node token's secret "
                f"(a store node does this; the bearer part alone is not enough): {exc.message}"
            ) from None
        slot = (node_id, incarnation, method)
        with self._proof_lock:
            if stamp <= self._proof_stamps.get(slot, -1):
                self.denied += 1
                raise AccessDeniedError(
                    f"{method} of node {node_id!r} replayed (signed no later than the last one)"
                )
            self._proof_stamps[slot] = stamp


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """Refuses every MasterService call without a valid token (UNAUTHENTICATED) or whose role
    may not make it (PERMISSION_DENIED) before the servicer sees it.  Health checks stay open."""

    def __init__(self, access: AccessControl) -> None:
        self.access = access

    async def intercept_service(self, continuation, details):  # type: ignore[no-untyped-def]
        service, _, method = details.method.rpartition("/")
        if not self.access.enabled or service.lstrip("/") != SERVICE:
            return await continuation(details)
        try:
            caller = self.access.from_metadata(details.invocation_metadata)
        except PermissionDeniedError as exc:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        except AccessDeniedError as exc:
            return _refusal(grpc.StatusCode.UNAUTHENTICATED, str(exc))
        try:
            self.access.check(caller, method)
        except AccessDeniedError as exc:
            return _refusal(grpc.StatusCode.PERMISSION_DENIED, str(exc))
        return await continuation(details)


def _refusal(code: grpc.StatusCode, message: str) -> grpc.RpcMethodHandler:
    async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> None:
        await context.abort(code, message)

    return grpc.unary_unary_rpc_method_handler(refuse)
