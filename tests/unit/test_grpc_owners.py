"""gRPC owners: peer names, the kernel's connection table, and which owners are gone."""

from __future__ import annotations

import socket

from mooncake_store.master.grpc_owners import (
    GRPC_OWNER_BASE,
    GrpcOwners,
    established_remotes,
    parse_peer,
    read_established,
)

TCP4 = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
   0: 0100007F:C383 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0
   1: 0100007F:C383 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0
   2: 0100007F:C383 0100007F:D432 08 00000000:00000000 00:00000000 00000000     0
   3: 0100007F:1F90 0100007F:D433 01 00000000:00000000 00:00000000 00000000     0
"""
TCP6 = """  sl  local_address                         remote_address                        st
   0: 0000000000000000FFFF00000100007F:C383 0000000000000000FFFF00000100007F:D434 01 0
   1: 00000000000000000000000001000000:C383 00000000000000000000000001000000:D435 01 0
"""


def test_peers_name_one_tcp_connection():
    assert parse_peer("ipv4:127.0.0.1:54321") == ("127.0.0.1", 54321)
    assert parse_peer("ipv6:[::1]:54321") == ("::1", 54321)
    assert parse_peer("ipv6:[::ffff:127.0.0.1]:7") == ("127.0.0.1", 7)  # dual stack: one name
    assert parse_peer("unix:/tmp/sock") is None
    assert parse_peer("ipv4:garbage") is None


def test_only_established_connections_to_our_port_count():
    port = 0xC383
    assert established_remotes(TCP4.splitlines(), port) == {("127.0.0.1", 0xD431)}
    # CLOSE_WAIT (08): the client closed; another local port (0x1F90): not ours.
    assert established_remotes(TCP6.splitlines(), port) == {
        ("127.0.0.1", 0xD434),
        ("::1", 0xD435),
    }


def test_owners_of_gone_connections_are_returned_once():
    owners = GrpcOwners()
    a = owners.owner_for("ipv4:127.0.0.1:1000")
    b = owners.owner_for("ipv6:[::ffff:127.0.0.1]:1001")
    assert a >= GRPC_OWNER_BASE and b == a + 1
    assert owners.owner_for("ipv4:127.0.0.1:1000") == a
    assert owners.owner_for("unix:/x") == 0  # not tracked
    assert owners.closed({("127.0.0.1", 1000)}) == [b]
    assert owners.closed({("127.0.0.1", 1000)}) == []
    assert len(owners) == 1
    assert owners.closed(set()) == [a]
    assert owners.owner_for("ipv4:127.0.0.1:1000") != a  # a new connection on a reused port


def test_the_kernel_lists_a_live_connection_and_not_a_closed_one():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    remote = ("127.0.0.1", client.getsockname()[1])
    try:
        assert remote in (read_established(port) or set())
        client.close()
        assert remote not in (read_established(port) or set())  # now CLOSE_WAIT
    finally:
        accepted.close()
        server.close()
