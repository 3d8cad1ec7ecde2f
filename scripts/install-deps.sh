#!/usr/bin/env bash
# Installs the Debian package the chaos harness (scripts/chaos.py) needs: faketime (libfaketime,
# which steps the master's wall clock for the clock-step faults). `make test` and `make chaos`
# call it; it does nothing when libfaketime is already there. When it cannot be installed (not
# root, no apt-get, no network), it says so and exits 0: the harness then skips the clock-step
# faults and lists them under `faults_skipped`.
set -uo pipefail
has_libfaketime() {
  for lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1 \
             /usr/local/lib/faketime/libfaketime.so.1; do
    [ -e "$lib" ] && return 0
  done
  return 1
}
has_libfaketime && exit 0
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing Debian's faketime (libfaketime) for the chaos harness's clock steps"
  apt-get install -y -qq faketime >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq faketime >/dev/null; }
fi
has_libfaketime || echo "libfaketime is not installed and could not be: the chaos harness" \
                        "skips its clock steps"
exit 0
