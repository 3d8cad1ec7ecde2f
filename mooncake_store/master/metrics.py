"""The master's Prometheus metrics: calls and their latency, hits and misses, the table's state.

Three sources, one registry per master:
- every MasterService call, gRPC or framed, goes through `InstrumentedServicer`, which counts it
  (`mooncake_master_requests_total{method,endpoint,outcome}`), times it
  (`mooncake_master_request_duration_seconds{method}`) and reads the reply for hits and misses
  of gets and prefix matches (blocks and bytes);
- `TableCollector` reads the table at scrape time: objects and bytes per tier and node, pending
  puts, under-replicated objects, nodes by state (`mooncake_master_node_states{state}`: valid,
  suspect, draining), and the table's, tiering's and replication's event counters
  (evictions, demotions, promotions, repairs, ...) as `mooncake_master_<event>_total`.
The page is rendered on the master's loop (common/metrics.py), so it reads a consistent table.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from mooncake_store._proto import mooncake_store_pb2 as pb
from mooncake_store.common.errors import OK, ObjectNotFoundError
from mooncake_store.common.metrics import LATENCY_BUCKETS_S
from mooncake_store.master.segments import NodeCondition

RPC_NAMES = frozenset(pb.DESCRIPTOR.services_by_name["MasterService"].methods_by_name)
_NOT_FOUND = ObjectNotFoundError.code


class MasterMetrics:
    """The call metrics of one master (a registry of its own, so masters in one process differ)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "mooncake_master_requests", "MasterService calls, by method, endpoint and outcome.",
            ["method", "endpoint", "outcome"], registry=registry,
        )  # fmt: skip
        self.latency = Histogram(
            "mooncake_master_request_duration_seconds",
            "Time the master spent on a call (handler only, not the network), by method.",
            ["method"], buckets=LATENCY_BUCKETS_S, registry=registry,
        )  # fmt: skip
        self.get_keys = Counter(
            "mooncake_master_get_keys", "Keys looked up for reads (GetReplicaList and batch), by "
            "result: hit (readable) or miss (not found).", ["result"], registry=registry,
        )  # fmt: skip
        self.get_hit_bytes = Counter(
            "mooncake_master_get_hit_bytes", "Bytes of the objects whose lookups hit.",
            registry=registry,
        )  # fmt: skip
        self.prefix_blocks = Counter(
            "mooncake_master_prefix_blocks", "Blocks asked for in prefix matches (PrefixMatch, "
            "GetPrefix), by result: hit (in the cached run) or miss.", ["call", "result"],
            registry=registry,
        )  # fmt: skip
        # The same hits and misses as plain numbers, for the Stats RPC (mooncake-admin stats).
        self.totals: dict[str, int] = dict.fromkeys(
            ("get_hits", "get_misses", "get_hit_bytes", "prefix_hit_blocks", "prefix_miss_blocks",
             "prefix_hit_bytes"), 0,
        )  # fmt: skip
        self.prefix_hit_bytes = Counter(
            "mooncake_master_prefix_hit_bytes", "Bytes of the blocks GetPrefix found cached.",
            registry=registry,
        )  # fmt: skip

    def observe(self, method: str, request: Any, reply: Any) -> None:
        """Count hits and misses from a lookup's request and reply."""
        if method in ("GetReplicaList", "BatchGetReplicaList"):
            results = [reply] if method == "GetReplicaList" else list(reply.results)
            hits = misses = hit_bytes = 0
            for result in results:
                code = result.status.code
                if code == OK:
                    hits += 1
                    hit_bytes += result.size_bytes
                elif code == _NOT_FOUND:
                    misses += 1
            self._count_gets(hits, misses, hit_bytes)
        elif method == "PrefixMatch":
            self._count_prefix("PrefixMatch", reply.matched, len(request.keys), 0)
        elif method == "GetPrefix":
            found = [r for r in reply.results if r.status.code == OK]
            self._count_prefix(
                "GetPrefix", len(found), len(request.keys), sum(r.size_bytes for r in found)
            )

    def _count_gets(self, hits: int, misses: int, hit_bytes: int) -> None:
        self.get_keys.labels("hit").inc(hits)
        self.get_keys.labels("miss").inc(misses)
        self.get_hit_bytes.inc(hit_bytes)
        self.totals["get_hits"] += hits
        self.totals["get_misses"] += misses
        self.totals["get_hit_bytes"] += hit_bytes

    def _count_prefix(self, call: str, hits: int, asked: int, hit_bytes: int) -> None:
        misses = max(0, asked - hits)
        self.prefix_blocks.labels(call, "hit").inc(hits)
        self.prefix_blocks.labels(call, "miss").inc(misses)
        self.prefix_hit_bytes.inc(hit_bytes)
        self.totals["prefix_hit_blocks"] += hits
        self.totals["prefix_miss_blocks"] += misses
        self.totals["prefix_hit_bytes"] += hit_bytes


class InstrumentedServicer:
    """The servicer as gRPC and the framed endpoint see it: each RPC counted, timed, observed.

    Every other attribute is the servicer's own.
    """

    def __init__(self, servicer: object, metrics: MasterMetrics, endpoint: str) -> None:
        self._servicer = servicer
        self._metrics = metrics
        self._endpoint = endpoint
        for name in RPC_NAMES:
            handler = getattr(servicer, name, None)
            if handler is not None:
                setattr(self, name, self._wrap(name, handler))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._servicer, name)

    def _wrap(self, name: str, handler: Callable[..., Any]) -> Callable[..., Any]:
        metrics, endpoint = self._metrics, self._endpoint
        children: dict[str, Any] = {}  # label children, made on first use: no zero series

        def child(key: str) -> Any:
            if key not in children:
                if key == "latency":
                    children[key] = metrics.latency.labels(name)
                else:
                    children[key] = metrics.requests.labels(name, endpoint, key)
            return children[key]

        async def call(request: Any, context: Any) -> Any:
            started = time.perf_counter()
            try:
                reply = await handler(request, context)
            except BaseException:
                child("error").inc()
                child("latency").observe(time.perf_counter() - started)
                raise
            child("latency").observe(time.perf_counter() - started)
            child("ok").inc()
            metrics.observe(name, request, reply)
            return reply

        call.__name__ = name
        return call


# Event counters of the table, tiering and replication, exported as mooncake_master_<name>_total.
COUNTER_HELP = {
    "evictions": "Objects evicted to make room.",
    "demotions": "Blocks moved down a tier (DRAM to NVMe, GPU to DRAM).",
    "promotions": "Blocks moved up a tier (NVMe to DRAM, DRAM to GPU).",
    "repairs": "Replicas copied again after a node was lost.",
    "nvme_drops": "Blocks dropped from a full NVMe tier.",
    "hot_replicas_added": "Extra replicas made for hot blocks.",
    "hot_replicas_dropped": "Extra replicas dropped once a block cooled.",
    "copies_failed": "Node-to-node copies that failed.",
    "moves_failed": "Tier moves that failed.",
    "puts_started": "Puts started.",
    "puts_committed": "Puts committed.",
    "puts_deduplicated": "Puts of a key that already existed.",
    "puts_revoked": "Puts revoked (every replica failed, or the client gave up).",
    "puts_reclaimed": "Puts reclaimed after --put-timeout (by the tick, or at a late PutEnd).",
    "leases_refused_mounting": "Allocation leases refused because they would have had fewer "
    "replicas than asked while a node mounted a moment ago was not writable yet.",
    "puts_superseded": "Pending puts revoked for their client's retry (the first reply was lost).",
    "removes": "Objects removed.",
    "gets": "Reads granted (replica lists served).",
    "replicas_dropped": "Replicas dropped (node lost, corrupt, or evicted).",
    "nodes_expired": "Nodes declared dead after missing heartbeats.",
    "objects_adopted": "Blocks adopted from a node's inventory.",
    "objects_lost": "Committed objects deleted because every node holding a replica was dropped.",
    "objects_corrupt": "Objects deleted: every replica failed its checksum on its node.",
    "replicas_corrupt": "Replicas dropped after their node found them failing their checksum.",
    "corrupt_reports_refuted": "Corrupt reports whose replicas passed their checksum on their "
    "nodes (nothing deleted).",
}


class TableCollector(Collector):
    """Reads the table at scrape time (on the master's loop)."""

    def __init__(self, table: Any, tiering: Any, replication: Any) -> None:
        self.table, self.tiering, self.replication = table, tiering, replication

    def collect(self) -> Iterator[Metric]:
        table = self.table
        objects = GaugeMetricFamily(
            "mooncake_master_segment_objects", "Replicas held by a node's tier.",
            labels=["node", "tier"],
        )  # fmt: skip
        used = GaugeMetricFamily(
            "mooncake_master_segment_used_bytes", "Bytes allocated in a node's tier.",
            labels=["node", "tier"],
        )  # fmt: skip
        capacity = GaugeMetricFamily(
            "mooncake_master_segment_capacity_bytes", "Size of a node's tier.",
            labels=["node", "tier"],
        )  # fmt: skip
        leased = GaugeMetricFamily(
            "mooncake_master_segment_leased_bytes", "Bytes of a node's tier granted to clients "
            "as allocation leases and not used yet (not in used_bytes).", labels=["node", "tier"],
        )  # fmt: skip
        tier_objects: dict[str, int] = {}
        tier_used: dict[str, int] = {}
        tier_capacity: dict[str, int] = {}
        for seg in table.segments():
            tier = seg.tier.value
            used_bytes = seg.allocator.used_bytes - seg.leased_bytes  # unused leases: apart
            objects.add_metric([seg.node_id, tier], seg.objects - seg.leases)
            used.add_metric([seg.node_id, tier], used_bytes)
            capacity.add_metric([seg.node_id, tier], seg.allocator.capacity_bytes)
            leased.add_metric([seg.node_id, tier], seg.leased_bytes)
            tier_objects[tier] = tier_objects.get(tier, 0) + seg.objects - seg.leases
            tier_used[tier] = tier_used.get(tier, 0) + used_bytes
            tier_capacity[tier] = tier_capacity.get(tier, 0) + seg.allocator.capacity_bytes
        yield from (objects, used, capacity, leased)
        yield _by_tier("mooncake_master_tier_objects", "Replicas held in a tier, all nodes.",
                       tier_objects)  # fmt: skip
        yield _by_tier("mooncake_master_tier_used_bytes", "Bytes allocated in a tier, all nodes.",
                       tier_used)  # fmt: skip
        yield _by_tier("mooncake_master_tier_capacity_bytes", "Size of a tier, all nodes.",
                       tier_capacity)  # fmt: skip
        yield GaugeMetricFamily("mooncake_master_objects", "Committed objects.",
                                value=table.object_count())  # fmt: skip
        yield GaugeMetricFamily("mooncake_master_stored_bytes", "Bytes of committed objects.",
                                value=table.bytes_stored())  # fmt: skip
        leases = len(table._lease_keys)  # unused allocation leases: not puts, counted apart
        yield GaugeMetricFamily("mooncake_master_pending_puts", "Puts started and not ended.",
                                value=table.pending_count() - leases)  # fmt: skip
        yield GaugeMetricFamily("mooncake_master_leases", "Allocation leases granted to "
                                "clients and not used yet.", value=leases)  # fmt: skip
        yield GaugeMetricFamily(
            "mooncake_master_under_replicated_objects", "Objects that lost a replica and wait "
            "for a repair copy.", value=len(table.under_replicated),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "mooncake_master_releases_owed", "Persistent-tier blocks the master let go of and "
            "their node has not forgotten yet (Release not acknowledged).",
            value=len(table.releases),
        )  # fmt: skip
        yield GaugeMetricFamily("mooncake_master_nodes", "Mounted nodes offered to readers "
                                "and writers (not suspect).",
                                value=len({s.node_id for s in table.segments()}))  # fmt: skip
        states = GaugeMetricFamily(
            "mooncake_master_node_states", "Mounted nodes by state: valid, suspect (silent past "
            "the heartbeat TTL, replicas kept until dropped) or draining.", labels=["state"],
        )  # fmt: skip
        by_state = dict.fromkeys(NodeCondition, 0)
        for _, condition, _ in table.node_conditions():
            by_state[condition] += 1
        for condition, count in by_state.items():
            states.add_metric([condition.value], count)
        yield states
        events: dict[str, int] = {}
        for source in (table.counters, self.tiering.counters, self.replication.counters):
            for name, value in source.items():
                events[name] = events.get(name, 0) + value
        for name in sorted(set(events) | set(COUNTER_HELP)):
            help_text = COUNTER_HELP.get(name, name.replace("_", " ").capitalize() + ".")
            yield CounterMetricFamily(f"mooncake_master_{name}", help_text,
                                      value=events.get(name, 0))  # fmt: skip


def _by_tier(name: str, help_text: str, values: Mapping[str, int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, help_text, labels=["tier"])
    for tier in sorted(values):
        family.add_metric([tier], values[tier])
    return family


def master_registry(
    table: Any, tiering: Any, replication: Any
) -> tuple[CollectorRegistry, MasterMetrics]:
    """A master's registry: its call metrics plus a collector reading its table at scrape time."""
    registry = CollectorRegistry(auto_describe=False)
    metrics = MasterMetrics(registry)
    registry.register(TableCollector(table, tiering, replication))
    return registry, metrics
