"""Shared fixtures: real clusters on 127.0.0.1 (in this process, or daemon subprocesses where a
test needs process-level faults), and a polling helper."""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from mooncake_store.cluster_inprocess import InProcessCluster
from mooncake_store.common.credentials import TOKEN_DIR_ENV

# Short liveness settings so failure tests finish quickly.
FAST_MASTER = [
    "--heartbeat-interval",
    "200ms",
    "--heartbeat-ttl",
    "1500ms",
    "--suspect-grace",
    "1s",
]


@pytest.fixture(scope="session", autouse=True)
def private_token_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Masters started by the tests write their local token files into a per-session temp dir.

    Set in this process's environment, so every master/node/CLI subprocess a test starts inherits
    it; a killed master's `master-<port>.json` is then left in pytest's temp dir, never in the
    user's `~/.config/mooncake/`.  A test about the default location sets the variable itself.
    """
    directory = tmp_path_factory.mktemp("tokens")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(TOKEN_DIR_ENV, str(directory))
        yield str(directory)


def chaos_script() -> ModuleType:
    """scripts/chaos.py as a module (its helpers are tested; it is a script, not a package)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / "chaos.py"
    spec = importlib.util.spec_from_file_location("chaos_script", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("chaos_script", module)
    spec.loader.exec_module(module)
    return module


def wait_until(
    predicate: Callable[[], object],
    timeout_s: float = 15.0,
    interval_s: float = 0.05,
    what: str = "condition",
) -> object:
    """Poll `predicate` until it returns a truthy value; fail the test after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def replica_list(master: str, key: str) -> object:
    """The master's replica list for `key` (a read: it grants a lease and counts an access)."""
    import asyncio

    from mooncake_store.client.master_client import MasterClient
    from mooncake_store.client.types import Retry

    async def call() -> object:
        client = MasterClient(master, timeout_s=5, retry=Retry())
        try:
            return (await client.get_replica_list([key]))[0]
        finally:
            await client.close()

    return asyncio.run(call())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcessCluster]:
    """A master and three 64 MiB nodes, shared by a test module: the real daemons, in this
    process (mooncake_store/cluster_inprocess.py)."""
    root = tmp_path_factory.mktemp("cluster")
    with InProcessCluster(root, nodes=3, dram="64MiB", master_args=FAST_MASTER) as c:
        yield c
