#!/usr/bin/env bash
# make bench: the benchmarks (not tests). Each measures its configurations side by side in one run
# and reports ratios; absolute figures depend on the (shared, noisy) machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build}
echo "## Trace writer (format/): a synthetic LoRA-shaped op stream, 50 steps"
"$B/bin/bench_format"
echo
if [ -x .venv/bin/torchrr ] && [ -x "$B/bin/lora_step" ]; then
  echo "## Trace size: recorded traces written again with step coding off and on (the writer's default)"
  T=$(mktemp -d)
  .venv/bin/torchrr record -o "$T/cpp.trr" -- "$B/bin/lora_step" --device cpu --steps 20 >/dev/null
  .venv/bin/torchrr record -o "$T/7b.trr" -- "$B/bin/lora_step" --device cpu --steps 1 \
    --shape 7b --tiny >/dev/null
  .venv/bin/torchrr record -o "$T/peft.trr" -- .venv/bin/python samples/python/peft_lora.py \
    --device cpu --steps 100 >/dev/null
  for t in cpp 7b peft; do "$B/bin/bench_format" --trace "$T/$t.trr"; done
  rm -rf "$T"
  echo
fi
echo "## Replayer: analysis of a synthetic trace of 1 million ops"
"$B/bin/bench_replayer"
echo
if [ -x "$B/bin/bench_recorder" ]; then
  echo "## Recorder: the C++ LoRA step on the CPU"
  "$B/bin/bench_recorder" --floor
  echo
  echo "## Recorder: the same step, a larger model (ops about 10x longer)"
  "$B/bin/bench_recorder" --hidden 512 --seq 128 --rounds 5 --steps-per-round 3
  echo
fi
if [ -f samples/python/bench_peft.py ]; then
  echo "## Recorder: the PEFT LoRA step on the CPU (Python)"
  .venv/bin/python samples/python/bench_peft.py
  echo
  echo "## Recorder: short-lived tensors (a tight loop of x.add(1))"
  .venv/bin/python samples/python/bench_churn.py
  echo
  echo "## Recorder: a whole run, recorded whole and with --keep-last 2 (the flight recorder)"
  .venv/bin/python samples/python/bench_keep_last.py
fi
if [ -x "$B/bin/bench_fingerprint" ]; then
  echo
  echo "## Storage fingerprints (kernels/): CPU, and CUDA next to a device copy when a GPU is here"
  "$B/bin/bench_fingerprint"
fi
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  echo
  echo "## Recorder: a bf16 PEFT LoRA step on CUDA (target: torchrr at most 1.05x)"
  .venv/bin/python samples/python/bench_peft.py --device cuda --dtype bfloat16 --hidden 2048 \
    --layers 8 --seq 1024 --batch 8 --vocab 32000 --rounds 3 --steps 5 \
    --configs plain,torchrr,profiler --verify-saved
fi
