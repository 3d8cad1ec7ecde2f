"""The one config loader: defaults < config file (TOML) < `MOONCAKE_*` env < CLI flags.

Each daemon has one frozen dataclass of its settings (`MasterConfig`, `NodeConfig`) that
validates itself in `__post_init__` and is passed down whole.  Every field is a *setting* with
one public name used everywhere: the flag (`--dram`), the TOML key (`dram`, or `dram-...` with
hyphens) and the env variable (`MOONCAKE_NODE_DRAM`).  The public name is the field name, less
the unit suffix `_s` of a duration, unless the field says otherwise (`flag=`); the field name
itself still works in a file or the environment, with a deprecation warning.

Fields whose metadata says `kind="size"` accept `16GiB`, `kind="duration"` accept `30s`.
`config_options` turns the dataclass into click options (help text and default from the field),
so a setting cannot exist in one place and not in another.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import os
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import click

from mooncake_store.common.errors import InvalidArgumentError
from mooncake_store.common.tls import TlsConfig
from mooncake_store.common.units import parse_duration, parse_size

C = TypeVar("C")
F = TypeVar("F", bound=Callable[..., Any])

log = logging.getLogger("mooncake.config")

# Env prefixes of the daemons' settings, and MOONCAKE_* variables read elsewhere.  Any other
# MOONCAKE_* variable is reported as unknown (a typo would otherwise be ignored silently).
DAEMON_ENV_PREFIXES = ("MOONCAKE_MASTER_", "MOONCAKE_NODE_")
OTHER_ENV_VARS = {
    "MOONCAKE_EVENT_LOOP",
    "MOONCAKE_DISABLE_GPU",
    "MOONCAKE_TOKEN",
    "MOONCAKE_TOKEN_FILE",
    "MOONCAKE_TOKEN_DIR",
    "MOONCAKE_ADMIN_MASTER",
    "MOONCAKE_CLUSTER_KEY",
    "MOONCAKE_CLUSTER_KEY_FILE",
    "MOONCAKE_TLS_CA",
    "MOONCAKE_TLS_CERT",
    "MOONCAKE_TLS_KEY",
}


def setting(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    flag: str | None = None,
    choices: tuple[str, ...] | None = None,
) -> Any:
    """A config field: its default, its help text, and optionally its unit kind and public name."""
    metadata = {"help": help, "kind": kind, "flag": flag, "choices": choices}
    return dataclasses.field(default=default, metadata=metadata)


def size_field(default: int, help: str = "", *, flag: str | None = None) -> Any:
    return setting(default, help, kind="size", flag=flag)


def duration_field(default: float, help: str = "", *, flag: str | None = None) -> Any:
    return setting(default, help, kind="duration", flag=flag)


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """The TLS settings both daemons take (PEM paths, common/tls.py): cert + key serve TLS on
    every TCP listener of the daemon; a base of MasterConfig and NodeConfig."""

    tls_cert: str = setting(
        "", "PEM certificate chain: serve TLS on every TCP listener (off: unset)."
    )
    tls_key: str = setting("", "PEM private key of --tls-cert.")
    tls_ca: str = setting(
        "",
        "PEM CA that signed the cluster's certificates: peers are verified against it, and "
        "clients must present a certificate it signed.",
    )
    tls_require_client_cert: bool = setting(
        True, "With --tls-ca: refuse clients without a certificate."
    )

    @property
    def tls(self) -> TlsConfig:
        return TlsConfig(self.tls_cert, self.tls_key, self.tls_ca, self.tls_require_client_cert)


def public_name(field: dataclasses.Field[Any]) -> str:
    """The name of a setting as flag, TOML key and env variable (underscored: `lease_ttl`)."""
    flag = field.metadata.get("flag")
    if flag:
        return str(flag).replace("-", "_")
    if field.metadata.get("kind") == "duration" and field.name.endswith("_s"):
        return field.name[: -len("_s")]
    return field.name


def flag_name(field: dataclasses.Field[Any]) -> str:
    return "--" + public_name(field).replace("_", "-")


def flag_for(cls: type, field_name: str) -> str:
    """The command-line flag of `cls`'s field `field_name`, for error messages."""
    for f in dataclasses.fields(cls):
        if f.name == field_name:
            return flag_name(f)
    raise KeyError(field_name)


def format_default(field: dataclasses.Field[Any]) -> str:
    value = field.default
    kind = field.metadata.get("kind")
    if kind == "size" and isinstance(value, int):
        for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if value and value % scale == 0:
                return f"{value // scale}{unit}"
        return str(value)
    if kind == "duration" and isinstance(value, (int, float)):
        if value and value < 1:
            return f"{value * 1000:g}ms"
        return f"{value:g}s"
    if isinstance(value, bool):
        return "on" if value else "off"
    if value == "":
        return "unset"
    return str(value)


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
            raise ValueError(f"not a boolean: {raw!r} (use true or false)")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float):
            return float(raw)
        value = raw if raw is None else str(raw)
        choices = field.metadata.get("choices")
        if choices and value not in choices:
            raise ValueError(f"{value!r} is not one of {', '.join(choices)}")
        return value
    except (ValueError, TypeError, InvalidArgumentError) as exc:
        raise InvalidArgumentError(f"bad value for {source}: {exc}") from exc


def _names(cls: type) -> tuple[dict[str, dataclasses.Field[Any]], dict[str, str]]:
    """(public name -> field, deprecated field name -> public name) of `cls`."""
    public: dict[str, dataclasses.Field[Any]] = {}
    old: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        name = public_name(f)
        public[name] = f
        if f.name != name:
            old[f.name] = name
    return public, old


def unknown_env_warnings(env_prefix: str, known: set[str], env: Mapping[str, str]) -> list[str]:
    """Warnings for MOONCAKE_* variables that nothing reads (typos)."""
    warnings = []
    for var in sorted(env):
        if not var.startswith("MOONCAKE_") or var in OTHER_ENV_VARS:
            continue
        if var.startswith(env_prefix):
            if var[len(env_prefix) :].lower() in known:
                continue
            candidates = [env_prefix + k.upper() for k in sorted(known)]
        elif any(var.startswith(p) for p in DAEMON_ENV_PREFIXES):
            continue  # the other daemon's setting: not ours to judge
        else:
            candidates = [p + "..." for p in DAEMON_ENV_PREFIXES] + sorted(OTHER_ENV_VARS)
        close = difflib.get_close_matches(var, candidates, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        warnings.append(f"ignoring unknown environment variable {var}{hint}")
    return warnings


def load_config(
    cls: type[C],
    *,
    env_prefix: str,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> C:
    """Build `cls` from defaults, then a TOML file, then `{env_prefix}{NAME}` env, then overrides.

    `overrides` (CLI flags, keyed by field name) whose value is None are ignored, so unset flags
    do not win.  Old names (the field name where it differs from the public name) are accepted in
    a file and in the environment with a warning; unknown `MOONCAKE_*` variables are warned about.

    Raises:
        InvalidArgumentError: unknown key in the file, or a value that cannot be read.
    """
    public, old = _names(cls)
    by_field = {f.name: f for f in public.values()}
    values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise InvalidArgumentError(f"cannot read config file {path}: {exc}") from exc
        for key, raw in data.items():
            name = key.replace("-", "_")
            if name in old:
                log.warning("%s: setting %r is deprecated, write %r", path, key, old[name])
                name = old[name]
            if name not in public:
                close = difflib.get_close_matches(name, list(public), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise InvalidArgumentError(
                    f"unknown setting {key!r} in {path}{hint}; known: {', '.join(sorted(public))}"
                )
            field = public[name]
            values[field.name] = _coerce(field, raw, f"{name!r} in {path}")
    env = os.environ if environ is None else environ
    for warning in unknown_env_warnings(env_prefix, set(public) | set(old), env):
        log.warning("%s", warning)
    for old_name, name in old.items():
        var = env_prefix + old_name.upper()
        if var in env and env_prefix + name.upper() not in env:
            log.warning("$%s is deprecated, set $%s", var, env_prefix + name.upper())
            values[public[name].name] = _coerce(public[name], env[var], f"${var}")
    for name, field in public.items():
        var = env_prefix + name.upper()
        if var in env:
            values[field.name] = _coerce(field, env[var], f"${var}")
    for field_name, raw in (overrides or {}).items():
        if raw is not None:
            field = by_field[field_name]
            values[field_name] = _coerce(field, raw, flag_name(field))
    return cls(**values)


def config_options(cls: type, env_prefix: str) -> Callable[[F], F]:
    """Click options for every field of `cls` not already declared on the command.

    Each option is `--<public name>` with the field's help text, its default and its env
    variable, and passes the raw value (or None when unset) under the field's name, for
    `load_config(overrides=...)`.  Put it right under `@click.command`.
    """

    def decorate(func: F) -> F:
        declared = {p.name for p in getattr(func, "__click_params__", [])}
        for field in reversed(dataclasses.fields(cls)):
            if field.name in declared:
                continue
            flag = flag_name(field)
            env_var = env_prefix + public_name(field).upper()
            help_text = field.metadata.get("help") or field.name.replace("_", " ")
            help_text = f"{help_text} [default: {format_default(field)}; env {env_var}]"
            kwargs: dict[str, Any] = {"default": None, "help": help_text}
            if isinstance(field.default, bool):
                flag = f"{flag}/--no-{flag[2:]}"
            elif field.metadata.get("choices"):
                kwargs["type"] = click.Choice(field.metadata["choices"])
            elif field.metadata.get("kind") in ("size", "duration"):
                kwargs["metavar"] = str(field.metadata["kind"]).upper()
            elif isinstance(field.default, int):
                kwargs["type"] = click.INT
            elif isinstance(field.default, float):
                kwargs["type"] = click.FLOAT
            func = click.option(flag, field.name, **kwargs)(func)
        return func

    return decorate
