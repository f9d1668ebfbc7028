#!/usr/bin/env bash
# Builds torchrr against several torch releases and runs the end-to-end tests against each: the
# C++ suite (ctest: both samples with every planted bug, the catalog, the install check) and the
# Python suite (the catalog's cases, the PEFT sample's bugs, the API). One venv and one build
# directory per release under $MATRIX_DIR (default .matrix/, ignored by git), reused when run
# again. The default points: the oldest supported release, the GPU machine's (docs/gpu.md), and
# the pinned one (requirements.txt), the newest supported; each run the same way.
#
# Usage: tools/torch_matrix.sh [TORCH_VERSION ...]
# Prints one line per release (passed/failed counts of each suite) and writes them to
# $MATRIX_DIR/results.md, ready for docs/compatibility.md. Exit status 1 when any suite failed.
set -uo pipefail
cd "$(dirname "$0")/.."

# Absolute: the build and the tests are handed its paths from other directories.
MATRIX_DIR=$(realpath -m "${MATRIX_DIR:-.matrix}")
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}
pinned=$(sed -n 's/^torch==//p' requirements.txt)
versions=("$@")
((${#versions[@]})) || versions=($(printf '%s\n' 2.9.1 2.11.0 "$pinned" | awk '!seen[$0]++'))
mkdir -p "$MATRIX_DIR"
results="$MATRIX_DIR/results.md"
echo "| torch | Python | ctest | pytest | date |" > "$results"
echo "|---|---|---|---|---|" >> "$results"
failed=0

# Summaries of the two suites' logs: "N/M" passed.
ctest_counts() { sed -n 's/.*tests passed, \([0-9]*\) tests failed out of \([0-9]*\).*/\1 \2/p' "$1" |
                 awk '{printf "%d/%d", $2 - $1, $2}'; }
pytest_counts() { tail -n 1 "$1" | tr -d '=' ; }

for version in "${versions[@]}"; do
  venv="$MATRIX_DIR/torch-$version"
  build="$MATRIX_DIR/build-$version"
  log="$MATRIX_DIR/torch-$version.log"
  : > "$log"
  echo "matrix: torch $version (log: $log)"
  if [ ! -x "$venv/bin/python" ] || ! cmp -s requirements.txt "$venv/.requirements"; then
    "$PY" -m venv "$venv" >> "$log" 2>&1
    # The project's pins, with this torch in place of the pinned one.
    sed "s/^torch==.*/torch==$version/" requirements.txt > "$venv/requirements.txt"
    if ! "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt" >> "$log" 2>&1; then
      echo "matrix: torch $version: pip install failed (see $log)"
      echo "| $version | | install failed | | $(date -u +%F) |" >> "$results"
      failed=1
      continue
    fi
    cp requirements.txt "$venv/.requirements"
  fi
  python_version=$("$venv/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
  torch_version=$("$venv/bin/python" -c 'import torch; print(torch.__version__)')
  if ! { cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
           -DTORCHRR_PYTHON="$venv/bin/python" -DTORCHRR_BUILD_FUZZERS=OFF \
           -DTORCHRR_BUILD_BENCHMARKS=OFF -DTORCHRR_WITH_CUDA=OFF &&
         cmake --build "$build" -j "$JOBS"; } >> "$log" 2>&1; then
    echo "matrix: torch $torch_version: build failed (see $log)"
    echo "| $torch_version | $python_version | build failed | | $(date -u +%F) |" >> "$results"
    failed=1
    continue
  fi
  (cd "$build" && ctest -j "$JOBS" --output-on-failure -E '^fuzz') > "$MATRIX_DIR/ctest-$version.log" 2>&1 ||
    failed=1
  # The Python suite against this build: the package finds it through TORCHRR_BUILD_DIR. The venv
  # imports the checkout's package as make build's .venv does (tools/install_into_venv.sh), so that
  # the programs the tests start, and their own child processes, import the same torchrr.
  site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  echo "$PWD/recorder/python" > "$site/torchrr.pth"
  TORCHRR_BUILD_DIR="$build" "$venv/bin/python" -m pytest -q -p no:cacheprovider tests \
    > "$MATRIX_DIR/pytest-$version.log" 2>&1 || failed=1
  line="| $torch_version | $python_version | $(ctest_counts "$MATRIX_DIR/ctest-$version.log") |"
  line+=" $(pytest_counts "$MATRIX_DIR/pytest-$version.log") | $(date -u +%F) |"
  echo "$line" >> "$results"
  echo "matrix: $line"
done
cat "$results"
exit $failed
