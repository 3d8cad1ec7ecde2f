"""Every daemon start-up failure exits non-zero with ONE line that names the cause and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent


def run(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / args[0]), *args[1:]], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = [x for x in result.stderr.splitlines() if x.strip() and " WARNING " not in x]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args,code,words",
    [
        (["mooncake-master", "--log-level", "verbose"], 2, ["--log-level", "'verbose'", "debug"]),
        (["mooncake-store", "--log-level", "verbose"], 2, ["--log-level", "info"]),
        (["mooncake-store", "--dram", "12XB"], 2, ["--dram", "like 512MiB"]),
        (["mooncake-store", "--dram", "1000TiB"], 1, ["--dram", "memory available", "smaller"]),
        (["mooncake-master", "--lease-ttl", "soon"], 2, ["--lease-ttl", "30s"]),
        (["mooncake-master", "--port", "x"], 2, ["--port", "integer"]),
        (["mooncake-cluster", "--nodes", "0"], 2, ["--nodes", "x>=1"]),
        (["mooncake-cluster", "--nodes", "4", "--dram", "1000TiB"], 2, ["fewer --nodes"]),
    ],
)
def test_bad_start_is_one_line(args, code, words, tmp_path):
    result = run(*args, cwd=tmp_path)
    assert result.returncode == code, result.stderr
    line = one_line(result)
    assert line.startswith(f"{args[0]}: error: ")
    for word in words:
        assert word in line, line


def test_locked_data_dir_is_one_line(tmp_path):
    first = subprocess.Popen(
        [str(BIN / "mooncake-master"), "--port", "0", "--data-dir", str(tmp_path / "d")],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert first.stdout is not None and "listening" in first.stdout.readline()
        result = run("mooncake-master", "--port", "0", "--data-dir", str(tmp_path / "d"),
                     cwd=tmp_path)  # fmt: skip
        assert result.returncode == 1
        line = one_line(result)
        assert "in use by another master" in line and "--data-dir" in line
    finally:
        first.kill()
        first.wait()


def test_cluster_names_the_daemon_that_failed_and_why(tmp_path):
    # A node that refuses its flags: the cluster reports that node's own error line, at once.
    result = run("mooncake-cluster", "--exit", "--data-dir", str(tmp_path / "c"), "--dram",
                 "16MiB", "--nvme", "1KiB", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    line = one_line(result)
    assert "node-0 exited with code 2 at start" in line
    assert "--nvme must be at least 1MiB" in line and "node-0.log" in line


@pytest.mark.timeout(240)
def test_node_says_serving_only_once_mounted(tmp_path):
    """A node started before its master logs that it waits, then 'mounted', then 'serving'."""
    import socket
    import threading

    from tests.conftest import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "node.log"
    node = subprocess.Popen(
        [str(BIN / "mooncake-store"), "--master", f"127.0.0.1:{port}", "--dram", "8MiB",
         "--node-id", "early", "--mount-timeout", "0.5s"],
        stdout=subprocess.PIPE, stderr=open(log, "wb"), text=True, cwd=tmp_path,
    )  # fmt: skip
    master = None
    try:
        # Generous deadlines: on a loaded machine a daemon's start-up alone can take many seconds.
        wait_until(lambda: "not serving yet: waiting to mount" in log.read_text(), timeout_s=90,
                   what="the node to say it waits for the master")  # fmt: skip
        assert node.poll() is None and "mounted on master" not in log.read_text()
        master = subprocess.Popen(
            # --auth off: a node started before its master has no token to present
            [str(BIN / "mooncake-master"), "--port", str(port), "--data-dir", str(tmp_path / "m"),
             "--auth", "off"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
        )  # fmt: skip
        assert node.stdout is not None
        lines: list[str] = []  # the node's start-up line, read without blocking the test
        threading.Thread(target=lambda: lines.append(node.stdout.readline()), daemon=True).start()
        wait_until(lambda: lines, timeout_s=120, what="the node's serving line")
        line = lines[0]
        assert "mooncake-store node early serving" in line
        assert "mounted on master" in log.read_text()  # logged before the serving line
    finally:
        for proc in (node, master):
            if proc is not None:
                proc.kill()
                proc.wait()


def test_node_waiting_for_its_master_stops_on_sigterm(tmp_path):
    """A node that never mounted (its master unreachable) ends on SIGTERM instead of retrying
    the mount forever."""
    import signal
    import socket

    from tests.conftest import wait_until

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = tmp_path / "node.log"
    node = subprocess.Popen(
        [str(BIN / "mooncake-store"), "--master", f"127.0.0.1:{port}", "--dram", "8MiB",
         "--node-id", "lonely", "--mount-timeout", "0.5s"],
        stdout=subprocess.DEVNULL, stderr=open(log, "wb"), cwd=tmp_path,
    )  # fmt: skip
    try:
        wait_until(lambda: "not serving yet: waiting to mount" in log.read_text(),
                   what="the node to say it waits for the master")  # fmt: skip
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=30) == 0, log.read_text()
        assert "stopped before mounting" in log.read_text()
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
