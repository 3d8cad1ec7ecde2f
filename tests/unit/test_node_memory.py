"""--dram is checked against the memory available, and big pools report pre-faulting progress."""

from __future__ import annotations

import logging
import mmap

from mooncake_store.node.memory import available_memory_bytes, memory_problem, progress_logger
from mooncake_store.node.pool import prefault


def test_dram_larger_than_available_memory_is_refused_with_the_fix(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 8000000 kB\nMemAvailable:    4194304 kB\n")
    available = available_memory_bytes(meminfo)
    assert available == 4 * 2**30
    assert memory_problem(2 * 2**30, available) is None
    problem = memory_problem(10 * 2**40, available)
    assert problem and "--dram 10.0 TiB" in problem and "4.0 GiB" in problem
    assert "pass a smaller --dram" in problem
    assert memory_problem(10 * 2**40, None) is None  # unknown: the kernel decides
    assert available_memory_bytes(tmp_path / "missing") is None


def test_prefault_reports_progress_once_a_second_for_big_pools(caplog):
    now = [0.0]
    assert progress_logger("pool", 64 * 2**20) is None  # small pools stay quiet
    progress = progress_logger("DRAM pool", 4 * 2**30, clock=lambda: now[0])
    assert progress is not None
    with caplog.at_level(logging.INFO, logger="mooncake.node"):
        for done in range(1, 65):  # 64 chunks of 64 MiB, 0.1 s apart
            now[0] += 0.1
            progress(done * 64 * 2**20, 4 * 2**30)
    lines = [r.getMessage() for r in caplog.records]
    assert 5 <= len(lines) <= 8  # about one a second, and the last one
    assert lines[-1].startswith("DRAM pool: 4.0 GiB of 4.0 GiB pre-faulted (100%")


def test_prefault_touches_every_chunk_and_reports_each():
    size = 3 * 2**20 + 4096
    region = mmap.mmap(-1, size)
    seen = []
    prefault(region, size, lambda done, total: seen.append((done, total)))
    assert seen[-1] == (size, size) and len(seen) == 1  # one 64 MiB chunk covers it
    region.close()
