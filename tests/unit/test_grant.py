"""Signed grants: round trip, tampering, coverage."""

from mooncake_store.common.grant import GRANT_BYTES, Grant, GrantMode, sign_grant, verify_grant

SECRET = b"s" * 32


def test_round_trip_and_tampering():
    grant = Grant(7, 4096, 100, 123456, GrantMode.READ)
    blob = sign_grant(SECRET, grant)
    assert len(blob) == GRANT_BYTES
    assert verify_grant(SECRET, blob) == grant
    assert verify_grant(b"x" * 32, blob) is None
    forged = bytearray(blob)
    forged[9] ^= 1  # move the offset
    assert verify_grant(SECRET, bytes(forged)) is None
    assert verify_grant(SECRET, blob[:-1]) is None


def test_covers_checks_extent_and_mode():
    grant = Grant(1, 1000, 100, 0, GrantMode.WRITE)
    assert grant.covers(1000, 100, GrantMode.WRITE)
    assert grant.covers(1050, 50, GrantMode.WRITE)
    assert not grant.covers(1050, 51, GrantMode.WRITE)
    assert not grant.covers(999, 10, GrantMode.WRITE)
    assert not grant.covers(1000, 10, GrantMode.READ)


def test_grant_generation_reads_the_put_generation_unverified():
    from mooncake_store.common.grant import grant_generation

    write = sign_grant(SECRET, Grant(7, 4096, 100, 123456, GrantMode.WRITE, 1_700_000_000_123))
    read = sign_grant(SECRET, Grant(7, 4096, 100, 999, GrantMode.READ, 1_700_000_000_123))
    assert grant_generation(write) == grant_generation(read) == 1_700_000_000_123
    assert verify_grant(SECRET, read).generation == 1_700_000_000_123  # type: ignore[union-attr]
    assert grant_generation(sign_grant(SECRET, Grant(7, 0, 1, 0, GrantMode.READ))) == 0
    # Unverified: a blob signed by another secret still reads (the client only compares).
    assert grant_generation(sign_grant(b"x" * 32, Grant(1, 0, 1, 0, GrantMode.READ, 42))) == 42
    assert grant_generation(b"") == 0 and grant_generation(write[:-1]) == 0
