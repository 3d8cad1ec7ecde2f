"""The committed gRPC stubs match proto/ (regenerated into a temp dir and compared)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The stubs name the grpcio-tools that made them; a newer patch release makes the same code.
_STAMP = re.compile(r"^GRPC_GENERATED_VERSION = '[^']*'$", re.M)


def _without_stamp(text: str) -> str:
    return _STAMP.sub("GRPC_GENERATED_VERSION = ...", text)


def _version(text: str) -> tuple[int, ...]:
    found = re.search(r"^GRPC_GENERATED_VERSION = '([0-9.]+)'$", text, re.M)
    assert found, "the stubs name no GRPC_GENERATED_VERSION"
    return tuple(int(p) for p in found.group(1).split("."))


def test_committed_stubs_match_the_proto(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            f"-I{ROOT / 'proto'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(ROOT / "proto" / "mooncake_store.proto"),
        ],
        check=True,
    )
    grpc_file = tmp_path / "mooncake_store_pb2_grpc.py"
    grpc_file.write_text(
        grpc_file.read_text().replace(
            "import mooncake_store_pb2 as", "from . import mooncake_store_pb2 as"
        )
    )
    committed = ROOT / "mooncake_store" / "_proto"
    for name in ("mooncake_store_pb2.py", "mooncake_store_pb2.pyi", "mooncake_store_pb2_grpc.py"):
        fresh, kept = (tmp_path / name).read_text(), (committed / name).read_text()
        assert _without_stamp(fresh) == _without_stamp(kept), (
            f"{name} is stale: run `make proto` and commit the result"
        )
    # The committed stubs refuse a grpcio older than their stamp at import: it must not be
    # newer than the oldest grpcio pyproject.toml allows.
    stubs = (committed / "mooncake_store_pb2_grpc.py").read_text()
    pinned = re.search(r'"grpcio>=([0-9.]+)"', (ROOT / "pyproject.toml").read_text())
    assert pinned, "pyproject.toml names no grpcio minimum"
    assert _version(stubs) <= tuple(int(p) for p in pinned.group(1).split("."))
