"""Tokens revoked one by one (master/revocations.py) and the access check that refuses them
(master/access.py): pure, with an injected clock."""

import pytest

from mooncake_store.common.auth import Role, TokenAuthority, parse_claims
from mooncake_store.common.errors import AccessDeniedError, InvalidArgumentError
from mooncake_store.master import revocations
from mooncake_store.master.access import AccessControl
from mooncake_store.master.revocations import Revocation, RevokedTokens


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_revocation_is_kept_until_the_token_would_have_expired() -> None:
    clock = Clock()
    revoked = RevokedTokens(clock)
    record = revoked.revoke("a1b2", expires_s=int(clock.now) + 60)
    assert record == Revocation("a1b2", int(clock.now) + 60, clock.now)
    assert "a1b2" in revoked and "other" not in revoked
    forever = revoked.revoke("c3d4", expires_s=0)
    assert forever is not None and forever.expires_s == 0
    clock.now += 59
    assert revoked.expired() == [] and len(revoked) == 2
    clock.now += 1
    assert revoked.expired() == ["a1b2"]  # refused as expired from now on
    assert "a1b2" not in revoked and "c3d4" in revoked
    clock.now += 10**9
    assert revoked.expired() == [] and "c3d4" in revoked


def test_a_repeat_leaves_the_first_record_as_it_is() -> None:
    clock = Clock()
    revoked = RevokedTokens(clock)
    first = revoked.revoke("ab", expires_s=2_000_000)
    clock.now += 5
    assert revoked.revoke("ab", 3_000_000) == first  # not written yet: write it (again)
    revoked.saved("ab")
    for expires_s in (1_500_000, 3_000_000, 0):  # an id names one token: nothing to write
        assert revoked.revoke("ab", expires_s) is None
    assert revoked.listed() == [first]


@pytest.mark.parametrize("token_id", ["", "a" * 65, "a.b", "id with space", "a\0b", "é"])
def test_malformed_ids_and_negative_expiries_are_refused(token_id: str) -> None:
    revoked = RevokedTokens(Clock())
    with pytest.raises(InvalidArgumentError, match="token id"):
        revoked.revoke(token_id, 0)
    with pytest.raises(InvalidArgumentError, match="expires_s"):
        revoked.revoke("ok", -1)
    assert len(revoked) == 0


def test_the_number_of_records_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(revocations, "MAX_REVOKED", 3)
    revoked = RevokedTokens(Clock())
    for n in range(3):
        revoked.revoke(f"t{n}", 0)
        revoked.saved(f"t{n}")
    with pytest.raises(InvalidArgumentError, match="rotate the cluster key"):
        revoked.revoke("t3", 0)
    assert revoked.revoke("t0", 0) is None  # a repeat is still answered


def test_records_read_back_are_refused_and_listed_in_revocation_order() -> None:
    revoked = RevokedTokens(Clock())
    revoked.load([Revocation("late", 0, 20.0), Revocation("early", 5, 10.0)])
    assert [r.token_id for r in revoked.listed()] == ["early", "late"]
    assert "late" in revoked and "early" in revoked
    assert revoked.revoke("late", 0) is None  # recorded already: nothing to write


def test_access_control_refuses_a_revoked_genuine_token_and_only_it() -> None:
    authority = TokenAuthority(b"k" * 32)
    access = AccessControl(authority)
    leaked = authority.issue(Role.CLIENT, "alpha", ttl_s=3600)
    kept = authority.issue(Role.CLIENT, "alpha", ttl_s=3600)
    assert access.authenticate(leaked).tenant == "alpha"  # its claims are cached now
    access.revoked.revoke(parse_claims(leaked).token_id, parse_claims(leaked).expires_s)
    with pytest.raises(AccessDeniedError, match="revoked"):
        access.authenticate(leaked)
    assert access.denied == 1
    assert access.authenticate(kept).tenant == "alpha"


def test_the_cli_prints_any_expiry_it_is_shown() -> None:
    from mooncake_store.admin.tokens import _when

    assert _when(0) == "1970-01-01 00:00:00 UTC"
    assert "Unix seconds" in _when(2**63 - 1)  # past what gmtime takes: printed as is
