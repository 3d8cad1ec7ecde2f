"""`python -m mooncake_store.node` runs a store node daemon."""

from mooncake_store.node.cli import main

main()
