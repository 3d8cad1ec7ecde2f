# Environment for an engine that uses this store through its Mooncake connector.
# Source it before starting vLLM / SGLang / LMCache:  . examples/engines/env.sh
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)

# `from mooncake.store import MooncakeDistributedStore` loads mooncake_store.compat
# (only because compat/ is put on the path here; a real Mooncake install still wins).
export PYTHONPATH="$REPO/compat${PYTHONPATH:+:$PYTHONPATH}"

# vLLM's MooncakeStoreConnector reads its JSON config from here.
export MOONCAKE_CONFIG_PATH="$REPO/examples/engines/mooncake.json"

# SGLang's HiCache Mooncake backend reads these (or SGLANG_HICACHE_MOONCAKE_CONFIG_PATH).
export MOONCAKE_MASTER=127.0.0.1:50051
export MOONCAKE_PROTOCOL=tcp               # "rdma" is accepted too (moves over shm/TCP here)
export MOONCAKE_TE_META_DATA_SERVER=P2PHANDSHAKE   # not used by this store
export MOONCAKE_GLOBAL_SEGMENT_SIZE=4gb    # memory each rank contributes (0: none)
export MOONCAKE_LOCAL_HOSTNAME=127.0.0.1
