"""`mooncake.store` as engines import it, served by mooncake-store (see ../mooncake/__init__.py
for when this alias is used, and docs/ENGINES.md)."""

from mooncake_store.compat import *  # noqa: F403
from mooncake_store.compat import __all__ as __all__
