"""A wall-clock step on the master (an NTP correction) drops no node and deletes no object.

The master's TTLs, leases, deadlines and grace windows run on the monotonic clock; only grant
expiry is wall time (see common/clock.py).  The master runs under tests/helpers/stepped_clock.py,
which steps its `time.time` from outside while the monotonic clock goes on.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mooncake_store import Client
from mooncake_store.cluster import _MASTER_READY, DaemonProcess, LocalCluster

STEPPED = Path(__file__).parents[1] / "helpers" / "stepped_clock.py"


class SteppedCluster(LocalCluster):
    """A LocalCluster whose master's wall clock is offset by the number in `offset_file`."""

    def __init__(self, root: Path, **kwargs: object) -> None:
        super().__init__(root, **kwargs)  # type: ignore[arg-type]
        self.offset_file = root / "clock-offset"
        self.offset_file.write_text("0")

    def start_master(self) -> DaemonProcess:
        args = [
            sys.executable, str(STEPPED), str(self.offset_file), "mooncake_store.master",
            "--host", "127.0.0.1", "--port", str(self.master_port),
            "--data-dir", str(self.data_dir), *self.master_args,
        ]  # fmt: skip
        self.master = DaemonProcess(
            args, self.log_dir / "master.log", _MASTER_READY, self.timeout_s
        )
        self.master_port = int(self.master.match.group(2))
        return self.master

    def step(self, offset_s: float) -> None:
        self.offset_file.write_text(str(offset_s))


@pytest.fixture
def stepped(tmp_path: Path) -> Iterator[SteppedCluster]:
    # Heartbeats every second: the old master's first tick after a step (0.25 s) found nodes
    # that had not heartbeated since, and dropped them.
    master_args = ["--heartbeat-interval", "1s", "--heartbeat-ttl", "3s"]
    with SteppedCluster(tmp_path, nodes=3, dram="32MiB", master_args=master_args) as c:
        yield c


@pytest.mark.timeout(60)
def test_wall_clock_steps_drop_no_node_and_delete_no_object(stepped: SteppedCluster) -> None:
    values = {f"step-{i}": bytes([i]) * 5000 for i in range(20)}
    with Client(stepped.master_address) as store:
        for key, value in values.items():
            store.put(key, value, replicas=2)
        nodes = {n.node_id for n in store.list_nodes()}
        assert len(nodes) == 3
        for offset_s in (11.0, -3600.0, 0.0):  # forward (NTP), far back, and back to true
            stepped.step(offset_s)
            # The old master dropped the nodes on its first tick after the step (ticks run every
            # 0.25 s): give it several ticks to do anything wrong.
            time.sleep(1.5)
            assert {n.node_id for n in store.list_nodes()} == nodes, f"step {offset_s:+} s"
            assert store.stats().objects == len(values), f"step {offset_s:+} s"
            assert all(store.exists_many(list(values))), f"step {offset_s:+} s"
        for key, value in values.items():  # clocks agree again: grants are good, bytes right
            assert store.get(key) == value
