#!/usr/bin/env bash
# torchrr's GPU check: one prepared script for a CUDA machine with torch installed (the reference:
# an H200 with torch 2.11 + cu130, transformers and peft, no network), at most 8 minutes.
#
#   tools/gpu_bundle.sh           # here, once: the libraries the GPU machine lacks (.gpu-deps/)
#   tests/gpu/run.sh              # there: build, test, record, measure; prints a summary
#
# It builds torchrr against that machine's torch (python3, or $PYTHON), runs the CUDA tests
# (kernels/ fingerprints against the CPU reference, CUPTI, the recorder), records and replays both
# LoRA samples on CUDA and on the CPU with each planted bug and with none and compares the
# verdicts, checks CUDA recording itself (tests/gpu/check_cuda_recording.py), measures the
# fingerprint's bandwidth and the recorder's overhead on a bf16 CUDA PEFT LoRA step, and prints a
# summary. Logs and the summary go to $OUT (the device tool's output folder) or ./gpu-out.
# Exit status: 0 all passed, 1 a check failed, 2 no CUDA device.
#
# TORCHRR_GPU_DRY_RUN=1 runs it all on a machine without a GPU, CPU against CPU, to check the
# script itself before spending device time.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
BUILD=${BUILD:-$ROOT/build-gpu}
JOBS=$(nproc)
START=$(date +%s)
declare -a SUMMARY
FAIL=0

note() { echo "== $* ($(($(date +%s) - START)) s)"; }
# stage NAME TIMEOUT CMD...: runs CMD with its output in $OUT/NAME.log (tail shown), records the
# result.
stage() {
  local name=$1 limit=$2
  shift 2
  note "$name"
  timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$OUT/$name.log"
  if [ $rc -eq 0 ]; then
    SUMMARY+=("PASS  $name")
  else
    SUMMARY+=("FAIL  $name (exit $rc$([ $rc -eq 124 ] && echo ': timed out'); $OUT/$name.log)")
    FAIL=1
  fi
  return $rc
}

note "machine"
{
  date -u +"%Y-%m-%d %H:%M UTC"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())"
  nproc
} | tee "$OUT/machine.txt"
DEVICES=cpu,cuda
BUILD_LIMIT=360
BENCH=(--device cuda --dtype bfloat16 --hidden 2048 --layers 8 --seq 1024 --batch 8 --vocab 32000
       --rounds 3 --steps 5)
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  if [ "${TORCHRR_GPU_DRY_RUN:-0}" != 1 ]; then
    echo "no CUDA device: nothing to check here"
    exit 2
  fi
  echo "dry run: no CUDA device; CPU against CPU"
  DEVICES=cpu
  BENCH=(--device cpu --rounds 1 --steps 1)
  BUILD_LIMIT=3000  # A small machine's CPUs.
fi

source tests/gpu/deps.sh
torchrr_use_gpu_deps "$ROOT"

stage configure 180 cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTORCHRR_PYTHON="$(command -v "$PY")" -DTORCHRR_BUILD_FUZZERS=OFF \
  -DTORCH_CUDA_ARCH_LIST=9.0 -DTORCHRR_CUDA_ARCHITECTURES="90" || true
stage build "$BUILD_LIMIT" ninja -C "$BUILD" -j "$JOBS" torchrr torchrr_recorder torchrr_preload lora_step \
  kernels_test bench_fingerprint cupti_test recorder_test replayer_test || {
  printf '%s\n' "${SUMMARY[@]}" | tee "$OUT/summary.txt"
  exit 1
}
[ -e "$BUILD/lib/libtorchrr_python_nodes.so" ] || ninja -C "$BUILD" torchrr_python_nodes >/dev/null 2>&1
export TORCHRR_BUILD_DIR=$BUILD
export PYTHONPATH=$ROOT/recorder/python${PYTHONPATH:+:$PYTHONPATH}
TORCHRR=$BUILD/bin/torchrr

stage kernels_test 120 "$BUILD/bin/kernels_test"
stage cupti_test 60 "$BUILD/bin/cupti_test"
stage replayer_test 60 "$BUILD/bin/replayer_test"
# The recorder's tests in a process with a GPU: every session also starts CUPTI.
stage recorder_test 180 "$BUILD/bin/recorder_test"
stage cuda_recording 180 "$PY" tests/gpu/check_cuda_recording.py
stage samples 300 "$PY" tests/gpu/compare_samples.py "$TORCHRR" "$BUILD/bin/lora_step" "$PY" \
  samples/python/peft_lora.py "$OUT/samples" --devices "$DEVICES" --jobs 8
stage bench_fingerprint 120 "$BUILD/bin/bench_fingerprint"
# A bf16 Llama-shaped PEFT LoRA step sized to keep the GPU busy (about 0.6 B parameters).
stage bench_peft_cuda 240 "$PY" samples/python/bench_peft.py "${BENCH[@]}" \
  --configs plain,torchrr,profiler --verify-saved

note "summary"
{
  echo "torchrr GPU check, $(head -1 "$OUT/machine.txt"), $(sed -n 2p "$OUT/machine.txt")"
  printf '%s\n' "${SUMMARY[@]}"
  echo
  echo "fingerprint:"; sed -n '/^where/,$p' "$OUT/bench_fingerprint.log" 2>/dev/null || true
  echo "PEFT step:"; grep -E "^\|" "$OUT/bench_peft_cuda.log" 2>/dev/null || true
  echo "samples: $(tail -1 "$OUT/samples.log" 2>/dev/null)"
  echo "total $(($(date +%s) - START)) s"
} | tee "$OUT/summary.txt"
exit $FAIL
