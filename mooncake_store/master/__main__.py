"""`python -m mooncake_store.master` runs the master daemon."""

from mooncake_store.master.cli import main

main()
