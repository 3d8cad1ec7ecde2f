"""Object keys: what a valid key is (checked by the client and again by the master)."""

from __future__ import annotations

from mooncake_store.common.errors import InvalidKeyError

MAX_KEY_BYTES = 1024


def validate_key(key: object) -> str:
    """Return `key` if it is a non-empty str of at most MAX_KEY_BYTES in UTF-8.

    Raises:
        InvalidKeyError: with a message that says how to fix the key.
    """
    if not isinstance(key, str):
        raise InvalidKeyError(f"key must be a str, got {type(key).__name__}")
    if not key:
        raise InvalidKeyError("key must not be empty")
    if len(key) > MAX_KEY_BYTES // 4:
        size = len(key.encode("utf-8", "surrogatepass"))
        if size > MAX_KEY_BYTES:
            raise InvalidKeyError(
                f"key is {size} bytes in UTF-8; the limit is {MAX_KEY_BYTES}: "
                "hash long names into a fixed-size key"
            )
    return key
