"""The one config loader: defaults < config file (TOML) < `MOONCAKE_*` env < CLI flags.

Each daemon has a frozen dataclass of its settings (`MasterConfig`, `NodeConfig`) that validates
itself in `__post_init__`.  Fields whose metadata says `kind="size"` accept `16GiB`, fields with
`kind="duration"` accept `30s`.  Configs are built once at start-up and passed down.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.units import parse_duration, parse_size

C = TypeVar("C")


def size_field(default: int) -> Any:
    return dataclasses.field(default=default, metadata={"kind": "size"})


def duration_field(default: float) -> Any:
    return dataclasses.field(default=default, metadata={"kind": "duration"})


def _coerce(field: dataclasses.Field[Any], raw: Any, source: str) -> Any:
    kind = field.metadata.get("kind")
    try:
        if kind == "size":
            return parse_size(raw)
        if kind == "duration":
            return parse_duration(raw)
        default = field.default
        if isinstance(default, bool):
            if isinstance(raw, bool):
                return raw
            text = str(raw).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {raw!r}")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        return raw if raw is None else str(raw)
    except (ValueError, InvalidArgumentError) as exc:
        raise InvalidArgumentError(f"bad value for {field.name!r} from {source}: {exc}") from exc


def load_config(
    cls: type[C],
    *,
    env_prefix: str,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Build `cls` from defaults, then a TOML file, then `{env_prefix}{FIELD}` env, then overrides.

    `overrides` (CLI flags) whose value is None are ignored, so unset flags do not win.

    Raises:
        InvalidArgumentError: unknown key in the file, or a value that cannot be read.
    """
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read config file {path}: {exc}") from exc
        for name, raw in data.items():
            key = name.replace("-", "_")
            if key not in fields:
                known = ", ".join(sorted(fields))
                raise InvalidArgumentError(f"unknown setting {name!r} in {path}; known: {known}")
            values[key] = _coerce(fields[key], raw, str(path))
    env = os.environ if environ is None else environ
    for name, field in fields.items():
        env_name = env_prefix + name.upper()
        if env_name in env:
            values[name] = _coerce(field, env[env_name], f"${env_name}")
    for name, raw in (overrides or {}).items():
        if raw is not None:
            values[name] = _coerce(fields[name], raw, f"--{name.replace('_', '-')}")
    return cls(**values)
