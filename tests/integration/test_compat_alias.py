"""The repo-root `compat/mooncake` alias package: `from mooncake.store import ...` loads this
store only when compat/ is put on the path on purpose, and never shadows a real Mooncake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[2] / "compat"
PROBE = "import mooncake.store as s; print(s.__file__); print(s.MooncakeDistributedStore)"


def run(pythonpath: list[Path], **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "MOONCAKE_STORE_COMPAT"}
    full.update(env, PYTHONPATH=os.pathsep.join(map(str, pythonpath)))
    return subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=full, timeout=60)  # fmt: skip


def fake_mooncake(root: Path) -> Path:
    package = root / "mooncake"
    package.mkdir()
    (package / "__init__.py").write_text("REAL = True\n")
    (package / "store.py").write_text("class MooncakeDistributedStore:\n    real = True\n")
    return root


def test_alias_loads_this_store_when_put_on_the_path():
    proc = run([COMPAT])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(COMPAT))
    assert "mooncake_store.compat" in proc.stdout


def test_a_real_mooncake_later_on_the_path_wins_with_a_warning(tmp_path):
    real = fake_mooncake(tmp_path)
    proc = run([COMPAT, real])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0].startswith(str(real))
    assert "a real Mooncake is installed" in proc.stderr
    forced = run([COMPAT, real], MOONCAKE_STORE_COMPAT="force")
    assert forced.stdout.splitlines()[0].startswith(str(COMPAT))


def test_a_real_mooncake_earlier_on_the_path_is_untouched(tmp_path):
    real = fake_mooncake(tmp_path)
    proc = run([real, COMPAT])
    assert proc.returncode == 0 and proc.stdout.splitlines()[0].startswith(str(real))


def test_not_on_the_path_unless_added():
    proc = run([])
    assert proc.returncode != 0 and "No module named 'mooncake'" in proc.stderr
