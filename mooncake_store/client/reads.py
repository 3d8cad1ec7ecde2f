"""The read side of the client's operations, as flows (see `steps`): get, get_into, their batch
and prefix forms.  A read asks the master for replica lists (which grant read leases), copies
from the closest replica (a mapped same-host pool first) and verifies the checksum, falling back
to the next replica on any failure, and once to fresh replica lists when a grant expired.

A read's destination is a list of parts (one part for a plain get_into): a scatter-gather read
(`get_many_into_parts`, Mooncake's multi-buffer gets) scatters the object over them straight
from the pool or the TCP reply, verified as one object, with no staging buffer.

A host-buffer read whose every key the client remembers in a pool mapped here (it put or read
them) is speculative: the copy runs while the lookup is on its way, and is kept only if the
reply confirms the extent holds the same put's object (the rule: speculative.py); otherwise
the read goes on from the reply in hand.  A failed read leaves its buffers' contents
unspecified.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

import numpy as np

from mooncake_store.client.device import (
    DeviceParts,
    DeviceTarget,
    HostStaging,
    PinnedStaging,
    device_target,
)
from mooncake_store.client.master_client import (
    MasterCall,
    get_prefix_call,
    get_replica_list_call,
    prefix_match_call,
    report_corrupt_call,
)
from mooncake_store.client.recv_pipeline import PipelinedReceive
from mooncake_store.client.speculative import SpeculativeReads
from mooncake_store.client.steps import (
    Flow,
    MapPools,
    Transfer,
    Transfers,
    as_writable,
    checksum,
    copy_out_checksum,
    trim_parts,
)
from mooncake_store.client.transport import Hasher
from mooncake_store.client.types import PrefixRead, ReplicaList, ReplicaLocation
from mooncake_store.common.errors import (
    BufferTooSmallError,
    ChecksumMismatchError,
    DataPathError,
    GrantExpiredError,
    InvalidArgumentError,
    MooncakeError,
    ObjectNotFoundError,
    ReplicaUnavailableError,
)
from mooncake_store.common.keys import validate_key
from mooncake_store.common.wire import Op


class ReadFlows(SpeculativeReads):
    """Read operations (a mixin of ClientFlows, flows.py: the state is its)."""

    counters: dict[str, int]
    _pinned: PinnedStaging
    _staging: HostStaging

    def get_many_flow(self, keys: Sequence[str], fingerprint: bytes) -> Flow[list[bytes]]:
        keys = [validate_key(k) for k in keys]
        infos = self._checked(keys, (yield get_replica_list_call(keys, fingerprint)))
        out: list[bytes | None] = list(map(self._take_local, keys, infos))
        remote = [n for n, data in enumerate(out) if data is None]
        if remote:
            # Read through warm staging buffers, then one copy into the new bytes.
            staging = [self._staging.take(infos[n].size_bytes) for n in remote]
            try:
                views = [
                    memoryview(b)[: infos[n].size_bytes]
                    for n, b in zip(remote, staging, strict=True)
                ]
                yield from self._read_all(
                    [keys[n] for n in remote], [infos[n] for n in remote],
                    [[v] for v in views], fingerprint,
                )  # fmt: skip
                for n, view in zip(remote, views, strict=True):
                    out[n] = bytes(view)
            finally:
                for buf in staging:
                    self._staging.give(buf)
        return out  # type: ignore[return-value]

    def get_many_into_flow(
        self, keys: Sequence[str], buffers: Sequence[object], fingerprint: bytes
    ) -> Flow[list[int]]:
        infos = yield from self._read_into_flow(keys, buffers, fingerprint, get_replica_list_call)
        return [info.size_bytes for info in infos]

    def prefix_match_flow(self, keys: Sequence[str], fingerprint: bytes) -> Flow[int]:
        keys = [validate_key(k) for k in keys]
        return (yield prefix_match_call(keys, fingerprint))  # type: ignore[no-any-return]

    def get_prefix_into_flow(
        self, keys: Sequence[str], buffers: Sequence[object], fingerprint: bytes
    ) -> Flow[PrefixRead]:
        infos = yield from self._read_into_flow(keys, buffers, fingerprint, get_prefix_call)
        return PrefixRead(len(infos), [i.size_bytes for i in infos], [i.tag for i in infos])

    def _read_into_flow(
        self,
        keys: Sequence[str],
        buffers: Sequence[object],
        fingerprint: bytes,
        lookup: Callable[[Sequence[str], bytes], MasterCall[list[ReplicaList | MooncakeError]]],
    ) -> Flow[list[ReplicaList]]:
        """Read into caller buffers the objects `lookup` finds: every key (a batch) or the
        leading ones (a prefix, whose reply stops at the first miss)."""
        if len(keys) != len(buffers):
            raise InvalidArgumentError(f"{len(keys)} keys but {len(buffers)} buffers")
        keys = [validate_key(k) for k in keys]
        views, devices = self._targets(buffers)
        staged = devices  # every pinned staging buffer goes back, used or not
        try:
            plan = None
            if not devices and lookup is get_replica_list_call:
                plan = self._speculation(keys, views)
            if plan is not None:  # every key remembered here: copy while the master looks up
                return (yield from self._read_speculative(keys, views, plan, fingerprint))
            results = yield lookup(keys, fingerprint)
            infos = self._checked(keys[: len(results)], results)
            done = yield from self._read_devices(keys, infos, devices)
            if done:  # the rest (not same-host, or a replica failed) through host staging
                rest = [n for n in range(len(infos)) if n not in done]
                yield from self._read_all([keys[n] for n in rest], [infos[n] for n in rest],
                                          [views[n] for n in rest], fingerprint)  # fmt: skip
                devices = [d for d in devices if d[0] not in done]
            else:
                yield from self._read_all(keys, infos, views, fingerprint)
            self._to_devices(devices, infos)
        finally:
            self._release(staged)
        return infos

    def read_parts_flow(
        self, keys: Sequence[str], buffers: Sequence[Sequence[object]], *, outcomes: bool
    ) -> Flow[list[int | MooncakeError]]:
        """Read each object scattered over its list of host buffers (in order); the sizes
        read.  With `outcomes`, a key that fails gets its MooncakeError in the result
        instead of the first failure being raised.  Speculative when every key is remembered
        (the compat layer's get_into and batch_get_into come here)."""
        if len(keys) != len(buffers):
            raise InvalidArgumentError(f"{len(keys)} keys but {len(buffers)} buffer lists")
        keys = [validate_key(k) for k in keys]
        dests = [[as_writable(b) for b in parts] for parts in buffers]
        plan = self._speculation(keys, dests)
        if not outcomes:
            if plan is not None:  # every key remembered here: copy while the master looks up
                infos = yield from self._read_speculative(keys, dests, plan)
            else:
                infos = self._checked(keys, (yield get_replica_list_call(keys, b"")))
                yield from self._read_all(keys, infos, dests)
            return [info.size_bytes for info in infos]
        hits: set[int] = set()
        if plan is not None:
            results, hits = yield from self._speculate(keys, plan, b"")
        else:
            results = yield get_replica_list_call(keys, b"")
        out: list[int | MooncakeError] = []
        todo: list[int] = []
        found: list[ReplicaList] = []  # of todo
        for n, (result, parts) in enumerate(zip(results, dests, strict=True)):
            if isinstance(result, MooncakeError):
                out.append(result)
            elif n in hits:
                out.append(result.size_bytes)
            elif sum(len(p) for p in parts) < result.size_bytes:
                out.append(self._too_small(keys[n], sum(len(p) for p in parts), result))
            else:
                out.append(result.size_bytes)
                todo.append(n)
                found.append(result)
        errors = yield from self._read_all(
            [keys[n] for n in todo], found, [dests[n] for n in todo], outcomes=True
        )
        for n, err in zip(todo, errors, strict=True):
            if err is not None:
                out[n] = err
        return out

    def _targets(
        self, buffers: Sequence[object]
    ) -> tuple[list[list[memoryview]], list[tuple[int, DeviceTarget, np.ndarray]]]:
        """The destination parts of each read; a device buffer gets host staging (pinned for
        CUDA memory) and DeviceParts, which a TCP read fills by the pipeline."""
        views: list[list[memoryview]] = []
        devices: list[tuple[int, DeviceTarget, np.ndarray]] = []
        for i, buf in enumerate(buffers):
            target = device_target(buf)
            if target is not None:
                if target.cuda is not None:
                    host = self._pinned.take(target.nbytes)
                else:
                    host = np.empty(target.nbytes, dtype=np.uint8)
                target.delivered = False
                devices.append((i, target, host))
                views.append(DeviceParts(as_writable(host), target))
            else:
                views.append([as_writable(buf)])
        return views, devices

    def _read_devices(
        self,
        keys: Sequence[str],
        infos: Sequence[ReplicaList],
        devices: list[tuple[int, DeviceTarget, np.ndarray]],
    ) -> Flow[set[int]]:
        """Read straight into device buffers what a same-host replica holds: one DMA from a
        mapped DRAM pool, or a device-to-device copy from the node's GPU tier (client/cuda.py),
        verified in parallel.  Returns the indices served; the others (and any replica that
        failed its checksum) take the staged path, which tries every replica again."""
        wanted = [(i, t.cuda) for i, t, _ in devices if t.cuda is not None
                  and i < len(infos) and t.nbytes >= infos[i].size_bytes]  # fmt: skip
        if not wanted or not self.local_shm:
            return set()
        yield MapPools([loc for i, _ in wanted for loc in infos[i].replicas])
        from mooncake_store.client.cuda import cuda_path

        path = cuda_path()
        done: set[int] = set()
        for i, dev in wanted:
            info = infos[i]
            n = info.size_bytes
            for loc in info.replicas:
                pool = self._mapped(loc)
                # A lease ends by the master's clock as the node shows it too (client/shm.py).
                now_ms = partial(self.shm.master_now_ms, loc.segment_id)
                if pool is not None:
                    digest = path.read_pool(dev[:n], loc.segment_id, pool, loc.offset, n,
                                            loc.grant, now_ms)  # fmt: skip
                elif loc.tier == "GPU":
                    base = path.open_tier(loc.shm_socket, loc.segment_id)
                    if base is None:
                        continue
                    digest = path.read_tier(dev[:n], base, loc.offset, n, loc.grant, now_ms)
                else:
                    continue
                if digest is not None and self._verified(keys[i], loc, info, digest) is None:
                    self.counters["shm_reads"] += 1
                    done.add(i)
                    break
        return done

    def _to_devices(
        self, devices: list[tuple[int, DeviceTarget, np.ndarray]], infos: Sequence[ReplicaList]
    ) -> None:
        """Upload what a read left in host staging (a pipelined TCP read already delivered)."""
        for i, target, host in devices:
            if i < len(infos) and not target.delivered and infos[i].size_bytes:
                target.upload(as_writable(host)[: infos[i].size_bytes])

    def _release(self, devices: list[tuple[int, DeviceTarget, np.ndarray]]) -> None:
        for _, target, host in devices:
            if target.cuda is not None:
                self._pinned.give(host)

    def _checked(
        self, keys: Sequence[str], results: Sequence[ReplicaList | MooncakeError]
    ) -> list[ReplicaList]:
        """The replica lists, or the error: ObjectNotFoundError naming every missing key."""
        missing = [
            k for k, r in zip(keys, results, strict=True) if isinstance(r, ObjectNotFoundError)
        ]
        if missing:
            shown = ", ".join(repr(k) for k in missing[:5])
            more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
            err = ObjectNotFoundError(f"no object under key {shown}{more}")
            err.keys = missing  # type: ignore[attr-defined]
            raise err
        infos: list[ReplicaList] = []
        for r in results:
            if isinstance(r, MooncakeError):
                raise r
            infos.append(r)
        return infos

    @staticmethod
    def _too_small(key: str, held: int, info: ReplicaList) -> BufferTooSmallError:
        return BufferTooSmallError(
            f"buffer holds {held} bytes but {key!r} is {info.size_bytes} bytes; "
            f"pass a buffer of at least {info.size_bytes} bytes"
        )

    def _read_all(
        self,
        keys: Sequence[str],
        infos: Sequence[ReplicaList],
        dests: Sequence[list[memoryview]],
        fingerprint: bytes = b"",
        *,
        outcomes: bool = False,
    ) -> Flow[list[MooncakeError | None]]:
        """Copy each object into its destination parts (zip stops at the shorter `infos` of a
        prefix).  Raises the first failure, or with `outcomes` returns one error or None per
        object."""
        for key, info, parts in zip(keys, infos, dests, strict=False):
            held = sum(len(p) for p in parts)
            if held < info.size_bytes:
                raise self._too_small(key, held, info)
        trimmed = [
            parts.trimmed(info.size_bytes) if isinstance(parts, DeviceParts)
            else [p for p in trim_parts(parts, info.size_bytes) if len(p)]
            for info, parts in zip(infos, dests, strict=False)
        ]  # fmt: skip
        errors: list[MooncakeError | None] = [None] * len(trimmed)
        remote = [
            n for n, (info, parts) in enumerate(zip(infos, trimmed, strict=False))
            if not self._read_local(keys[n], info, parts)
        ]  # fmt: skip
        if remote:
            last = yield from self._read_remote(
                [(keys[n], infos[n], trimmed[n]) for n in remote], fingerprint
            )
            for n, err in zip(remote, last, strict=True):
                if err is not None:
                    errors[n] = self._final_error(keys[n], err)
                    if not outcomes:
                        raise errors[n]  # type: ignore[misc]
        return errors

    @staticmethod
    def _final_error(key: str, err: MooncakeError) -> MooncakeError:
        if isinstance(err, ChecksumMismatchError | ObjectNotFoundError):
            return err
        return ReplicaUnavailableError(f"no replica of {key!r} could be read: {err}")

    def _read_remote(
        self, remote: list[tuple[str, ReplicaList, list[memoryview]]], fingerprint: bytes
    ) -> Flow[list[MooncakeError | None]]:
        """Read each object from its best replica, falling over to the next on any failure.
        Objects whose read grants expired before the node saw them (a batch that outlived its
        lease) get fresh replica lists once and are read again.  Objects whose every replica
        failed its checksum are reported to the master.  Returns each object's last error, or
        None."""
        failed: list[list[ReplicaLocation]] = [[] for _ in remote]  # checksum failures
        last = yield from self._read_rounds(remote, failed)
        expired = [n for n, err in enumerate(last) if isinstance(err, GrantExpiredError)]
        if expired:
            keys = [remote[n][0] for n in expired]
            fresh = yield get_replica_list_call(keys, fingerprint)
            retry: list[tuple[str, ReplicaList, list[memoryview]]] = []
            retried: list[int] = []
            for n, info in zip(expired, fresh, strict=True):
                key, old, dest = remote[n]
                if isinstance(info, MooncakeError):
                    last[n] = info  # removed meanwhile, say
                elif info.size_bytes != old.size_bytes or info.checksum != old.checksum:
                    last[n] = ReplicaUnavailableError(f"{key!r} changed while it was read")
                else:
                    retry.append((key, info, dest))
                    retried.append(n)
            again_failed: list[list[ReplicaLocation]] = [[] for _ in retry]
            again = yield from self._read_rounds(retry, again_failed)
            for n, err, bad in zip(retried, again, again_failed, strict=True):
                last[n] = err
                failed[n] += bad
        poisoned = [
            (key, info.checksum, failed[n])
            for n, (key, info, _) in enumerate(remote)
            if isinstance(last[n], ChecksumMismatchError)
            and {(r.segment_id, r.offset) for r in info.replicas}
            <= {(r.segment_id, r.offset) for r in failed[n]}
        ]
        if poisoned:  # every replica is bad: have the master delete it, so a put heals it
            try:
                yield report_corrupt_call(poisoned)
                self.counters["corrupt_reported"] += len(poisoned)
            except MooncakeError:
                pass  # best effort: the read fails with ChecksumMismatchError all the same
        return last

    def _read_rounds(
        self,
        remote: list[tuple[str, ReplicaList, list[memoryview]]],
        failed: list[list[ReplicaLocation]],
    ) -> Flow[list[MooncakeError | None]]:
        """Each round reads the next candidate replica of every object still unread, in
        parallel (same-host pools first); returns the last error of each object, or None.
        Replicas that failed their checksum are added to `failed` (one list per object)."""
        if not remote:
            return []
        yield MapPools([loc for _, info, _ in remote for loc in info.replicas])
        rank = {"GPU": 1, "DRAM": 1, "NVME": 2}
        queues = [
            sorted(info.replicas, key=lambda loc: 0 if self._mapped(loc) is not None
                   else rank.get(loc.tier, 3))
            for _, info, _ in remote
        ]  # fmt: skip
        last: list[MooncakeError | None] = [None] * len(remote)
        todo = list(range(len(remote)))
        while todo:
            transfers: list[tuple[int, ReplicaLocation]] = []
            for n in todo:
                key, info, dest = remote[n]
                while queues[n]:
                    loc = queues[n].pop(0)
                    pool = self._mapped(loc)
                    if pool is None:
                        transfers.append((n, loc))
                        break
                    self.counters["shm_reads"] += 1
                    src = pool[loc.offset : loc.offset + info.size_bytes]
                    digest = copy_out_checksum(src, dest)
                    last[n] = self._verified(key, loc, info, digest)
                    if last[n] is None:
                        self._remember(key, loc, info.size_bytes, info.checksum)
                        break
                    failed[n].append(loc)
            results: list[MooncakeError | None] = []
            reads = [_read_transfer(loc, remote[n][2]) for n, loc in transfers]
            if reads:
                results = yield Transfers(reads)
            for (n, loc), read, err in zip(transfers, reads, results, strict=True):
                key, info, dest = remote[n]
                pipe = read.hasher if isinstance(read.hasher, PipelinedReceive) else None
                if pipe is not None:  # every copy it started is done, whatever happened
                    pipe.finish()
                    if err is None and not pipe.complete:
                        err = DataPathError(f"reply for {key!r} ended short")
                if err is None:
                    self.counters["tcp_reads"] += 1
                    assert read.hasher is not None
                    err = self._verified(key, loc, info, read.hasher.intdigest())
                    if err is not None:
                        failed[n].append(loc)
                    elif pipe is not None:
                        assert isinstance(dest, DeviceParts)
                        dest.target.delivered = True
                        self.counters["pipelined_reads"] = (
                            self.counters.get("pipelined_reads", 0) + 1
                        )
                last[n] = err
            todo = [n for n in todo if last[n] is not None and queues[n]]
        return last

    def _verified(
        self, key: str, loc: ReplicaLocation, info: ReplicaList, digest: int
    ) -> MooncakeError | None:
        if digest == info.checksum:
            tier = f"{loc.tier.lower()}_reads"
            self.counters[tier] = self.counters.get(tier, 0) + 1
            return None
        self.counters["checksum_failures"] += 1
        return ChecksumMismatchError(
            f"replica of {key!r} on node {loc.node_id} failed its checksum"
        )

    def _read_local(self, key: str, info: ReplicaList, dest: list[memoryview]) -> bool:
        """Copy from an already-mapped same-host replica; False means: take the full path."""
        for loc in info.replicas:
            pool = self._mapped(loc)
            if pool is not None:
                src = pool[loc.offset : loc.offset + info.size_bytes]
                if copy_out_checksum(src, dest) == info.checksum:
                    self.counters["shm_reads"] += 1
                    self.counters["dram_reads"] += 1
                    self._remember(key, loc, info.size_bytes, info.checksum)
                    return True
                return False  # the full path retries every replica and reports the failure
        return False

    def _take_local(self, key: str, info: ReplicaList) -> bytes | None:
        """New bytes copied straight from an already-mapped same-host replica, verified; None
        means: take the full path."""
        for loc in info.replicas:
            pool = self._mapped(loc)
            if pool is not None:
                data = bytes(pool[loc.offset : loc.offset + info.size_bytes])
                if checksum(data) == info.checksum:
                    self.counters["shm_reads"] += 1
                    self.counters["dram_reads"] += 1
                    self._remember(key, loc, info.size_bytes, info.checksum)
                    return data
                return None
        return None


def _buffer(parts: list[memoryview]) -> memoryview | list[memoryview]:
    return parts[0] if len(parts) == 1 else parts


def _read_transfer(loc: ReplicaLocation, parts: list[memoryview]) -> Transfer:
    """A TCP read into `parts`: a device read (DeviceParts) through the pipeline, whose
    copies into device memory run while the rest of the reply is received."""
    if isinstance(parts, DeviceParts) and parts:
        pipe = parts.pipeline()
        return Transfer(Op.READ, loc, pipe.dests, pipe)
    return Transfer(Op.READ, loc, _buffer(parts), Hasher())
