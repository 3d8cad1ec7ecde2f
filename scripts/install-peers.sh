#!/usr/bin/env bash
# Installs the peers scripts/bench_compare.py measures against (`make peers`): Debian's
# redis-server, the libraries Mooncake's wheel links against (libibverbs is needed even for
# its TCP-only build), and a separate venv (.peers-venv) with Mooncake's Python package and
# redis-py. Tests never need any of this.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! ldconfig -p | grep -q 'libibverbs.so.1 '; then
  apt-get update -qq
  apt-get install -y -qq redis-server libibverbs1 librdmacm1 libnuma1
fi
test -x .peers-venv/bin/python || python3 -m venv .peers-venv
.peers-venv/bin/pip install --quiet --upgrade pip
.peers-venv/bin/pip install --quiet mooncake-transfer-engine-non-cuda redis hiredis numpy
.peers-venv/bin/python -c "import mooncake.store, redis; print('peers installed')"
