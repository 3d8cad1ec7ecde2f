"""`mooncake-admin`: operator commands (tokens, and the cluster views other modules add)."""
