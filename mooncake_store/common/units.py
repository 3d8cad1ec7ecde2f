"""Parsing of human-friendly sizes (`16GiB`, `512MB`) and durations (`30s`, `250ms`)."""

from __future__ import annotations

import re

from mooncake_store.common.errors import InvalidArgumentError

# Bare letters (4K, 16M, 1G) are binary, as in dd and most storage tools; "KB/MB/GB" are decimal.
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "k": 1024,
    "ki": 1024,
    "kib": 1024,
    "m": 1024**2,
    "mi": 1024**2,
    "mib": 1024**2,
    "g": 1024**3,
    "gi": 1024**3,
    "gib": 1024**3,
    "t": 1024**4,
    "ti": 1024**4,
    "tib": 1024**4,
}
_DURATION_UNITS = {
    "": 1.0,
    "s": 1.0,
    "ms": 1e-3,
    "us": 1e-6,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
}
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int) -> int:
    """Return a byte count from `1048576`, `"4MiB"`, `"64K"` (binary), `"1.5GB"` (decimal).

    Raises:
        InvalidArgumentError: the text is not a non-negative number with a known unit.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise InvalidArgumentError(f"size must be >= 0, got {value}")
        return value
    match = _NUMBER_UNIT.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise InvalidArgumentError(
            f"cannot read size {value!r}: use a number with an optional unit, like 512MiB or 1GiB"
        )
    return int(float(match.group(1)) * _SIZE_UNITS[unit])


def parse_duration(value: str | float | int) -> float:
    """Return seconds from `5`, `"30s"`, `"250ms"`, `"2min"`.

    Raises:
        InvalidArgumentError: the text is not a non-negative number with a known unit.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise InvalidArgumentError(f"duration must be >= 0, got {value}")
        return float(value)
    match = _NUMBER_UNIT.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _DURATION_UNITS:
        raise InvalidArgumentError(
            f"cannot read duration {value!r}: use a number with an optional unit, like 30s or 250ms"
        )
    return float(match.group(1)) * _DURATION_UNITS[unit]


def format_size(size_bytes: int) -> str:
    """Format a byte count with a binary unit: 4194304 -> '4.0 MiB'."""
    value = float(size_bytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
