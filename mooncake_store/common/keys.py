"""Object keys: what a valid key is (checked by the client and again by the master)."""

from __future__ import annotations

from mooncake_store.common.errors import InvalidKeyError

MAX_KEY_BYTES = 1024
# The master stores a tenant's keys as `tenant NUL key` (master/access.py): room for the prefix.
MAX_STORED_KEY_BYTES = MAX_KEY_BYTES + 65


def validate_key(key: object, *, stored: bool = False) -> str:
    """Return `key` if it is a non-empty str of at most MAX_KEY_BYTES in UTF-8 without NUL.

    `stored`: check a key as the master stores it (tenant-prefixed: NUL allowed, a longer cap).

    Raises:
        InvalidKeyError: with a message that says how to fix the key.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidKeyError("key must not be empty")
    limit = MAX_STORED_KEY_BYTES if stored else MAX_KEY_BYTES
    if len(key) > MAX_KEY_BYTES // 4:
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > limit:
            raise InvalidKeyError(
                f"key is {size} bytes in UTF-8; the limit is {MAX_KEY_BYTES}: "
                "hash long names into a fixed-size key"
            )
    if not stored and "\0" in key:
        raise InvalidKeyError("key must not contain NUL (U+0000)")
    return key
