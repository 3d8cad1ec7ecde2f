"""Generated gRPC stubs (from proto/mooncake_store.proto by `make proto`; never edit by hand)."""
