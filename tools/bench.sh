#!/usr/bin/env bash
# make bench: the benchmarks (not tests). Each measures its configurations side by side in one run
# and reports ratios; absolute figures depend on the (shared, noisy) machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
echo "## Trace writer (format/): a synthetic LoRA-shaped op stream, 50 steps"
"$B/bin/bench_format"
echo
echo "## Replayer: analysis of a synthetic trace of 1 million ops"
"$B/bin/bench_replayer"
echo
if [ -x "$B/bin/bench_recorder" ]; then
  echo "## Recorder: the C++ LoRA step on the CPU"
  "$B/bin/bench_recorder"
  echo
fi
if [ -f samples/python/bench_peft.py ]; then
  echo "## Recorder: the PEFT LoRA step on the CPU (Python)"
  .venv/bin/python samples/python/bench_peft.py
fi
