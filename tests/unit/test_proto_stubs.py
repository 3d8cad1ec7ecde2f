"""The committed gRPC stubs match proto/ (regenerated into a temp dir and compared)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


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
        assert (tmp_path / name).read_text() == (committed / name).read_text(), (
            f"{name} is stale: run `make proto` and commit the result"
        )
