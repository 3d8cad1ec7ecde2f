"""The README says what the code does: error list, KV block size, data kept in the repo."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import mooncake_store.common.errors as errors
from mooncake_store.kv import KVLayout

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_every_error_class_is_in_the_readme():
    classes = [
        name
        for name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.MooncakeError)
    ]
    missing = [name for name in classes if f"`{name}`" not in README]
    assert not missing, f"README.md's error list misses {missing}"


def test_kv_example_states_the_real_block_size():
    layout = KVLayout(num_layers=32, num_kv_heads=8, head_dim=128, dtype="float16",
                      tokens_per_block=16, tp_rank=0, tp_size=2)  # fmt: skip
    stated = re.search(r"tp_size=2\)\s+# block_bytes == (\d+) MiB", README)
    assert stated and int(stated.group(1)) * 2**20 == layout.block_bytes


def test_scripts_use_only_data_in_the_repository():
    trace = ROOT / "data" / "traces" / "synthetic_trace.jsonl"
    assert trace.is_file() and len(trace.read_text().splitlines()) == 3993
    assert "Apache License 2.0" in (ROOT / "data" / "traces" / "README.md").read_text()
    for script in (ROOT / "scripts").rglob("*.py"):
        text = script.read_text()
        assert '"shared"' not in text and "../shared" not in text, script
    assert "../shared" not in README


def test_readme_says_commands_run_in_the_venv():
    assert ". .venv/bin/activate" in README and ".venv/bin/" in README
