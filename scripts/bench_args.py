"""Argument types the benchmark scripts share (argparse `type=`): one-line errors, no
tracebacks, for sizes and counts a run cannot use."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mooncake_store.common.units import parse_size


def sizes_arg(text: str) -> list[int]:
    """`--sizes`: a comma-separated list of sizes (1M, 64K, 4MiB, ...), each above 0."""
    try:
        sizes = [parse_size(part) for part in text.split(",")]
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if any(size <= 0 for size in sizes):
        raise argparse.ArgumentTypeError(f"every size must be above 0: {text!r}")
    return sizes


def positive(text: str) -> int:
    """A count of 1 or more."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {text}")
    return value
