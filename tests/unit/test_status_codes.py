"""proto's StatusCode enum and common/errors.py's codes are one table."""

from __future__ import annotations

import inspect
import re

import mooncake_store.common.errors as errors
from mooncake_store._proto import mooncake_store_pb2 as pb


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Error")).upper()


def test_every_error_code_is_in_the_status_enum_and_back():
    classes = {
        cls.code: name
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.MooncakeError)
    }
    enum = {v.number: v.name for v in pb.DESCRIPTOR.enum_types_by_name["StatusCode"].values}
    assert enum.pop(errors.OK) == "STATUS_OK"
    assert set(enum) == set(classes), set(enum) ^ set(classes)
    for code, name in classes.items():
        expected = "STATUS_UNKNOWN" if name == "MooncakeError" else "STATUS_" + snake(name)
        assert enum[code] == expected, (code, name)
