"""`mooncake-admin drain NODE`: the master's DrainNode, polled until the node holds no only-copy.

A master (or a build) without DrainNode gets a clear "not supported by this master" error.
"""

from __future__ import annotations

import time
from typing import Any

import click
import grpc

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store._proto import mooncake_store_pb2_grpc as pb_grpc
from mooncake_store.admin.ops import master_metadata
from mooncake_store.common.errors import OK
from mooncake_store.common.tls import grpc_channel

POLL_S = 0.5


class DrainUnsupported(click.ClickException):
    pass


def drain_node(client: Any, node_id: str, timeout_s: float) -> dict[str, Any]:
    """Ask the master to drain `node_id` and wait until none of its blocks is an only copy."""
    request_type = getattr(pb, "DrainNodeRequest", None)
    if request_type is None:
        raise DrainUnsupported(
            "drain is not supported by this master (no DrainNode RPC in this build)"
        )
    incarnations = _incarnations(client)
    if node_id not in incarnations:
        raise click.ClickException(f"no node {node_id!r} is mounted (see mooncake-admin nodes)")
    incarnation = incarnations[node_id]
    deadline = time.monotonic() + timeout_s
    with grpc_channel(client.master, client.tls) as channel:
        stub = pb_grpc.MasterServiceStub(channel)
        if not hasattr(stub, "DrainNode"):
            raise DrainUnsupported("drain is not supported by this master (no DrainNode RPC)")
        while True:
            try:
                reply = stub.DrainNode(
                    request_type(node_id=node_id, incarnation=incarnation),
                    timeout=10,
                    metadata=master_metadata(client.master),
                )
            except grpc.RpcError as exc:
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    raise DrainUnsupported("drain is not supported by this master") from exc
                raise click.ClickException(f"DrainNode failed: {exc.code().name}") from exc
            if reply.status.code != OK:
                raise click.ClickException(f"the master refused the drain: {reply.status.message}")
            result = {"node_id": node_id, "remaining": reply.remaining,
                      "copying": reply.copying, "saved": reply.saved}  # fmt: skip
            if reply.remaining == 0:
                return result
            if time.monotonic() > deadline:
                raise click.ClickException(
                    f"{node_id} still holds the only copy of {reply.remaining} objects after "
                    f"{timeout_s:g}s: rerun mooncake-admin drain to keep waiting"
                )
            time.sleep(POLL_S)


def _incarnations(client: Any) -> dict[str, int]:
    """node id -> incarnation of the mounted nodes (ListNodes)."""
    with grpc_channel(client.master, client.tls) as channel:
        reply = pb_grpc.MasterServiceStub(channel).ListNodes(
            pb.ListNodesRequest(), timeout=10, metadata=master_metadata(client.master)
        )
    return {n.node_id: n.incarnation for n in reply.nodes}
