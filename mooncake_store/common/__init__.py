"""Code shared by the master, the store nodes and the client: errors, config, wire formats."""
