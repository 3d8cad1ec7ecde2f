"""Both daemons serve Prometheus text on /metrics; the numbers follow what the cluster did."""

from __future__ import annotations

import urllib.request

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mooncake_store import Client
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER, wait_until


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        assert reply.status == 200
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def total(samples: dict, name: str, **labels: str) -> float:
    """Sum over the series of `name` whose labels include `labels`."""
    return sum(v for (n, ls), v in samples.items()
               if n == name and set(labels.items()) <= set(ls))  # fmt: skip


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    with InProcessCluster(tmp_path_factory.mktemp("metrics"), nodes=2, dram="16MiB",
                          master_args=FAST_MASTER, metrics_port=0) as cluster:  # fmt: skip
        yield cluster


def test_master_and_node_metrics_follow_the_workload(metered):
    master_url = metered.master.metrics_url
    node_urls = [n.metrics_url for n in metered.nodes]
    assert master_url and all(node_urls)
    assert any(line.startswith("metrics: master http://") for line in metered.metrics_lines())
    before = scrape(master_url)
    value_bytes = b"x" * 65536
    with Client(metered.master_address) as store:
        store.put("m/a", value_bytes)
        store.put("m/b", value_bytes, replicas=2)
        assert store.get("m/a") == value_bytes
        with pytest.raises(KeyError):
            store.get("m/missing")
        assert store.prefix_match(["m/a", "m/b", "m/nope", "m/a"]) == 2
        bufs = [np.empty(65536, dtype=np.uint8) for _ in range(3)]
        assert store.get_prefix_into(["m/a", "m/b", "m/gone"], bufs).matched == 2
        stats = store.stats()
    after = scrape(master_url)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    assert delta("mooncake_master_get_keys_total", result="hit") == 1
    assert delta("mooncake_master_get_keys_total", result="miss") == 1
    assert delta("mooncake_master_get_hit_bytes_total") == 65536
    assert delta("mooncake_master_prefix_blocks_total", call="PrefixMatch", result="hit") == 2
    assert delta("mooncake_master_prefix_blocks_total", call="PrefixMatch", result="miss") == 2
    assert delta("mooncake_master_prefix_blocks_total", call="GetPrefix", result="hit") == 2
    assert delta("mooncake_master_prefix_blocks_total", call="GetPrefix", result="miss") == 1
    assert delta("mooncake_master_prefix_hit_bytes_total") == 2 * 65536
    assert delta("mooncake_master_puts_committed_total") == 2
    # Calls are counted per method and endpoint, with a latency histogram per method.
    assert delta("mooncake_master_requests_total", outcome="ok") >= 6
    assert total(after, "mooncake_master_request_duration_seconds_count") >= 6
    assert value(after, "mooncake_master_objects") == 2
    assert value(after, "mooncake_master_stored_bytes") == 2 * 65536
    assert value(after, "mooncake_master_nodes") == 2
    assert value(after, "mooncake_master_pending_puts") == 0
    # Three replicas in all (one + two), per node and tier, and per tier.
    assert total(after, "mooncake_master_segment_objects", tier="DRAM") == 3
    assert value(after, "mooncake_master_tier_objects", tier="DRAM") == 3
    assert value(after, "mooncake_master_tier_capacity_bytes", tier="DRAM") == 2 * 16 * 2**20
    for name in ("evictions", "demotions", "promotions", "repairs"):
        assert ("mooncake_master_" + name + "_total", ()) in after
    assert ("mooncake_master_under_replicated_objects", ()) in after
    # The same hit/miss numbers reach the Stats RPC (mooncake-admin stats reads them).
    assert stats.counters["get_hits"] >= 1 and stats.counters["get_misses"] >= 1
    # Nodes: bytes written over some path (TCP or the handed-off pool), mounted, sized.
    nodes = [scrape(u) for u in node_urls]
    for i, samples in enumerate(nodes):
        assert value(samples, "mooncake_node_mounted", node=f"node-{i}") == 1
        assert value(samples, "mooncake_node_tier_capacity_bytes", node=f"node-{i}",
                     tier="DRAM") == 16 * 2**20  # fmt: skip
        assert ("mooncake_node_checksum_failures_total", (("node", f"node-{i}"),)) in samples
    handed = sum(total(s, "mooncake_node_shm_handoffs_total", result="granted") for s in nodes)
    tcp = sum(total(s, "mooncake_node_transfer_bytes_total", path="tcp") for s in nodes)
    assert handed >= 1 or tcp >= 3 * 65536


def test_tcp_transfers_are_counted_in_bytes(metered):
    urls = [n.metrics_url for n in metered.nodes]
    before = sum(total(scrape(u), "mooncake_node_transfer_bytes_total", path="tcp", op="write")
                 for u in urls)  # fmt: skip
    with Client(metered.master_address, local_shm=False) as store:
        store.put("m/tcp", b"y" * 8192)
        assert store.get("m/tcp") == b"y" * 8192

    def written() -> float:
        return sum(total(scrape(u), "mooncake_node_transfer_bytes_total", path="tcp", op="write")
                   for u in urls) - before  # fmt: skip

    wait_until(lambda: written() == 8192, what="the node to count the TCP write")


def test_metrics_endpoint_answers_404_elsewhere(metered):
    url = metered.master.metrics_url.replace("/metrics", "/nope")
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(url, timeout=10)
    assert info.value.code == 404


def test_grafana_dashboard_names_only_metrics_the_daemons_serve(metered):
    import json
    import re
    from pathlib import Path

    dashboard = Path(__file__).resolve().parents[2] / "docs" / "grafana-dashboard.json"
    exprs = [t["expr"] for p in json.loads(dashboard.read_text())["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"mooncake_\w+", e)}
    served = {name for url in [metered.master.metrics_url, metered.nodes[0].metrics_url]
              for name, _ in scrape(url)}  # fmt: skip
    served |= {n.rsplit("_bucket", 1)[0] for n in served}
    served |= {n[: -len("_total")] + "_total" for n in served if n.endswith("_total")}
    assert used and used <= served, used - served
