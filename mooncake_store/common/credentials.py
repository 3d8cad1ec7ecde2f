"""Where clients, nodes and admins find their token, in one order.

1. the token passed explicitly (`Client(master, token=...)`, a node's `--token-file`);
2. `MOONCAKE_TOKEN` (the token itself), then `MOONCAKE_TOKEN_FILE` (a file holding it);
3. on the master's host: the *local token file* the master writes at every start,
   `$MOONCAKE_TOKEN_DIR/master-<port>.json` (default `~/.config/mooncake/`), mode 0600 in a
   0700 directory, so only the master's uid reads it.  It holds a client token (tenant
   `default`), a node token (any node id) and an admin token.  It is used only when the master
   address is a loopback address, `localhost` or this host's name; the master deletes it when
   it stops.

A process that runs as the master's uid can read the master's data directory (and its cluster
key) anyway, so the local file gives it nothing it could not take; it only saves the flags.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import socket
from pathlib import Path

from mooncake_store.common.auth import ANY_NODE, Role, TokenAuthority

TOKEN_ENV = "MOONCAKE_TOKEN"
TOKEN_FILE_ENV = "MOONCAKE_TOKEN_FILE"
TOKEN_DIR_ENV = "MOONCAKE_TOKEN_DIR"
LOCAL_TOKEN_TTL_S = 30 * 86400.0


def token_dir() -> Path:
    """The directory of local token files."""
    configured = os.environ.get(TOKEN_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".config" / "mooncake"


def local_token_path(port: int) -> Path:
    return token_dir() / f"master-{port}.json"


def write_local_tokens(authority: TokenAuthority, host: str, port: int, data_dir: str) -> Path:
    """Write the master's local token file (0600, replaced atomically); its path."""
    directory = token_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    tokens = {
        "master": f"{host}:{port}",
        "data_dir": str(Path(data_dir).resolve()),
        "client": authority.issue(Role.CLIENT, "default", ttl_s=LOCAL_TOKEN_TTL_S),
        # Never expires: a node whose token expired is refused its heartbeats, dropped, and
        # every object only it held is deleted.  The file is rewritten (new token ids) at every
        # master start and deleted at stop.
        "node": authority.issue(Role.NODE, "default", ttl_s=0, node_id=ANY_NODE),
        "admin": authority.issue(Role.ADMIN, "default", ttl_s=LOCAL_TOKEN_TTL_S),
    }
    path = local_token_path(port)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(tokens, f, indent=1)
    os.replace(tmp, path)
    return path


def remove_local_tokens(port: int, data_dir: str) -> None:
    """Delete the local token file of `port` if it is still this master's."""
    path = local_token_path(port)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("data_dir") == str(Path(data_dir).resolve()):
            path.unlink()


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_local(host: str) -> bool:
    return host in ("", socket.gethostname()) or is_loopback(host)


def discover_token(master: str, role: Role) -> str:
    """The token for `role` from the environment or the local token file ("" if none).

    Order: MOONCAKE_TOKEN, MOONCAKE_TOKEN_FILE, then the master's local token file.
    """
    token = os.environ.get(TOKEN_ENV, "").strip()
    if token:
        return token
    file = os.environ.get(TOKEN_FILE_ENV)
    if file:
        return read_token_file(file)
    host, sep, port = master.rpartition(":")
    if not sep or not port.isdigit() or not _is_local(host):
        return ""
    try:
        tokens = json.loads(local_token_path(int(port)).read_text())
    except (OSError, ValueError):
        return ""
    value = tokens.get(role.value, "") if isinstance(tokens, dict) else ""
    return value if isinstance(value, str) else ""


def read_token_file(path: str | os.PathLike[str]) -> str:
    """The token in a file (surrounding whitespace ignored).

    Raises:
        InvalidArgumentError: the file cannot be read or is empty.
    """
    from mooncake_store.common.errors import InvalidArgumentError

    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the token file {path}: {exc}") from exc
    if not token:
        raise InvalidArgumentError(f"the token file {path} is empty")
    return token
