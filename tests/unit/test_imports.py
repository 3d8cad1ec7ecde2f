"""The daemons do not load the client SDK (the package's client names are imported lazily)."""

from __future__ import annotations

import subprocess
import sys


def test_daemons_do_not_import_the_client_sdk():
    code = (
        "import sys, mooncake_store.master.server, mooncake_store.node.server, "
        "mooncake_store.master.service;"
        "print(sorted(m for m in sys.modules if m.startswith('mooncake_store.client')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_client_names_still_import_from_the_package():
    import mooncake_store
    from mooncake_store import AsyncClient, Client, PutResult

    assert Client.__module__ == "mooncake_store.client.sync_client"
    assert AsyncClient and PutResult and mooncake_store.__version__
