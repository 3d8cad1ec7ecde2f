"""Credentials: the cluster key, signed tokens, and the keys derived from them (pure, no network).

The master keeps one secret, the *cluster key* (32 random bytes, `<data-dir>/cluster.key`,
mode 0600, created on first start).  Everything else is derived from it with keyed BLAKE2b,
each derivation under its own label, so no derived key reveals another:

    token key      = KDF(cluster key, "token")            signs tokens
    node secret    = KDF(cluster key, "node", node id, token id)
                                                          ships inside a node token only
    grant key      = KDF(node secret, "grant", node id, incarnation)
                                                          signs the node's data-path grants
    control key    = KDF(node secret, "control", node id, incarnation)
                                                          signs the master's Fetch/Move/Release

A token is `mc1.<payload>.<mac>` (base64url, no padding): the payload is canonical JSON with
the role (`client`, `node`, `admin`), the tenant, the expiry (Unix seconds, 0 = never), a random
token id and, for node tokens, the node id it is bound to (`*`: any node id, the master's
same-host token).  The mac is keyed BLAKE2b-256 under the token key and is compared in
constant time.  A node token carries a fourth part, the node secret: the node presents only the
first three parts (the *bearer*), so a process that answers on the master's port learns a
bearer, never the node secret, and cannot forge grants or control requests with it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError

TOKEN_VERSION = "mc1"
KEY_BYTES = 32
CLUSTER_KEY_FILE = "cluster.key"
ANY_NODE = "*"
MAX_TOKEN_CHARS = 4096

HOW_TO_GET_A_TOKEN = (
    "get a token with `mooncake-admin token create --role client --tenant NAME "
    "--data-dir <master data dir>` on the master's host, then pass Client(master, token=...) "
    "or set MOONCAKE_TOKEN / MOONCAKE_TOKEN_FILE (nodes: --token-file)"
)


class Role(Enum):
    CLIENT = "client"
    NODE = "node"
    ADMIN = "admin"


@dataclass(frozen=True, slots=True)
class Claims:
    """What a verified token says about its holder."""

    role: Role
    tenant: str
    expires_s: int  # Unix seconds; 0: never
    token_id: str
    node_id: str = ""  # node tokens: the node id it may act as (ANY_NODE: any)

    def expired(self, now_s: float) -> bool:
        return self.expires_s != 0 and now_s >= self.expires_s

    def may_act_as_node(self, node_id: str) -> bool:
        """True when this token lets its holder mount, heartbeat or unmount as `node_id`."""
        if self.role is Role.ADMIN:
            return True
        return self.role is Role.NODE and self.node_id in (node_id, ANY_NODE)


def kdf(key: bytes, label: str, *parts: str | int) -> bytes:
    """A 32-byte key derived from `key` for `label` and `parts` (keyed BLAKE2b)."""
    h = hashlib.blake2b(key=key[:64], digest_size=KEY_BYTES, person=b"mooncake-kdf")
    h.update(label.encode())
    for part in parts:
        data = str(part).encode()
        h.update(len(data).to_bytes(4, "little"))
        h.update(data)
    return h.digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def validate_tenant(tenant: str) -> str:
    """A tenant name: 1-64 characters of letters, digits, `-`, `_` and `.`."""
    if not (
        isinstance(tenant, str)
        and 0 < len(tenant) <= 64
        and all(c.isascii() and (c.isalnum() or c in "-_.") for c in tenant)
    ):
        raise InvalidArgumentError(
            f"tenant must be 1-64 characters of letters, digits, '-', '_' or '.', got {tenant!r}"
        )
    return tenant


class TokenAuthority:
    """Issues and verifies tokens; derives node secrets.  Held by the master and `mooncake-admin`.

    Example:
        authority = TokenAuthority(load_or_create_cluster_key(data_dir))
        token = authority.issue(Role.CLIENT, "team-a", ttl_s=30 * 86400)
        claims = authority.verify(token)        # raises AccessDeniedError if forged/expired
    """

    def __init__(self, cluster_key: bytes, *, clock: object = time.time) -> None:
        if len(cluster_key) < 16:
            raise InvalidArgumentError("the cluster key must be at least 16 bytes")
        self._cluster_key = cluster_key
        self._token_key = kdf(cluster_key, "token")
        self._clock = clock
        self._verified: dict[str, Claims] = {}

    def _mac(self, signed: str) -> bytes:
        return hashlib.blake2b(signed.encode(), key=self._token_key, digest_size=32).digest()

    def node_secret(self, node_field: str, token_id: str) -> bytes:
        return kdf(self._cluster_key, "node", node_field, token_id)

    def issue(
        self, role: Role, tenant: str, *, ttl_s: float | None = None, node_id: str = ""
    ) -> str:
        """A signed token; `ttl_s` None or 0 never expires.  Node tokens need `node_id`."""
        validate_tenant(tenant)
        if role is Role.NODE and not node_id:
            raise InvalidArgumentError(
                "a node token is bound to a node id: pass --node-id (the node's --node-id)"
            )
        if role is not Role.NODE and node_id:
            raise InvalidArgumentError("--node-id goes with --role node only")
        now = float(self._clock())  # type: ignore[operator]
        payload: dict[str, object] = {
            "r": role.value,
            "t": tenant,
            "x": int(now + ttl_s) if ttl_s else 0,
            "i": secrets.token_hex(8),
        }
        if node_id:
            payload["n"] = node_id
        body = _b64(json.dumps(payload, sort_keys=True, separators=(",", ":")).encode())
        signed = f"{TOKEN_VERSION}.{body}"
        token = f"{signed}.{_b64(self._mac(signed))}"
        if role is Role.NODE:
            token += "." + _b64(self.node_secret(node_id, str(payload["i"])))
        return token

    def verify(self, token: str) -> Claims:
        """The claims of a well-formed, genuine, unexpired token (its bearer part is enough).

        Raises:
            AccessDeniedError: malformed, forged, or expired; the message says how to get one.
        """
        claims = self._verified.get(token)
        if claims is None:
            claims = self._verify_signature(token)
            if len(self._verified) >= 4096:
                self._verified.clear()
            self._verified[token] = claims
        if claims.expired(float(self._clock())):  # type: ignore[operator]
            raise AccessDeniedError(f"the token expired; {HOW_TO_GET_A_TOKEN}")
        return claims

    def genuine(self, token: str) -> Claims:
        """The claims of a token this cluster's key signed, expired or not.

        Raises:
            AccessDeniedError: malformed or forged.
        """
        return self._verify_signature(token)

    def _verify_signature(self, token: str) -> Claims:
        parts = bearer(token).split(".")
        if len(parts) != 3 or parts[0] != TOKEN_VERSION or not token.isascii():
            raise AccessDeniedError(f"malformed token (not a {TOKEN_VERSION} token); "
                                    f"{HOW_TO_GET_A_TOKEN}")  # fmt: skip
        signed = f"{parts[0]}.{parts[1]}"
        try:
            mac = _unb64(parts[2])
        except ValueError:
            mac = b""
        if not hmac.compare_digest(mac, self._mac(signed)):
            raise AccessDeniedError(
                f"the token is not signed by this cluster's key; {HOW_TO_GET_A_TOKEN}"
            )
        return parse_claims(token)


def bearer(token: str) -> str:
    """The part of a token that is presented to the master (a node token without its secret)."""
    token = token.strip()
    if len(token) > MAX_TOKEN_CHARS:
        raise AccessDeniedError(f"token longer than {MAX_TOKEN_CHARS} characters")
    parts = token.split(".")
    return ".".join(parts[:3])


def parse_claims(token: str) -> Claims:
    """The claims a token states, NOT verified (a node reads its own token with this).

    Raises:
        AccessDeniedError: the token is malformed.
    """
    parts = bearer(token).split(".")
    try:
        if len(parts) != 3 or parts[0] != TOKEN_VERSION:
            raise ValueError("not three parts")
        payload = json.loads(_unb64(parts[1]))
        claims = Claims(
            role=Role(payload["r"]),
            tenant=str(payload["t"]),
            expires_s=int(payload["x"]),
            token_id=str(payload["i"]),
            node_id=str(payload.get("n", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
        raise AccessDeniedError(f"malformed token ({exc}); {HOW_TO_GET_A_TOKEN}") from exc
    except RecursionError:  # deeply nested JSON (found by tests/unit/test_fuzz_*)
        problem = f"malformed token (nested too deep); {HOW_TO_GET_A_TOKEN}"
        raise AccessDeniedError(problem) from None
    return claims


def node_secret_of(token: str) -> bytes:
    """The node secret inside a node token (its fourth part).

    Raises:
        AccessDeniedError: not a node token with a secret.
    """
    parts = token.strip().split(".")
    if len(parts) != 4 or parse_claims(token).role is not Role.NODE:
        raise AccessDeniedError(
            "a node needs a node token (`mooncake-admin token create --role node "
            "--node-id ID`), which carries the node's secret"
        )
    try:
        secret = _unb64(parts[3])
    except ValueError as exc:
        raise AccessDeniedError("malformed node secret in the node token") from exc
    if len(secret) != KEY_BYTES:
        raise AccessDeniedError("malformed node secret in the node token")
    return secret


def grant_key(node_secret: bytes, node_id: str, incarnation: int) -> bytes:
    """The key that signs this node incarnation's data-path grants (master and node derive it)."""
    return kdf(node_secret, "grant", node_id, incarnation)


def control_key(node_secret: bytes, node_id: str, incarnation: int) -> bytes:
    """The key that signs the master's control requests to this node incarnation."""
    return kdf(node_secret, "control", node_id, incarnation)


def node_proof_key(node_secret: bytes, node_id: str, incarnation: int) -> bytes:
    """The key that signs a node incarnation's own MountSegment, Heartbeat, UnmountSegment and
    DrainNode: proof that the caller holds the node secret, not only the bearer (which a
    process on the master's port while it is down receives)."""
    return kdf(node_secret, "node-proof", node_id, incarnation)


def load_or_create_cluster_key(data_dir: str | os.PathLike[str]) -> bytes:
    """The cluster key under `data_dir`, created (0600, exclusively) if there is none yet."""
    path = Path(data_dir) / CLUSTER_KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_cluster_key(data_dir)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(KEY_BYTES) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return read_cluster_key(data_dir)


def read_cluster_key(data_dir: str | os.PathLike[str]) -> bytes:
    """The existing cluster key under `data_dir`.

    Raises:
        InvalidArgumentError: no key there, or one that others may read.
    """
    path = Path(data_dir) / CLUSTER_KEY_FILE
    try:
        st = path.stat()
        text = path.read_text().strip()
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"no cluster key at {path}: start the master once with --data-dir {data_dir} "
            "(it creates the key), or pass the master's --data-dir"
        ) from None
    if st.st_mode & 0o077:
        raise InvalidArgumentError(
            f"{path} is readable by others (mode {st.st_mode & 0o777:o}): chmod 600 {path}"
        )
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 16:
        raise InvalidArgumentError(f"{path} does not hold a cluster key (hex, 32 bytes)")
    return key


# ---- master-signed control requests (Fetch, Move, Release on a node) --------------------------

SIGNATURE_METADATA = "x-mooncake-signature"
SIGNATURE_WINDOW_S = 60.0


def _request_mac(key: bytes, method: str, stamp_ms: int, nonce: str, body: bytes) -> bytes:
    h = hashlib.blake2b(key=key, digest_size=16, person=b"mooncake-ctl")
    h.update(f"{method}\n{stamp_ms}\n{nonce}\n".encode())
    h.update(body)
    return h.digest()


def sign_request(key: bytes, method: str, body: bytes, now_s: float) -> str:
    """The signature metadata value of a control request (`body`: its deterministic bytes):
    `stamp_ms.nonce.mac`; the random nonce keeps two equal requests in one millisecond apart."""
    stamp_ms = int(now_s * 1000)
    nonce = secrets.token_hex(8)
    return f"{stamp_ms}.{nonce}.{_request_mac(key, method, stamp_ms, nonce, body).hex()}"


def sign_master_time(key: bytes, node_id: str, incarnation: int, nonce: int, time_ms: int) -> str:
    """The signature of the master's wall time in a heartbeat reply to the request that named
    `nonce` (node/master_clock.py): a node follows no time but its master's, and none sent to
    an earlier request (a replay would set its clock back and make expired grants work)."""
    body = f"{node_id}\n{incarnation}".encode()
    return _request_mac(key, "MasterTime", time_ms, f"{nonce:x}", body).hex()


def master_time_signed(
    key: bytes, node_id: str, incarnation: int, nonce: int, time_ms: int, signature: str
) -> bool:
    """Whether `signature` is `sign_master_time` of these values."""
    expected = sign_master_time(key, node_id, incarnation, nonce, time_ms)
    return hmac.compare_digest(signature.encode(), expected.encode())


class RequestVerifier:
    """A node's check of the master's control requests: signed with the node incarnation's
    control key, stamped within SIGNATURE_WINDOW_S of `clock` (on a node: the master's clock as
    it reads it from heartbeat and mount replies, node/master_clock.py), and never seen before
    (a replayed request is refused)."""

    def __init__(self, key: bytes, *, clock: object = time.time) -> None:
        self.key = key
        self._clock = clock
        self._seen: dict[bytes, float] = {}

    def verify(self, method: str, body: bytes, signature: str) -> None:
        """Raises AccessDeniedError unless `signature` is the master's, fresh and unused."""
        now = float(self._clock())  # type: ignore[operator]
        stamp, _, rest = signature.partition(".")
        nonce, _, mac_hex = rest.partition(".")
        try:
            stamp_ms = int(stamp)
            mac = bytes.fromhex(mac_hex)
        except ValueError:
            raise AccessDeniedError(
                f"{method} needs a request signed by this node's master (none or malformed)"
            ) from None
        if not hmac.compare_digest(mac, _request_mac(self.key, method, stamp_ms, nonce, body)):
            raise AccessDeniedError(f"{method} is not signed by this node's master")
        if abs(now - stamp_ms / 1000) > SIGNATURE_WINDOW_S:
            raise AccessDeniedError(
                f"{method} signature is {now - stamp_ms / 1000:+.0f}s off the master's clock as "
                f"this node reads it (limit {SIGNATURE_WINDOW_S:g}s): a request replayed, or "
                "the master's clock stepped since its last reply to this node"
            )
        if mac in self._seen:
            raise AccessDeniedError(f"{method} request replayed")
        if len(self._seen) > 10_000:
            horizon = now - 2 * SIGNATURE_WINDOW_S
            self._seen = {m: t for m, t in self._seen.items() if t > horizon}
        self._seen[mac] = now
