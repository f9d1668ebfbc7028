#!/usr/bin/env python3
"""A bug report's trace fits in an issue attachment: one recorded step of the C++ LoRA sample at
Llama 2 7B's shape (`lora_step --shape 7b --tiny`: 32 layers, LoRA on attention and MLP, the
tensors small) is under GitHub's 25 MB attachment limit, and `torchrr info` gives its bytes per
op, in text and in --json.

`--tiny` must keep the op stream of the shape it shrinks, or the size says nothing about 7B:
one layer recorded with --tiny and with other sizes must hold the same ops.

Usage: check_7b_trace_size.py TORCHRR LORA_STEP WORK_DIR
Prints the trace's size and bytes per op (docs/benchmarks.md quotes them).
"""
import json
import os
import subprocess
import sys

torchrr, lora_step, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
# GitHub's limit for a file attached to an issue or a comment.
ATTACHMENT_LIMIT = 25 * 1000 * 1000
failures = []


def record(name, *options):
    """Records one step of lora_step with `options`; returns `torchrr info --json` of it."""
    trace = os.path.join(work, name + ".trr")
    rec = subprocess.run([torchrr, "record", "-o", trace, "--", lora_step, "--device", "cpu",
                          "--steps", "1", *options], capture_output=True, text=True)
    if rec.returncode != 0:
        sys.exit(f"FAIL record {name}: exit {rec.returncode}: {rec.stderr[-2000:]}")
    info = subprocess.run([torchrr, "info", "--json", trace], capture_output=True, text=True)
    if info.returncode != 0:
        sys.exit(f"FAIL info --json {name}: exit {info.returncode}: {info.stderr}")
    return trace, json.loads(info.stdout)


def ops(summary):
    return summary["records_per_kind"]["op"]


# The same ops whatever the sizes: --tiny shrinks the tensors, not the step.
_, tiny = record("one_layer_tiny", "--shape", "7b", "--tiny", "--layers", "1")
_, other = record("one_layer_other_sizes", "--shape", "7b", "--layers", "1", "--hidden", "256",
                  "--intermediate", "688", "--vocab", "1000", "--seq", "48")
if ops(tiny) != ops(other) or ops(tiny) == 0:
    failures.append(f"one layer: {ops(tiny)} ops with --tiny, {ops(other)} with other sizes")

trace, full = record("llama_7b_tiny", "--shape", "7b", "--tiny")
size, n = full["file_size"], ops(full)
# 32 layers: far more than one layer's step (whose ops are mostly the layer's).
if n < 16 * ops(tiny):
    failures.append(f"7b: {n} ops, too few for 32 layers (one layer: {ops(tiny)})")
if size >= ATTACHMENT_LIMIT:
    failures.append(f"7b: the trace is {size} bytes, over the {ATTACHMENT_LIMIT} limit")
per_op = full.get("bytes_per_op") or {}
if abs(per_op.get("file", 0) - size / max(n, 1)) > 0.01:
    failures.append(f"info --json: bytes_per_op {per_op}, expected file = {size} / {n}")
text = subprocess.run([torchrr, "info", trace], capture_output=True, text=True).stdout
if f"bytes per op:     {size / n:.2f} in the file" not in text:
    failures.append("info: no 'bytes per op' line with the file's bytes per op:\n" + text)

print(f"7b, one step: {size} bytes, {n} ops, {per_op.get('file', 0):.2f} bytes/op in the file "
      f"({per_op.get('compressed', 0):.2f} compressed, {per_op.get('raw', 0):.1f} raw)")
for failure in failures:
    print("FAIL " + failure)
sys.exit(1 if failures else 0)
