"""The store node: a shared-memory DRAM pool mounted on the master and served on the data path."""
