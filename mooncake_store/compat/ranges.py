"""Get sessions and ranged reads of the Mooncake-compatible client (SGLang's direct linker).

`batch_get_session_start(keys)` opens an SDK `ReadSession` (client/ranges.py): the objects are
leased until `batch_get_session_end(keys)`, and each ranged read copies only the requested
bytes, verified (same host: the touched chunks re-hashed in place against digests that were
checked against the stored checksum; TCP: copied from the object fetched once, verified
whole).  A ranged read of keys outside any session opens a session for them and closes it
after the read.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from mooncake_store.client.ranges import ReadSession
from mooncake_store.client.sync_client import Client
from mooncake_store.common.errors import MooncakeError
from mooncake_store.compat import codes


class Sessions:
    """The open read sessions of one store, by key."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._by_key: dict[str, ReadSession] = {}
        self._lock = threading.Lock()

    def start(self, keys: Sequence[str]) -> list[int]:
        session = self._client.read_session(keys)
        with self._lock:
            for key in keys:
                self._by_key[key] = session
        return [codes.code_of(e) if (e := session.error(k)) else codes.OK for k in keys]

    def end(self, keys: Sequence[str]) -> list[int]:
        with self._lock:
            sessions = {id(s): s for k in keys if (s := self._by_key.pop(k, None)) is not None}
            still_open = {id(s) for s in self._by_key.values()}
        for sid, session in sessions.items():
            if sid not in still_open:
                session.close()
        return [codes.OK] * len(keys)

    def read(self, reads: list[tuple[str, list[tuple[Any, int]]]]) -> list[list[int]]:
        """Per key, per (buffer, object offset) range: the bytes copied or a code."""
        with self._lock:
            known = {key: self._by_key.get(key) for key, _ in reads}
        missing = [k for k, s in known.items() if s is None or s.closed]
        adhoc = self._client.read_session(missing) if missing else None
        groups: dict[int, tuple[ReadSession, list[int]]] = {}
        for n, (key, _) in enumerate(reads):
            session = known.get(key)
            if session is None or session.closed:
                assert adhoc is not None
                session = adhoc
            groups.setdefault(id(session), (session, []))[1].append(n)
        out: list[list[int]] = [[] for _ in reads]
        try:
            for session, items in groups.values():
                results = self._client.get_ranges_into(session, [reads[n] for n in items])
                for n, per_range in zip(items, results, strict=True):
                    out[n] = [
                        codes.code_of(r) if isinstance(r, MooncakeError) else r for r in per_range
                    ]
        finally:
            if adhoc is not None:
                adhoc.close()
        return out

    def close_all(self) -> None:
        with self._lock:
            sessions, self._by_key = list(self._by_key.values()), {}
        for session in sessions:
            session.close()
