#!/usr/bin/env bash
# Installs what torchrr needs on a fresh Debian machine: the Debian packages (apt-get) and a .venv with
# the pinned PyPI packages of requirements.txt. Idempotent: does nothing that is already done.
set -euo pipefail
cd "$(dirname "$0")/.."

# graphviz lays out the report's graph; chromium renders the report in tests/python/test_report.py.
DEBS=(cmake ninja-build g++ clang libclang-rt-dev make python3-venv
      flatbuffers-compiler libflatbuffers-dev libzstd-dev libboost-stacktrace-dev libgtest-dev
      libcli11-dev nlohmann-json3-dev libfmt-dev libxxhash-dev libbenchmark-dev libunwind8
      zstd graphviz chromium)

missing=()
for p in "${DEBS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing Debian packages: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

PY=${PYTHON:-python3}
stamp=.venv/.requirements.stamp
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
if [ ! -f "$stamp" ] || ! cmp -s requirements.txt "$stamp"; then
  echo "setup: installing pinned Python packages (requirements.txt)"
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -r requirements.txt
  cp requirements.txt "$stamp"
fi
