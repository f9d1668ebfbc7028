#!/usr/bin/env bash
# make demo: records a LoRA training step with a planted bug, replays the trace, checks the
# patch `torchrr fix` proposes and writes the bug report page (torchrr report) that would be
# attached to an issue.
# DEMO=peft (default): the transformers + PEFT sample (Python). DEMO=cpp: the C++ libtorch sample.
# TORCHRR, PY, BUILD and DEMO_DIR name the CLI, the Python, the build tree and the output folder
# (tests/python/test_report.py runs this script against its own build and a temporary folder).
set -uo pipefail
cd "$(dirname "$0")/.."
TORCHRR=${TORCHRR:-.venv/bin/torchrr}
PY=${PY:-.venv/bin/python}
BUILD=${BUILD:-build}
DEMO_DIR=${DEMO_DIR:-demo}
DEMO=${DEMO:-peft}
BUG=${BUG:-inplace_activation}
mkdir -p "$DEMO_DIR"
if [ "$DEMO" = cpp ]; then
  trace=$DEMO_DIR/lora_step.trr
  cmd=("$BUILD/bin/lora_step" --device cpu --steps 2 --bug "$BUG")
  what="the C++ LoRA step"
else
  trace=$DEMO_DIR/peft_lora.trr
  cmd=("$PY" samples/python/peft_lora.py --device cpu --steps 2 --bug "$BUG")
  what="the PEFT LoRA step (tiny Llama, transformers + peft)"
fi
page=$DEMO_DIR/report.html
echo "== Recording $what with the planted bug '$BUG'; PyTorch raises in backward, and"
echo "   torchrr names the lines as the program ends:"
echo "   \$ torchrr record -o $trace -- ${cmd[*]}"
# The program's losses and its error (its traceback left out), then torchrr's verdict whole.
"$TORCHRR" record -o "$trace" -- "${cmd[@]}" 2>&1 |
  awk '/^torchrr: [0-9]+ violations? in /{verdict = 1}
       verdict {print; next}
       tolower($0) ~ /error|loss/ && shown++ < 4 {print substr($0, 1, 200)}'
echo
echo "== The whole replay: which op, on which line, changed which saved tensor, and how:"
echo "   \$ torchrr replay $trace"
"$TORCHRR" replay "$trace"
rc=$?
[ "$rc" = 1 ] || { echo "demo: expected the replay to find the planted bug (exit 1), got $rc"; exit 1; }
echo
if [ "$DEMO" = cpp ]; then
  echo "== The fix: a patch for the culprit's line, checked by building the program again from"
  echo "   a patched copy of the file and re-running it (samples/ and $BUILD/ are not written):"
else
  echo "== The fix: a patch for the culprit's line, checked by re-running the program on a"
  echo "   patched copy of its folder (the files under samples/ are not written):"
fi
echo "   \$ torchrr fix $trace --check"
"$TORCHRR" fix "$trace" --check --timeout 300
rc=$?
[ "$rc" = 0 ] || { echo "demo: expected the patch to check clean (exit 0), got $rc"; exit 1; }
echo
echo "== The bug report, one HTML page to open in a browser or attach to an issue:"
echo "   \$ torchrr report $trace -o $page"
"$TORCHRR" report "$trace" -o "$page" || { echo "demo: torchrr report failed"; exit 1; }
echo
echo "The trace: $trace ($(du -h "$trace" | cut -f1)). The report: $page ($(du -h "$page" | cut -f1))."
echo "Also try: torchrr info $trace; DEMO=cpp make demo"
