"""Property-based fuzzing of the other parsers a peer reaches: the shared-memory hand-off reply
(common/shm_handoff.py, client/transport.py ShmMapper), data-path grants (common/grant.py),
tokens and master-signed control requests (common/auth.py) and the master's credential check
(master/access.py).  Each either parses or raises its one documented error."""

from __future__ import annotations

import base64
import json
import os
import socket
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from mooncake_store.client.transport import ShmMapper
from mooncake_store.client.types import ReplicaLocation
from mooncake_store.common.auth import (
    TOKEN_VERSION,
    RequestVerifier,
    Role,
    TokenAuthority,
    bearer,
    node_secret_of,
    parse_claims,
    sign_request,
)
from mooncake_store.common.errors import AccessDeniedError
from mooncake_store.common.grant import GRANT_BYTES, verify_grant
from mooncake_store.common.shm_handoff import HELLO, REFUSED, HandoffRefused, parse_hello
from mooncake_store.master.access import AccessControl

EXAMPLES = int(os.environ.get("MOONCAKE_FUZZ_EXAMPLES", "200"))  # more for a bug hunt
FUZZ = settings(max_examples=EXAMPLES, deadline=None)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=40),
        st.just(REFUSED),
        st.builds(HELLO.pack, st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
    ),
    st.integers(0, 3),
)
def test_hand_off_replies_parse_or_fail_cleanly_and_leak_no_descriptor(msg, nfds):
    fds = [os.open("/dev/null", os.O_RDONLY) for _ in range(nfds)]
    try:
        _, size, fd, floor_fd = parse_hello(msg, fds)
    except HandoffRefused:
        assert msg == REFUSED and nfds == 0
    except ValueError:
        pass
    else:
        assert nfds in (1, 2) and len(msg) == HELLO.size and size > 0 and fd == fds[0]
        assert floor_fd == (fds[1] if nfds == 2 else None)
        for got in fds:
            assert _is_open(got)
            os.close(got)
        return
    assert not any(_is_open(fd) for fd in fds)


@settings(max_examples=40, deadline=None)
@given(st.binary(max_size=32), st.integers(0, 2), st.integers(0, 1 << 40))
def test_client_survives_a_hostile_hand_off_server(msg, nfds, memfd_size):
    """An impostor listening under a node's socket name sends anything: the client maps a
    genuine-looking pool or falls back to TCP (None); it never raises or leaks a descriptor."""
    name = f"mooncake-fuzz-{os.getpid()}-{threading.get_ident()}"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind("\0" + name)
    server.listen(1)
    memfd = os.memfd_create("fuzz")
    os.ftruncate(memfd, min(memfd_size, 1 << 20))

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            try:
                socket.send_fds(conn, [msg or b"\0"], [memfd] * nfds)
            except OSError:
                pass

    thread = threading.Thread(target=serve)
    thread.start()
    before = len(os.listdir("/proc/self/fd"))
    mapper = ShmMapper()
    loc = ReplicaLocation("n", 7, "peer:1", name, 0, 16, b"", "DRAM")
    try:
        view = mapper.map(loc)
        if view is not None:
            assert len(msg) == HELLO.size and nfds in (1, 2)
            assert HELLO.unpack(msg)[0] == 7
    finally:
        thread.join(5)
        mapper.close()
        server.close()
        os.close(memfd)
    # the server socket and the memfd are closed, and no received descriptor was kept
    assert len(os.listdir("/proc/self/fd")) <= before - 2


@FUZZ
@given(st.binary(max_size=GRANT_BYTES + 8), st.binary(min_size=1, max_size=64))
def test_grants_verify_or_are_none(blob, secret):
    grant = verify_grant(secret, blob)
    assert grant is None or len(blob) == GRANT_BYTES


# ---- tokens ----------------------------------------------------------------------------------

AUTHORITY = TokenAuthority(b"k" * 32, clock=lambda: 1_000_000.0)
GOOD = AUTHORITY.issue(Role.CLIENT, "tenant-a", ttl_s=3600)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner,
                                                                max_size=3),
    max_leaves=10,
)  # fmt: skip
payloads = st.one_of(
    json_values.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries(
        {"r": json_values | st.sampled_from(["client", "node", "admin"]), "t": json_values,
         "x": json_values | st.floats(), "i": json_values}
    ).map(lambda d: json.dumps(d).encode()),
    st.integers(1, 3000).map(lambda n: b"[" * n),  # deep nesting
    st.binary(max_size=60),
)  # fmt: skip
tokens = st.one_of(
    st.text(max_size=80),
    st.tuples(payloads, st.binary(max_size=20)).map(
        lambda t: f"{TOKEN_VERSION}.{_b64(t[0])}.{_b64(t[1])}"),
    st.tuples(st.integers(0, len(GOOD) - 1), st.characters()).map(
        lambda t: GOOD[: t[0]] + t[1] + GOOD[t[0] + 1 :]),
    st.integers(4000, 5000).map(lambda n: "a" * n),
)  # fmt: skip


@FUZZ
@given(tokens)
def test_tokens_parse_or_are_refused_with_access_denied(token):
    for parse in (AUTHORITY.verify, parse_claims, bearer, node_secret_of):
        try:
            parse(token)
        except AccessDeniedError as exc:
            assert exc.message
    try:
        claims = AUTHORITY.verify(token)
    except AccessDeniedError:
        return
    assert claims == AUTHORITY.verify(GOOD)  # only the genuine token (or its bearer form)


# ---- master-signed control requests and the master's credential check -------------------------

CONTROL_KEY = b"c" * 32


@FUZZ
@given(
    st.sampled_from(["Fetch", "Move", "Release"]),
    st.binary(max_size=40),
    st.one_of(
        st.text(max_size=80),
        st.builds(
            lambda n, h: f"{n}.{h}",
            st.integers(-(10**400), 10**400),
            st.text("0123456789abcdef", max_size=40),
        ),
    ),
)
def test_control_signatures_verify_or_are_refused(method, body, signature):  # fmt: skip
    now = 1_000_000.0
    verifier = RequestVerifier(CONTROL_KEY, clock=lambda: now)
    try:
        verifier.verify(method, body, signature)
    except AccessDeniedError as exc:
        assert method in exc.message
    else:  # only a genuine one passes (a random one cannot)
        assert signature == sign_request(CONTROL_KEY, method, body, now)
    genuine = sign_request(CONTROL_KEY, method, body, now)
    verifier.verify(method, body, genuine)
    try:
        verifier.verify(method, body, genuine)
        raise AssertionError("a replayed request was accepted")
    except AccessDeniedError as exc:
        assert "replayed" in exc.message


@FUZZ
@given(tokens, st.one_of(st.just(""), st.text(max_size=30)))
def test_the_master_turns_any_credentials_into_a_caller_or_access_denied(token, tenant):
    access = AccessControl(AUTHORITY)
    try:
        caller = access.authenticate(token, tenant)
    except AccessDeniedError as exc:
        assert exc.message
        return
    assert caller.role is Role.CLIENT and caller.tenant == "tenant-a"
