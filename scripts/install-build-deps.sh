#!/usr/bin/env bash
# Installs what `pip install` needs to build the package's C kernel (mooncake_store/native):
# a C compiler and Python's headers.  `make` calls it before installing.  It does nothing when
# both are there.  When they cannot be installed (not root, no apt-get, no network) it says so
# and exits 0: the package then installs without the kernel and copies with numpy (slower,
# the same bytes and checksums).
set -uo pipefail
PYTHON=${PYTHON:-python3}
has_headers() {
  local inc
  inc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null) \
    && [ -e "$inc/Python.h" ]
}
has_cc() {  # the compiler setuptools will call: sysconfig's CC (Debian: x86_64-linux-gnu-gcc)
  local cc
  cc=$("$PYTHON" -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])' \
       2>/dev/null) || cc=cc
  command -v "$cc" >/dev/null
}
has_cc && has_headers && exit 0
if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "installing Debian's gcc and python3-dev for the C copy kernel"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq gcc python3-dev >/dev/null 2>&1 \
    || { apt-get update -qq && apt-get install -y -qq gcc python3-dev >/dev/null; }
fi
has_cc && has_headers || echo "no C compiler or Python headers: mooncake-store installs" \
                              "without its C copy kernel (copies use numpy)"
exit 0
