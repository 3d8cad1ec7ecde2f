"""Tiers with real nodes: demotion to NVMe, promotion, restarts, corruption, pins."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from mooncake_store import ChecksumMismatchError, Client, ObjectNotFoundError
from mooncake_store.cluster import DaemonStartError, LocalCluster
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER, replica_list, wait_until

BLOCK = 256 * 1024
TIER_MASTER = [*FAST_MASTER, "--dram-high-watermark", "0.5", "--dram-low-watermark", "0.25",
               "--promote-after-reads", "2"]  # fmt: skip


def value(i: int) -> bytes:
    return i.to_bytes(4, "little") * (BLOCK // 4)


def per_tier(store: Client) -> dict[str, int]:
    out: dict[str, int] = {}
    for row in store.list_nodes():
        out[row.tier] = out.get(row.tier, 0) + row.objects
    return out


def fill_and_demote(cluster: Any, store: Client, prefix: str) -> list[str]:
    """Put 12 blocks (3 MiB into 4 MiB of DRAM), wait for demotion, return the NVMe ones."""
    for i in range(12):
        store.put(f"{prefix}/{i}", value(i))
    wait_until(lambda: per_tier(store).get("NVME", 0) >= 4, what="demotion to NVMe")
    return [
        f"{prefix}/{i}"
        for i in range(12)
        if replica_list(cluster.master_address, f"{prefix}/{i}").replicas[0].tier == "NVME"
    ]


def tier_cluster(cls: type[LocalCluster] | type[InProcessCluster], tmp_path: Path) -> Any:
    nvme = ["--nvme-dir", str(tmp_path / "nvme"), "--nvme", "16MiB"]
    return cls(tmp_path / "c", nodes=1, dram="4MiB", master_args=TIER_MASTER, node_args=nvme)


@pytest.fixture
def tiered(tmp_path):
    """One node with a 4 MiB DRAM and a 16 MiB NVMe tier, in this process."""
    with tier_cluster(InProcessCluster, tmp_path) as cluster:
        yield cluster


@pytest.fixture
def tiered_process(tmp_path):
    """The same as daemon subprocesses, for the tests that kill -9 the node."""
    with tier_cluster(LocalCluster, tmp_path) as cluster:
        yield cluster


def test_pressure_demotes_to_nvme_and_reads_back_exact(tiered):
    with Client(tiered.master_address, local_shm=True) as store:
        keys = [f"t/{i}" for i in range(12)]  # 3 MiB into a 4 MiB DRAM tier at 50% high
        for i, key in enumerate(keys):
            store.put(key, value(i))
        wait_until(lambda: per_tier(store).get("NVME", 0) >= 4, what="demotion to NVMe")
        # Demotion runs while puts still arrive, so DRAM ends between the low (25% = 4
        # blocks) and the high (50% = 8 blocks) watermark.
        assert per_tier(store)["DRAM"] <= 8
        for i, key in enumerate(keys):
            assert store.get(key) == value(i)
        assert store.counters["nvme_reads"] >= 4  # served from NVMe over TCP, checksummed
        counters = store.stats().counters
        assert counters["demotions"] >= 4 and counters["moves_failed"] == 0


def test_blocks_read_repeatedly_from_nvme_are_promoted(tiered):
    with Client(tiered.master_address) as store:
        cold = fill_and_demote(tiered, store, "p")[0]
        store.get(cold)
        store.get(cold)
        wait_until(
            lambda: replica_list(tiered.master_address, cold).replicas[0].tier == "DRAM",
            what="promotion back to DRAM",
        )
        assert store.get(cold) == value(int(cold.split("/")[1]))
        assert store.stats().counters["promotions"] >= 1


def test_restarted_node_reports_its_nvme_blocks(tiered_process):
    tiered = tiered_process
    with Client(tiered.master_address) as store:
        on_nvme = fill_and_demote(tiered, store, "r")
        tiered.nodes[0].signal(signal.SIGKILL)
        tiered.nodes[0].proc.wait()
        tiered.restart_node(0)
        tiered.wait_for_nodes(1)
        wait_until(lambda: all(store.exists_many(on_nvme)), what="NVMe blocks re-reported")
        for key in on_nvme:
            assert store.get(key) == value(int(key.split("/")[1]))
        dram_only = [f"r/{i}" for i in range(12) if f"r/{i}" not in on_nvme]
        assert not any(store.exists_many(dram_only))  # DRAM died with the process


def test_corrupt_nvme_block_is_never_served(tiered_process, tmp_path):
    tiered = tiered_process
    with Client(tiered.master_address) as store:
        on_nvme = fill_and_demote(tiered, store, "c")
        victim, other = on_nvme[0], on_nvme[1]
        offset = replica_list(tiered.master_address, victim).replicas[0].offset
        data = tmp_path / "nvme" / "blocks.dat"
        with open(data, "r+b") as f:  # flip bytes under the running node
            f.seek(offset + 100)
            f.write(b"\xff" * 16)
        with pytest.raises(ChecksumMismatchError):
            store.get(victim)
        # After a restart the node's own check drops it: the master never lists it again.
        tiered.nodes[0].signal(signal.SIGKILL)
        tiered.nodes[0].proc.wait()
        tiered.restart_node(0)
        tiered.wait_for_nodes(1)
        wait_until(lambda: store.exists(other), what="the intact blocks to come back")
        with pytest.raises(ObjectNotFoundError):
            store.get(victim)
        assert store.get(other) == value(int(other.split("/")[1]))
        assert "failed their checksum" in (tiered.log_dir / "node-0.log").read_text()


def test_pinned_blocks_stay_in_dram(tiered):
    with Client(tiered.master_address) as store:
        store.put("pinned", value(99), pin=True)
        for i in range(14):
            store.put(f"filler/{i}", value(i))
        wait_until(lambda: per_tier(store).get("NVME", 0) >= 4, what="demotion")
        assert replica_list(tiered.master_address, "pinned").replicas[0].tier == "DRAM"
        assert store.get("pinned") == value(99)


def test_node_flags_are_checked(tmp_path):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "mooncake_store.node", "--nvme", "1GiB"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2 and "--nvme needs --nvme-dir" in result.stderr
    env = {**os.environ, "MOONCAKE_DISABLE_GPU": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mooncake_store.node", "--gpu-bytes", "1GiB", "--master",
         "127.0.0.1:1"], capture_output=True, text=True, timeout=30, env=env,
    )  # fmt: skip
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_master_refuses_nvme_with_an_alignment_o_direct_cannot_use(tmp_path):
    config = tmp_path / "master.toml"
    config.write_text("alignment_bytes = 512\n")
    nvme = ["--nvme-dir", str(tmp_path / "nvme"), "--nvme", "4MiB"]
    cluster = LocalCluster(tmp_path / "c", nodes=0, master_args=["--config", str(config)])
    with cluster:
        # A refused mount is a start-up failure of the node: one line, the master's reason.
        with pytest.raises(DaemonStartError, match=r"exited with code 1 at start: .*refused the "
                           r"mount: .*multiple of 4096"):  # fmt: skip
            cluster.add_node(*nvme, dram="4MiB")
        with Client(cluster.master_address) as store:
            assert store.list_nodes() == []
