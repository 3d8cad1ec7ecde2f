"""The master: metadata and routing only (object table, placement, persistence, gRPC service)."""
