#!/usr/bin/env bash
# make demo: records the sample LoRA training step with a planted bug and replays the trace.
set -uo pipefail
cd "$(dirname "$0")/.."
TORCHRR=.venv/bin/torchrr
BUG=${BUG:-inplace_activation}
mkdir -p demo
echo "== Recording the C++ LoRA step with the planted bug '$BUG' (PyTorch will raise) =="
echo "   \$ torchrr record -o demo/lora_step.trr -- build/bin/lora_step --device cpu --steps 2 --bug $BUG"
"$TORCHRR" record -o demo/lora_step.trr -- build/bin/lora_step --device cpu --steps 2 --bug "$BUG" \
  2>&1 | grep -v "^frame #\|^Exception raised from" | head -5
echo
echo "== Replaying it: which op, on which line, changed which saved tensor =="
echo "   \$ torchrr replay demo/lora_step.trr"
"$TORCHRR" replay demo/lora_step.trr
rc=$?
[ "$rc" = 1 ] || { echo "demo: expected the replay to find the planted bug (exit 1), got $rc"; exit 1; }
echo
echo "The trace: demo/lora_step.trr ($(du -h demo/lora_step.trr | cut -f1)); try: torchrr info demo/lora_step.trr"
