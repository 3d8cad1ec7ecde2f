"""Canonical CBOR (RFC 8949 §4.2.1 / RFC 7049 §3.9) for the values block hashes cover.

vLLM's `sha256_cbor` hashes `cbor2.dumps(obj, canonical=True)`; this is an independent encoder
for the subset a block hash needs (ints, byte and text strings, arrays, maps, None, bools,
floats), byte-identical to cbor2's canonical output, so the store does not depend on cbor2.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping

from mooncake_store.common.errors import InvalidArgumentError


def _head(major: int, value: int) -> bytes:
    if value < 24:
        return bytes([major << 5 | value])
    if value < 1 << 8:
        return bytes([major << 5 | 24, value])
    if value < 1 << 16:
        return bytes([major << 5 | 25]) + value.to_bytes(2, "big")
    if value < 1 << 32:
        return bytes([major << 5 | 26]) + value.to_bytes(4, "big")
    return bytes([major << 5 | 27]) + value.to_bytes(8, "big")


def _float(value: float) -> bytes:
    if math.isnan(value):
        return b"\xf9\x7e\x00"
    for fmt, prefix in (("e", b"\xf9"), ("f", b"\xfa")):
        try:
            packed = struct.pack(">" + fmt, value)
        except OverflowError:
            continue
        if struct.unpack(">" + fmt, packed)[0] == value:
            return prefix + packed
    return b"\xfb" + struct.pack(">d", value)


def dumps(value: object) -> bytes:
    """Encode `value` as canonical CBOR.

    Raises:
        InvalidArgumentError: a type outside the supported subset, or an int beyond 64 bits.
    """
    out = bytearray()
    _encode(value, out)
    return bytes(out)


def _encode(value: object, out: bytearray) -> None:
    if value is None:
        out += b"\xf6"
    elif value is True:
        out += b"\xf5"
    elif value is False:
        out += b"\xf4"
    elif isinstance(value, int):
        if 0 <= value < 1 << 64:
            out += _head(0, value)
        elif -(1 << 64) <= value < 0:
            out += _head(1, -1 - value)
        else:
            raise InvalidArgumentError(f"integer {value} does not fit in 64 bits")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        out += _head(2, len(data)) + data
    elif isinstance(value, str):
        data = value.encode("utf-8")
        out += _head(3, len(data)) + data
    elif isinstance(value, float):
        out += _float(value)
    elif isinstance(value, (list, tuple)):
        out += _head(4, len(value))
        for item in value:
            _encode(item, out)
    elif isinstance(value, Mapping):
        items = sorted(((dumps(k), dumps(v)) for k, v in value.items()),
                       key=lambda kv: (len(kv[0]), kv[0]))  # fmt: skip
        out += _head(5, len(items))
        for k, v in items:
            out += k + v
    else:
        raise InvalidArgumentError(
            f"cannot hash a {type(value).__name__}: use ints, str, bytes, tuples or dicts"
        )
