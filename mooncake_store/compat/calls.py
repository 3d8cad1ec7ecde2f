"""How the Mooncake-compatible client turns SDK outcomes into Mooncake's return values.

`mooncake_call` wraps each public method: before setup() it returns the method's failure value
built from -600 (INVALID_PARAMS), and an exception becomes the failure value built from the
exception's Mooncake code (`codes.code_of`): a code, a list of codes, b"", None, ...
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from mooncake_store.client.types import PutResult
from mooncake_store.common.errors import InvalidArgumentError, MooncakeError
from mooncake_store.compat import codes

log = logging.getLogger("mooncake.compat")

F = TypeVar("F", bound=Callable[..., Any])


class _Store(Protocol):
    _client: Any


def mooncake_call(default: Callable[[tuple[Any, ...], int], Any]) -> Any:
    """Run the method with Mooncake's conventions: before setup, or on an exception, return
    what `default(args, code)` builds from the Mooncake code (-600 before setup)."""

    def wrap(method: F) -> F:
        @functools.wraps(method)
        def call(self: _Store, *args: Any, **kwargs: Any) -> Any:
            if self._client is None:
                return default(args, codes.INVALID_PARAMS)
            try:
                return method(self, *args, **kwargs)
            except Exception as exc:  # Mooncake's API reports failures as codes
                log.debug("%s failed: %s", method.__name__, exc)
                return default(args, codes.code_of(exc))

        return call  # type: ignore[return-value]

    return wrap


def fail_code(args: tuple[Any, ...], code: int) -> int:
    return code


def fail_codes(args: tuple[Any, ...], code: int) -> list[int]:
    """One code per item of the first argument (a batch's keys)."""
    return [code] * (len(args[0]) if args else 0)


def fail_empty(args: tuple[Any, ...], code: int) -> bytes:
    return b""


def fail_none(args: tuple[Any, ...], code: int) -> None:
    return None


def outcome(result: PutResult | MooncakeError | int | None) -> int:
    """0 / bytes read for a success, the Mooncake code for a failure."""
    if isinstance(result, MooncakeError):
        return codes.code_of(result)
    if isinstance(result, int):
        return result
    return codes.OK


def same_length(*sequences: Sequence[Any]) -> None:
    lengths = {len(s) for s in sequences}
    if len(lengths) > 1:
        raise InvalidArgumentError(f"argument lists differ in length: {sorted(lengths)}")
