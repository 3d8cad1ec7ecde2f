"""A node whose mount again got no reply refuses writes until a mount reply is in
(node/master_link.py `fences_owed`): the master may have applied that mount afresh and be
handing the pool's room out under fences the node never saw.

The reply is lost for real: the node reaches its master through a relay that, while told to,
drops every call's HTTP/2 frames from master to node (the connection's own frames pass, so the
request goes through and the master applies it), against a real master and node (in-process:
InProcessCluster)."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

from mooncake_store import Client
from mooncake_store.client.types import PutSpec
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import AccessDeniedError, NoSpaceError
from mooncake_store.master.generations import FLOOR_FILE
from mooncake_store.node.metrics import node_registry
from tests.conftest import FAST_MASTER, wait_until
from tests.integration.test_write_grants import Master, connect, write

VALUE = os.urandom(256 * 1024)
_FRAME_HEADER = 9  # HTTP/2: length (3), type, flags, stream id (4)


class ReplyDropper:
    """A TCP relay to `upstream`; while `dropping`, the frames of every stream (call replies)
    from upstream are dropped and stream 0's (settings, pings, window updates) pass."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.dropping = False
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def restore(self) -> None:
        """Pass everything again, on fresh connections (a dropped reply's header compression
        state is gone with its connection)."""
        self.dropping = False
        with self._lock:
            for sock in self._open:
                sock.close()
            self._open.clear()

    def close(self) -> None:
        self.listener.close()
        self.restore()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._relay, args=(client,), daemon=True).start()

    def _relay(self, client: socket.socket) -> None:
        host, _, port = self.upstream.rpartition(":")
        deadline = time.monotonic() + 20
        while True:  # a master restarting: the connection waits for it, as a slow one would
            try:
                server = socket.create_connection((host, int(port)), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    client.close()
                    return
                time.sleep(0.05)
        server.settimeout(None)
        with self._lock:
            self._open += [client, server]
        threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
        self._frames(server, client)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()

    def _frames(self, src: socket.socket, dst: socket.socket) -> None:
        pending = b""
        try:
            while data := src.recv(65536):
                pending += data
                while len(pending) >= _FRAME_HEADER:
                    end = _FRAME_HEADER + int.from_bytes(pending[:3], "big")
                    if len(pending) < end:
                        break
                    frame, pending = pending[:end], pending[end:]
                    stream = int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
                    if not (self.dropping and stream):
                        dst.sendall(frame)
        except OSError:
            pass
        finally:
            src.close()
            dst.close()


def restart_losing_the_mount_reply(cluster: InProcessCluster, node: Any) -> Any:
    """Restart the master while the relay drops replies: the node's heartbeats find the master
    gone and it mounts again through the relay; the new master applies that mount (afresh: it
    never knew the node) and the reply is lost.  Heartbeats reach the new master's heartbeat
    port directly, and it knows the node now.  Returns the new master (its MasterServer)."""
    link = node.server._link
    assert cluster.master is not None
    cluster.master.stop()
    wait_until(lambda: link._remounting is not None and link._remounting.is_alive(),
               what="a heartbeat to find the master gone")  # fmt: skip
    master = cluster.start_master().server
    wait_until(lambda: master.table.node(node.server.node_id) is not None,
               what="the new master to apply the mount")  # fmt: skip
    wait_until(lambda: link.fences_owed, what="the mount to time out unanswered")
    return master


def test_a_node_whose_remount_reply_was_lost_refuses_writes_until_a_reply_is_in(tmp_path):
    # Heartbeats every 3 s: the one that finds the master gone starts the mount, and the next
    # reaches the new master after it applied that mount.  --auth off: the node finds no token
    # for the relay's address.
    args = [*FAST_MASTER, "--heartbeat-interval", "3s", "--heartbeat-ttl", "20s", "--auth", "off"]
    with InProcessCluster(tmp_path, nodes=0, dram="16MiB", master_args=args) as cluster:
        relay = ReplyDropper(cluster.master_address)
        try:
            node = cluster.add_node("--master", relay.address, "--mount-timeout", "4")
            link, gate = node.server._link, node.server.access.gate
            assert link is not None
            with Master(cluster.master_address) as calls:  # kept open: the put stays pending
                stale = calls.put_start("granted-before-the-restart", len(VALUE))
                relay.dropping = True
                master = restart_losing_the_mount_reply(cluster, node)
                metrics = node_registry(node.server)
                owed = {"node": node.server.node_id}
                assert metrics.get_sample_value("mooncake_node_mount_reply_owed", owed) == 1
                assert link.mounted.is_set()  # the node heartbeats on: the master knows it
                # The earlier master's grant finds the pool closed, not its old fences.
                with connect(stale) as sock:
                    status, message = write(sock, stale, b"\xee" * len(VALUE))
                assert status == AccessDeniedError.code, message
                assert "write grant ended" in message
                assert (
                    gate.generation_seen <= master.table.next_generation
                )  # its pushes, refused, seen

                relay.restore()  # the node mounts again until a reply is in
                wait_until(lambda: not link.fences_owed, what="a mount reply")
                assert metrics.get_sample_value("mooncake_node_mount_reply_owed", owed) == 0
                assert link.master_run == master._servicer.master_run
                with connect(stale) as sock:  # the new master's fence ends it for good
                    status, message = write(sock, stale, b"\xee" * len(VALUE))
                assert status == AccessDeniedError.code and "write grant ended" in message
                with Client(cluster.master_address) as store:
                    store.put("after", VALUE)
                    assert store.get("after") == VALUE
        finally:
            relay.close()


def test_a_run_whose_mount_reply_was_lost_grants_no_write_there(tmp_path):
    """A master run grants no write on a node before the node took a write fence of that run
    (membership.py `awaiting_first_fence`), which the node does only once that run's mount
    reply is in (node/control.py).  So a run whose reply was lost leaves no grant behind.
    Found by review: such a run granted a put and pushed no fence; its floor file was then
    lost, so the next run, told by the node only of what the run before saw, started its
    generations where the lost run had, and the lost run's grant wrote under the next run's
    fence over an acknowledged block.  The lost run's refused pushes still count as seen on
    the node, so the next run starts past them (master/generations.py)."""
    args = [*FAST_MASTER, "--heartbeat-interval", "3s", "--heartbeat-ttl", "20s", "--auth", "off"]
    with InProcessCluster(tmp_path, nodes=0, dram="16MiB", master_args=args) as cluster:
        relay = ReplyDropper(cluster.master_address)
        floor_file = cluster.data_dir / FLOOR_FILE
        try:
            node = cluster.add_node("--master", relay.address, "--mount-timeout", "4")
            link, control = node.server._link, node.server.control
            gate = node.server.access.gate
            assert link is not None and control is not None
            relay.dropping = True
            before = floor_file.read_text()  # where the next run starts from
            lost = restart_losing_the_mount_reply(cluster, node)
            pushed_from = lost.table.next_generation
            refused = control.refused
            with Master(cluster.master_address) as calls:
                spec = PutSpec("granted-by-the-lost-run", len(VALUE))
                [outcome] = calls.loop.run_until_complete(calls.client.put_start([spec]))
            assert isinstance(outcome, NoSpaceError), outcome
            assert "first write fence" in outcome.message
            assert control.refused > refused  # the put had the fences pushed: refused there
            assert gate.generation_seen >= pushed_from
            cluster.master.stop()  # and its floor file loses what it wrote
            floor_file.write_text(before)
            relay.restore()
            master = cluster.start_master().server
            wait_until(lambda: not link.fences_owed, what="a mount reply")
            assert master.table.next_generation > pushed_from
            with Client(cluster.master_address) as store:
                store.put("after", VALUE)
                assert store.get("after") == VALUE
        finally:
            relay.close()
