#!/usr/bin/env bash
# Start a master and two store nodes for engines on this host (mooncake-store's own daemons;
# nothing of Mooncake is needed).  Across hosts, run one mooncake-store per host with
# --master <master host>:50051 --host <this host's address>.
set -euo pipefail
DATA=${DATA:-./mooncake-data}
mkdir -p "$DATA"
mooncake-master --host 127.0.0.1 --port 50051 --data-dir "$DATA/master" &
sleep 1
mooncake-store --master 127.0.0.1:50051 --host 127.0.0.1 --dram 4GiB --node-id node-a &
mooncake-store --master 127.0.0.1:50051 --host 127.0.0.1 --dram 4GiB --node-id node-b &
wait
