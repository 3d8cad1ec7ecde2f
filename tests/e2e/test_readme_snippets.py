"""The README's SDK and KV snippets run as written against a real cluster (its address swapped
in for 127.0.0.1:50051)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mooncake_store.cluster_inprocess import InProcessCluster
from tests.conftest import FAST_MASTER

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SNIPPETS = [b for b in re.findall(r"```python\n(.*?)```", README, re.S)
            if 'Client("127.0.0.1:50051")' in b]  # fmt: skip


@pytest.fixture(scope="module")
def readme_cluster(tmp_path_factory):
    with InProcessCluster(tmp_path_factory.mktemp("readme"), nodes=2, dram="64MiB",
                          master_args=FAST_MASTER) as cluster:  # fmt: skip
        yield cluster


def test_the_readme_has_the_sdk_and_kv_snippets():
    assert len(SNIPPETS) >= 2
    assert any("mooncake_store.kv" in s for s in SNIPPETS)


@pytest.mark.parametrize("index", range(len(SNIPPETS)))
def test_readme_snippet_runs(readme_cluster, index, tmp_path):
    code = SNIPPETS[index].replace("127.0.0.1:50051", readme_cluster.master_address)
    script = tmp_path / "snippet.py"
    script.write_text(code)
    for _ in range(2):  # twice: the second run meets the first one's keys (dedup, prefix hits)
        run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                             timeout=120)  # fmt: skip
        assert run.returncode == 0, run.stderr
