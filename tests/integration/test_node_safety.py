"""A node's pool cannot be damaged from outside: by a bad replica source or a same-host client."""

from __future__ import annotations

import fcntl
import os
import socket
import threading
from collections.abc import Iterator

import grpc
import pytest
import xxhash

from mooncake_store import Client
from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.errors import ChecksumMismatchError, DataPathError
from mooncake_store.common.wire import REQUEST, pack_response
from tests.conftest import FAST_MASTER, replica_list

VALUE = bytes(range(256)) * 1024  # 256 KiB
F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in the fcntl module


@pytest.fixture(scope="module")
def one_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    root = tmp_path_factory.mktemp("safety")
    # --auth off: the Fetch test calls the node's control service as a buggy master would, and
    # with auth on only master-signed requests get there (tests/integration/test_security.py).
    # It names the master's run, as every master's request does (node/control.py `_other_run`).
    args = [*FAST_MASTER, "--auth", "off"]
    with InProcessCluster(root, nodes=1, dram="16MiB", master_args=args) as cluster:
        yield cluster


class BadSource:
    """A peer that answers one READ with the right size but wrong bytes, or with half of them
    and then a closed connection (what a corrupt or dying source node does)."""

    def __init__(self, *, truncate: bool) -> None:
        self.truncate = truncate
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        with conn:
            header = b""
            while len(header) < REQUEST.size:
                header += conn.recv(REQUEST.size - len(header))
            _, _, _, grant_len, _, _, size = REQUEST.unpack(header)
            if grant_len:
                conn.recv(grant_len, socket.MSG_WAITALL)
            garbage = b"\xee" * size
            conn.sendall(pack_response(0, size) + garbage[: size // 2 if self.truncate else size])

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.mark.parametrize("truncate", [False, True], ids=["wrong-bytes", "cut-short"])
def test_fetch_from_a_bad_source_writes_nothing_into_the_pool(one_node, truncate):
    """A Fetch aimed at another key's extent, from a source that sends bad bytes: the node
    refuses it and that key's block is untouched (it used to be overwritten before the check)."""
    key = f"victim-{truncate}"
    with Client(one_node.master_address) as store:
        store.put(key, VALUE)
        (loc,) = replica_list(one_node.master_address, key).replicas
        source = BadSource(truncate=truncate)
        control = f"127.0.0.1:{one_node.nodes[0].control_port}"
        try:
            with grpc.insecure_channel(control) as channel:
                reply = pb_grpc.NodeServiceStub(channel).Fetch(
                    pb.FetchRequest(tasks=[pb.FetchTask(
                        key="other", src_endpoint=source.endpoint, grant=b"g" * 16,
                        src_offset=0, size_bytes=len(VALUE),
                        checksum=xxhash.xxh3_64_intdigest(b"other"),
                        dst_segment=loc.segment_id, dst_offset=loc.offset,
                    )], master_run=one_node.master.server._servicer.master_run),
                    timeout=10,
                )  # fmt: skip
        finally:
            source.close()
        expected = DataPathError.code if truncate else ChecksumMismatchError.code
        assert [s.code for s in reply.statuses] == [expected]
        assert store.get(key) == VALUE
        assert store.counters["checksum_failures"] == 0


def _pool_fd(shm_socket: str) -> int:
    """The pool's descriptor, received the way a same-host client receives it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect("\0" + shm_socket)
        _, fds, _, _ = socket.recv_fds(sock, 64, 1)
    assert len(fds) == 1
    return fds[0]


def test_a_same_host_client_cannot_truncate_or_reseal_the_pool(one_node):
    with Client(one_node.master_address) as store:
        store.put("sealed", VALUE)
        (loc,) = replica_list(one_node.master_address, "sealed").replicas
        fd = _pool_fd(loc.shm_socket)
        try:
            size = os.fstat(fd).st_size
            for new_size in (0, size // 2, size * 2):
                with pytest.raises(PermissionError):
                    os.ftruncate(fd, new_size)
            for seal in (fcntl.F_SEAL_WRITE, F_SEAL_FUTURE_WRITE):
                with pytest.raises(PermissionError):
                    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seal)
            assert os.fstat(fd).st_size == size
        finally:
            os.close(fd)
        assert one_node.nodes[0].alive()
        assert store.get("sealed") == VALUE
        store.put("after", VALUE[::-1])
        assert store.get("after") == VALUE[::-1]
