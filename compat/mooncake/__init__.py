"""`mooncake` alias package: lets an engine's unchanged `from mooncake.store import ...` load
mooncake-store's compatibility layer (mooncake_store.compat).

It is on the path only when you put it there: `PYTHONPATH=/path/to/repo/compat` (it is not
installed with the package, so `pip install mooncake-store` never adds a `mooncake` module).
Even then it never shadows a real Mooncake by accident: when another `mooncake` package is
importable from the rest of sys.path (a Mooncake install), that one is loaded instead and a
warning says so.  Set MOONCAKE_STORE_COMPAT=force to use this store anyway, or
MOONCAKE_STORE_COMPAT=off to always defer to the real one (an ImportError without it).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import warnings

_HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the compat/ directory


def _other_mooncake() -> importlib.machinery.ModuleSpec | None:
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != _HERE]
    return importlib.machinery.PathFinder.find_spec("mooncake", rest)


_MODE = os.environ.get("MOONCAKE_STORE_COMPAT", "auto").strip().lower()
_REAL = None if _MODE == "force" else _other_mooncake()

if _REAL is not None and _REAL.loader is not None:
    warnings.warn(
        f"mooncake-store's compat/ directory is on sys.path, but a real Mooncake is installed "
        f"at {_REAL.origin}: loading that one (set MOONCAKE_STORE_COMPAT=force to use "
        "mooncake-store instead)",
        stacklevel=2,
    )
    _module = importlib.util.module_from_spec(_REAL)
    sys.modules[__name__] = _module  # the import system returns what sys.modules holds
    _REAL.loader.exec_module(_module)
elif _MODE == "off":
    raise ImportError("MOONCAKE_STORE_COMPAT=off and no other Mooncake is installed")
