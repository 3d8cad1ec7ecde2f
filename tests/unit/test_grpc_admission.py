"""The gRPC connection cap's core (master/grpc_admission.py): which connections may call."""

from __future__ import annotations

from mooncake_store.master.grpc_admission import (
    REFRESH_INTERVAL_S,
    Admission,
    hard_limit,
)
from mooncake_store.master.grpc_owners import Remote


class Kernel:
    """The established connections the kernel lists, and how often it was asked."""

    def __init__(self) -> None:
        self.open: set[Remote] | None = set()
        self.reads = 0

    def established(self, port: int) -> set[Remote] | None:
        assert port == 50051
        self.reads += 1
        return None if self.open is None else set(self.open)


def peer(port: int) -> str:
    return f"ipv4:127.0.0.1:{port}"


def admission(kernel: Kernel, clock: list[float], cap: int = 2) -> Admission:
    gate = Admission(cap, clock=lambda: clock[0], established=kernel.established)
    gate.local_port = 50051
    return gate


def test_the_first_callers_up_to_the_cap_are_admitted_and_keep_their_place() -> None:
    kernel, clock = Kernel(), [100.0]
    kernel.open = {("127.0.0.1", p) for p in (1, 2, 3)}
    gate = admission(kernel, clock)
    assert gate.admit(peer(1)) and gate.admit(peer(2))
    assert not gate.admit(peer(3))  # over the cap: refused
    assert "at most 2 gRPC client connections (--max-connections)" in gate.message
    assert gate.admit(peer(1)) and gate.admit(peer(2))  # admitted ones always pass
    assert gate.refused == 1 and len(gate) == 2
    assert gate.admit("unix:/tmp/sock")  # not a TCP peer: not counted


def test_a_closed_connection_frees_its_place_for_the_next_caller() -> None:
    kernel, clock = Kernel(), [100.0]
    kernel.open = {("127.0.0.1", p) for p in (1, 2, 3)}
    gate = admission(kernel, clock)
    assert gate.admit(peer(1)) and gate.admit(peer(2)) and not gate.admit(peer(3))
    kernel.open.discard(("127.0.0.1", 1))  # the client closed connection 1
    reads = kernel.reads
    assert not gate.admit(peer(3))  # the kernel was asked a moment ago: not again yet
    assert kernel.reads == reads
    clock[0] += REFRESH_INTERVAL_S
    assert gate.admit(peer(3))
    assert not gate.admit(peer(1))  # a new connection from that port now waits its turn


def test_a_flood_at_the_cap_reads_the_kernel_at_most_once_per_interval() -> None:
    kernel, clock = Kernel(), [100.0]
    kernel.open = {("127.0.0.1", p) for p in range(1, 1000)}
    gate = admission(kernel, clock)
    assert gate.admit(peer(1)) and gate.admit(peer(2))
    assert not any(gate.admit(peer(p)) for p in range(3, 1000))
    assert kernel.reads == 1 and gate.refused == 997


def test_without_the_kernels_list_nothing_is_refused_by_the_cap() -> None:
    kernel, clock = Kernel(), [100.0]
    kernel.open = None  # no /proc/net/tcp: no place could ever be freed
    gate = admission(kernel, clock)
    assert all(gate.admit(peer(p)) for p in range(1, 10))
    assert gate.refused == 0


def test_the_hard_limit_leaves_room_to_refuse_clearly() -> None:
    assert hard_limit(3) == 19 and hard_limit(4096) == 4352
