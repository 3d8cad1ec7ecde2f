"""Tokens revoked one by one (pure, no I/O; the clock is injected).

A token is valid by its signature alone (common/auth.py), so a leaked one would otherwise stay
good until it expires or the cluster key is rotated (which revokes every token).  An admin
revokes one (`mooncake-admin token revoke`) by the token itself, which the master verifies, or
by its id alone: the master records it in RocksDB (`t/<id>`, the verified token's expiry as the
value; 0 for an id alone) and from then on refuses the token on every entry point: a gRPC call
carries its token each time and is checked each time; a framed connection authenticated with
it is closed, and its Authenticate again is refused.  A record is kept until the token would
have expired anyway (for good when its expiry is 0: a token that never expires, or an id).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from mooncake_store.common.errors import InvalidArgumentError

# The ids tokens carry (common/auth.py `issue`: 8 random bytes as hex); longer ones are allowed
# for ids issued by other tools, within a bound.
TOKEN_ID = re.compile(r"[0-9a-zA-Z_-]{1,64}")
MAX_REVOKED = 100_000  # records held in memory; more is refused (revoke the cluster key then)


@dataclass(frozen=True, slots=True)
class Revocation:
    token_id: str
    expires_s: int  # the token's expiry, Unix seconds; 0: it never expires
    revoked_s: float  # when it was revoked, Unix seconds


def validate_token_id(token_id: str) -> str:
    if not isinstance(token_id, str) or not TOKEN_ID.fullmatch(token_id):
        raise InvalidArgumentError(
            f"a token id is 1-64 letters, digits, '-' or '_' (the token's `i` claim), got "
            f"{token_id!r}"
        )
    return token_id


class RevokedTokens:
    """The set of revoked token ids, with what each record needs to be dropped in time."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._revoked: dict[str, Revocation] = {}
        self._unsaved: set[str] = set()  # refused here, its record not written yet

    def __contains__(self, token_id: object) -> bool:
        return token_id in self._revoked

    def __len__(self) -> int:
        return len(self._revoked)

    def load(self, records: list[Revocation]) -> None:
        """The records read back at start (RocksDB `t/`)."""
        for record in records:
            self._revoked[record.token_id] = record

    def revoke(self, token_id: str, expires_s: int) -> Revocation | None:
        """Revoke `token_id`, a token that expires at `expires_s` (0: never, or not known:
        kept until the cluster key is rotated; the caller passes only a verified token's
        expiry).  The record to write (then `saved`), or None when it was revoked and
        recorded already (the first record stays as it is: an id names one token; one whose
        write failed is returned again, to be written again).

        Raises:
            InvalidArgumentError: a malformed id, a negative expiry, or too many records.
        """
        validate_token_id(token_id)
        if expires_s < 0:
            raise InvalidArgumentError(f"expires_s must be >= 0 (0: never), got {expires_s}")
        known = self._revoked.get(token_id)
        if known is not None:
            return known if token_id in self._unsaved else None
        if len(self._revoked) >= MAX_REVOKED:
            raise InvalidArgumentError(
                f"{MAX_REVOKED} tokens are revoked already: rotate the cluster key instead "
                "(it revokes every token at once)"
            )
        record = Revocation(token_id, expires_s, self._clock())
        self._revoked[token_id] = record
        self._unsaved.add(token_id)
        return record

    def saved(self, token_id: str) -> None:
        """`token_id`'s record is written (durable from now on)."""
        self._unsaved.discard(token_id)

    def expired(self) -> list[str]:
        """Drop the records of tokens that have expired since (they are refused as expired
        now); the ids dropped, whose records the caller deletes."""
        now = self._clock()
        gone = [t for t, r in self._revoked.items() if r.expires_s and r.expires_s <= now]
        for token_id in gone:
            del self._revoked[token_id]
            self._unsaved.discard(token_id)
        return gone

    def listed(self) -> list[Revocation]:
        return sorted(self._revoked.values(), key=lambda r: (r.revoked_s, r.token_id))
