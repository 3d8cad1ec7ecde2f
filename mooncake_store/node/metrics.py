"""The store node's Prometheus metrics, read from its counters at scrape time (on its loop).

Transfers are counted per data path: `tcp` (the node's TCP data server), `shm` (pool hand-offs
to same-host clients, which then copy without the node), `fetch` (node-to-node copies this node
pulled); tier moves per direction; checksum failures seen in moves and fetches; grants refused.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class NodeCollector(Collector):
    def __init__(self, node: Any) -> None:
        self.node = node

    def collect(self) -> Iterator[Metric]:
        node = self.node
        labels = ["node"]
        nid = [str(node.node_id)]
        access, control, shm, link = node.access, node.control, node.shm, node.link
        transfers = CounterMetricFamily(
            "mooncake_node_transfers", "Transfers served or made, by data path and direction.",
            labels=[*labels, "path", "op"],
        )  # fmt: skip
        moved = CounterMetricFamily(
            "mooncake_node_transfer_bytes", "Bytes moved, by data path and direction.",
            labels=[*labels, "path", "op"],
        )  # fmt: skip
        if access is not None:
            transfers.add_metric([*nid, "tcp", "read"], access.reads)
            transfers.add_metric([*nid, "tcp", "write"], access.writes)
            moved.add_metric([*nid, "tcp", "read"], access.read_bytes)
            moved.add_metric([*nid, "tcp", "write"], access.write_bytes)
        if control is not None:
            transfers.add_metric([*nid, "fetch", "write"], control.fetched)
            moved.add_metric([*nid, "fetch", "write"], control.fetched_bytes)
        yield transfers
        yield moved
        handoffs = CounterMetricFamily(
            "mooncake_node_shm_handoffs", "Same-host clients handed the DRAM pool (then they "
            "copy without the node), by result.", labels=[*labels, "result"],
        )  # fmt: skip
        if shm is not None:
            handoffs.add_metric([*nid, "granted"], getattr(shm, "granted", 0))
            handoffs.add_metric([*nid, "refused"], getattr(shm, "refused", 0))
        yield handoffs
        moves = CounterMetricFamily(
            "mooncake_node_tier_moves", "Blocks moved between this node's tiers.",
            labels=[*labels, "direction"],
        )  # fmt: skip
        if control is not None:
            moves.add_metric([*nid, "demote"], control.demoted)
            moves.add_metric([*nid, "promote"], control.promoted)
        yield moves
        yield _counter("mooncake_node_checksum_failures",
                       "Blocks that failed their checksum in a tier move or a fetch.",
                       nid, control.checksum_failures if control is not None else 0)  # fmt: skip
        yield _counter("mooncake_node_grants_denied", "Data-path accesses refused (bad, "
                       "expired or foreign grant).", nid,
                       access.denied if access is not None else 0)  # fmt: skip
        yield _counter("mooncake_node_heartbeats", "Heartbeats the master answered.", nid,
                       link.heartbeats if link is not None else 0)  # fmt: skip
        mounted = GaugeMetricFamily("mooncake_node_mounted", "1 while mounted on the master.",
                                    labels=labels)  # fmt: skip
        mounted.add_metric(nid, 1 if link is not None and link.mounted.is_set() else 0)
        yield mounted
        owed = GaugeMetricFamily(
            "mooncake_node_mount_reply_owed",
            "1 while a mount again got no reply: client writes are refused until one comes.",
            labels=labels,
        )
        owed.add_metric(nid, 1 if link is not None and link.fences_owed else 0)
        yield owed
        capacity = GaugeMetricFamily("mooncake_node_tier_capacity_bytes", "Size of each tier.",
                                     labels=[*labels, "tier"])  # fmt: skip
        for tier, size in node.tier_sizes().items():
            capacity.add_metric([*nid, tier], size)
        yield capacity


def _counter(name: str, help_text: str, nid: list[str], value: int) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=["node"])
    family.add_metric(nid, value)
    return family


def node_registry(node: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(node))
    return registry
