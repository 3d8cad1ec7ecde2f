"""docs/PROTOCOL.md says what the code does: frames byte by byte, the grant, framed method ids."""

from __future__ import annotations

import re
from pathlib import Path

from mooncake_store.common.framed import METHODS
from mooncake_store.common.grant import GRANT_BYTES
from mooncake_store.common.wire import MAGIC, REQUEST, Op, pack_response

DOC = (Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md").read_text()


def hex_line(label: str) -> bytes:
    m = re.search(rf"^{label}\s+((?:[0-9a-f]{{2}} )+[0-9a-f]{{2}})", DOC, re.M)
    assert m, label
    return bytes.fromhex(m.group(1))


def test_the_worked_example_is_what_the_code_sends():
    assert hex_line("request header") == REQUEST.pack(MAGIC, Op.READ, 0, GRANT_BYTES, 0, 4096,
                                                      65536)  # fmt: skip
    assert hex_line("reply header") == pack_response(0, 65536)
    assert hex_line("refusal") == pack_response(-810, 20)
    assert REQUEST.pack(MAGIC, 0, 0, 0, 0, 0, 0)[:2] == b"\x43\x4d"


def test_op_codes_grant_size_and_framed_method_ids():
    ops = re.search(r"\| op \| u8 \| (.*?) \|", DOC)
    assert ops
    stated = {name: int(num) for num, name in re.findall(r"(\d+) ([A-Z]+)", ops.group(1))}
    assert stated == {op.name: op.value for op in Op}
    assert f"grant ({GRANT_BYTES} bytes)" in DOC.lower() or f"({GRANT_BYTES} bytes)" in DOC
    listed = re.findall(r"(\d+) (\w+)", DOC[DOC.index("The method id is") :].split("append")[0])
    assert listed and all(METHODS[int(i)] == name for i, name in listed)
