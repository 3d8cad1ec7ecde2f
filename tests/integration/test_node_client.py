"""Node.js conformance: a JavaScript client (clients/node) puts and gets over gRPC alone, and
reads what the Python SDK wrote while the SDK reads what it wrote.

`make test` installs its npm packages (scripts/install-node-client.sh); this test runs that
script itself when they are missing and skips only when Node.js cannot be installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mooncake_store import Client, ObjectNotFoundError
from mooncake_store.admin.ops import master_metadata
from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER

ROOT = Path(__file__).resolve().parents[2]
CLIENT_DIR = ROOT / "clients" / "node"


def node_ready() -> str | None:
    """The path of `node` once the client's packages are installed, or None."""
    if not (CLIENT_DIR / "node_modules" / ".installed").exists():
        subprocess.run(["bash", str(ROOT / "scripts" / "install-node-client.sh")],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    node = shutil.which("node")
    if node is None or not (CLIENT_DIR / "node_modules" / "@grpc" / "grpc-js").is_dir():
        return None
    return node


def test_node_client_and_python_sdk_read_each_others_blocks(tmp_path):
    node = node_ready()
    if node is None:
        pytest.skip("Node.js and its npm packages could not be installed")
    sizes = [1, 100_000, 3 * (1 << 20) + 17]
    with InProcessCluster(
        tmp_path / "c", nodes=2, dram="32MiB", master_args=FAST_MASTER
    ) as cluster:
        written_by_python = {}
        with Client(cluster.master_address) as store:
            for size in sizes:
                value = os.urandom(size)
                store.put(f"py/{size}", value, replicas=2 if size > 1 else 1)
                written_by_python[f"py/{size}"] = hashlib.sha256(value).hexdigest()
        plan = {
            "read": written_by_python,
            "write": [{"key": f"js/{s}", "size": s, "replicas": 2 if s > 1 else 1}
                      for s in sizes],
            "missing": "js/never-written",
        }  # fmt: skip
        plan_path = tmp_path / "plan.json"
        plan_path.write_text(json.dumps(plan))
        env = dict(os.environ)
        md = master_metadata(cluster.master_address)  # the master's auth: a client token
        if md:
            env["MOONCAKE_TOKEN"] = md[0][1].removeprefix("Bearer ")
        run = subprocess.run(
            [node, str(CLIENT_DIR / "conformance.js"), cluster.master_address, str(plan_path)],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        report = json.loads(run.stdout)
        assert report["failures"] == []
        assert sorted(report["read"]) == sorted(written_by_python)
        assert report["missing_error"] == ObjectNotFoundError.code  # a status, not a reset
        with Client(cluster.master_address) as store:
            for key, digest in report["written"].items():
                assert hashlib.sha256(store.get(key)).hexdigest() == digest
            assert sorted(report["written"]) == sorted(f"js/{s}" for s in sizes)
