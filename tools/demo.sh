#!/usr/bin/env bash
# make demo: records a LoRA training step with a planted bug, then replays the trace.
# DEMO=peft (default): the transformers + PEFT sample (Python). DEMO=cpp: the C++ libtorch sample.
set -uo pipefail
cd "$(dirname "$0")/.."
TORCHRR=.venv/bin/torchrr
DEMO=${DEMO:-peft}
BUG=${BUG:-inplace_activation}
mkdir -p demo
if [ "$DEMO" = cpp ]; then
  trace=demo/lora_step.trr
  cmd=(build/bin/lora_step --device cpu --steps 2 --bug "$BUG")
  what="the C++ LoRA step"
else
  trace=demo/peft_lora.trr
  cmd=(.venv/bin/python samples/python/peft_lora.py --device cpu --steps 2 --bug "$BUG")
  what="the PEFT LoRA step (tiny Llama, transformers + peft)"
fi
echo "== Recording $what with the planted bug '$BUG'; PyTorch raises in backward:"
echo "   \$ torchrr record -o $trace -- ${cmd[*]}"
"$TORCHRR" record -o "$trace" -- "${cmd[@]}" 2>&1 | grep -iE "error|loss" | cut -c1-200 | head -4
echo
echo "== Replaying it: which op, on which line, changed which saved tensor:"
echo "   \$ torchrr replay $trace"
"$TORCHRR" replay "$trace"
rc=$?
[ "$rc" = 1 ] || { echo "demo: expected the replay to find the planted bug (exit 1), got $rc"; exit 1; }
echo
echo "The trace: $trace ($(du -h "$trace" | cut -f1)). Also try: torchrr info $trace; DEMO=cpp make demo"
