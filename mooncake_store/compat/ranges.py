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
from mooncake_store.compat.buffers import Buffers
from mooncake_store.compat.calls import fail_codes, mooncake_call, same_length


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


class RangeMethods:
    """The get-session and ranged-read methods of MooncakeDistributedStore (a mixin)."""

    _client: Client | None
    _sessions: Sessions | None
    _buffers: Buffers

    def _parts(self, ptrs: Sequence[int], sizes: Sequence[int]) -> list[Any]:
        same_length(ptrs, sizes)
        return [self._buffers.view(p, s) for p, s in zip(ptrs, sizes, strict=True)]

    @mooncake_call(fail_codes)
    def batch_get_session_start(self, keys: Sequence[str]) -> list[int]:
        """Lease `keys` for ranged reads until batch_get_session_end(keys); 0 per key or a
        code (-704 for a missing key)."""
        assert self._sessions is not None
        return self._sessions.start(keys)

    @mooncake_call(fail_codes)
    def batch_get_session_end(self, keys: Sequence[str]) -> list[int]:
        assert self._sessions is not None
        return self._sessions.end(keys)

    @mooncake_call(fail_codes)
    def batch_get_into_multi_buffer_ranges(
        self,
        keys: Sequence[str],
        all_buffer_ptrs: Sequence[Sequence[int]],
        all_sizes: Sequence[Sequence[int]],
        all_src_offsets: Sequence[Sequence[int]],
    ) -> list[int]:
        """Per key, copy [offset, offset + size) of the object into each (ptr, size); the
        bytes copied per key (the sum of its sizes) or a code."""
        assert self._sessions is not None
        same_length(keys, all_buffer_ptrs, all_sizes, all_src_offsets)
        reads = []
        for key, ptrs, sizes, offsets in zip(
            keys, all_buffer_ptrs, all_sizes, all_src_offsets, strict=True
        ):
            same_length(ptrs, sizes, offsets)
            reads.append((key, list(zip(self._parts(ptrs, sizes), offsets, strict=True))))
        out = []
        for per_range in self._sessions.read(reads):
            failed = [x for x in per_range if x < 0]
            out.append(failed[0] if failed else sum(per_range))
        return out

    @mooncake_call(fail_codes)
    def get_into_ranges(
        self,
        buffer_ptrs: Sequence[int],
        all_keys: Sequence[Sequence[str]],
        all_dst_offsets: Sequence[Sequence[Sequence[int]]],
        all_src_offsets: Sequence[Sequence[Sequence[int]]],
        all_sizes: Sequence[Sequence[Sequence[int]]],
    ) -> list[list[list[int]]]:
        """For each destination buffer, for each of its keys, copy ranges of the object
        (src offset, size) to (buffer + dst offset); the bytes of each range or a code."""
        assert self._sessions is not None
        same_length(buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes)
        reads, shape = [], []
        for ptr, keys, dsts, srcs, sizes in zip(
            buffer_ptrs, all_keys, all_dst_offsets, all_src_offsets, all_sizes, strict=True
        ):
            same_length(keys, dsts, srcs, sizes)
            shape.append(len(keys))
            for key, dst, src, size in zip(keys, dsts, srcs, sizes, strict=True):
                same_length(dst, src, size)
                views = [self._buffers.view(ptr + d, s) for d, s in zip(dst, size, strict=True)]
                reads.append((key, list(zip(views, src, strict=True))))
        flat = self._sessions.read(reads)
        out, at = [], 0
        for count in shape:
            out.append(flat[at : at + count])
            at += count
        return out
