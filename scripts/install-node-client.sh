#!/usr/bin/env bash
# Installs what the Node.js conformance client (clients/node) needs: Node.js and npm (Debian's
# nodejs/npm packages when `node` is not on PATH) and the npm packages @grpc/grpc-js and
# @grpc/proto-loader (clients/node/node_modules, from package-lock.json). `make test` calls it;
# when Node.js cannot be installed, it says so and exits 0, and the conformance test skips.
set -uo pipefail
cd "$(dirname "$0")/../clients/node"
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing Debian's nodejs and npm"
    apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null
  fi
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "Node.js is not installed and could not be: the Node.js conformance test will skip"
  exit 0
fi
if [ -f node_modules/.installed ] && [ node_modules/.installed -nt package.json ] \
   && [ node_modules/.installed -nt package-lock.json ]; then
  exit 0
fi
if [ -f package-lock.json ]; then
  npm ci --no-audit --no-fund --loglevel=error
else
  npm install --no-audit --no-fund --loglevel=error
fi
if [ $? -ne 0 ]; then
  echo "npm could not install @grpc/grpc-js and @grpc/proto-loader: the Node.js conformance" \
       "test will skip"
  exit 0
fi
touch node_modules/.installed
echo "Node.js client ready: $(node --version), $(ls node_modules/@grpc | tr '\n' ' ')"
