"""Busy polling for replies (client/busy_poll.py): it returns as input arrives, never eats
it, gives up after its window, and backs off after a window that saw nothing."""

from __future__ import annotations

import socket
import ssl
import threading

from mooncake_store.client.busy_poll import BACKOFF_CALLS, BusyPoll


def test_returns_with_the_input_there_and_left_for_the_read():
    a, b = socket.socketpair()
    with a, b:
        poll = BusyPoll(a)
        b.sendall(b"reply")
        poll.wait(5.0)  # returns at once: the input is there
        assert (poll.polls, poll.hits) == (1, 1)
        assert a.recv(16) == b"reply"


def test_returns_when_input_arrives_while_it_polls():
    a, b = socket.socketpair()
    with a, b:
        poll = BusyPoll(a)
        sender = threading.Timer(0.05, b.sendall, args=(b"late",))
        sender.start()
        poll.wait(5.0)
        sender.join()
        assert poll.hits == 1 and a.recv(16) == b"late"


def test_a_closed_peer_ends_the_poll():
    a, b = socket.socketpair()
    with a:
        poll = BusyPoll(a)
        b.close()
        poll.wait(5.0)
        assert poll.hits == 1 and a.recv(1) == b""


def test_a_window_with_nothing_backs_off_then_polls_again():
    a, b = socket.socketpair()
    with a, b:
        poll = BusyPoll(a)
        poll.wait(0.001)  # nothing comes
        assert (poll.polls, poll.hits) == (1, 0)
        b.sendall(b"x")
        for _ in range(BACKOFF_CALLS):
            poll.wait(5.0)  # backing off: no poll, even with input there
        assert poll.polls == 1
        poll.wait(5.0)
        assert (poll.polls, poll.hits) == (2, 1)
        assert a.recv(1) == b"x"


def test_nothing_is_polled_under_tls_or_with_no_window():
    a, b = socket.socketpair()
    with a, b:
        poll = BusyPoll(a)
        poll.wait(0.0)
        assert poll.polls == 0
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    raw = socket.socket()
    tls = context.wrap_socket(raw, do_handshake_on_connect=False, server_hostname="x")
    with tls:
        poll = BusyPoll(tls)
        poll.wait(5.0)  # would poll for 5 s if it polled an idle socket
        assert poll.polls == 0 and not poll.readable()
