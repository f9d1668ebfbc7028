#!/usr/bin/env python3
"""Step time of the PEFT LoRA sample: plain, under torchrr (Python stacks on; also without its
NaN/Inf check: --no-check-finite; also with the ops it folds by default into the op around them:
--all-ops), under
torch.autograd.set_detect_anomaly(True), and under torch.profiler.profile(record_shapes=True,
with_stack=True). The configurations run interleaved in rounds within one process, so the
machine's noise hits them alike; the table gives medians and ratios to plain. Each round starts
with plain and rotates the order of the others: whichever ran right after plain was measured
5-15% slower than in another place, so no configuration always takes that place. The paired
ratio is the median over rounds of each round's time over that round's plain time: the machine's
load drifts over seconds, and a round's configurations run within a fraction of one.

The step columns time the steps inside the context only. The window columns time what a user waits
for to get the recording: entering the context, the warm step, the steps, and leaving it, per step
(K+1 steps). Leaving is where the profiler builds its events (and their stacks), which torchrr
does on its writer thread while the steps run; torchrr's trace is complete on disk when it leaves.

On the CPU by default (float32). ``--device cuda --dtype bfloat16`` with a larger model is the
GPU benchmark (tests/gpu/run.sh); a CUDA step is timed to its end (synchronized).

Usage: bench_peft.py [--rounds R] [--steps K] [--threads T] [--hidden H] [--layers L] [--seq S]
                     [--batch B] [--vocab V] [--device cpu|cuda] [--dtype float32|bfloat16]
                     [--configs plain,torchrr,torchrr-nofinite,torchrr-nomodules,torchrr-all,
                                anomaly,profiler]
                     [--verify-saved]

--configs also takes torchrr-core (no module names, no Python stacks) and profiler-nostacks
(record_shapes only): the two tools' collection before stacks, side by side.
"""
import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import peft_lora  # noqa: E402
import torchrr  # noqa: E402
from torchrr import _modules  # noqa: E402


@contextlib.contextmanager
def record_without_modules(path, **options):
    """torchrr as configured "torchrr", without the module hooks that name each op's nn.Module:
    what naming modules costs, side by side."""
    with torchrr.record(path, native_stacks=False, **options):
        _modules.uninstall()
        yield


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    peft_lora.add_model_arguments(parser, hidden=128, vocab=512, seq=64, batch=4)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--configs",
                        default="plain,torchrr,torchrr-nofinite,torchrr-nomodules,torchrr-all,"
                                "anomaly,profiler")
    parser.add_argument("--verify-saved", action="store_true",
                        help="also time torchrr with --verify-saved")
    args = parser.parse_args()
    # Checked before the model is built; the traces go into `tmp`, made below.
    available = {
        "plain": ("plain", contextlib.nullcontext),
        "torchrr": ("torchrr (Python stacks)",
                    lambda: torchrr.record(os.path.join(tmp, "run.trr"), native_stacks=False)),
        # Without the NaN/Inf check (--no-check-finite): what the check costs, side by side.
        "torchrr-nofinite": ("torchrr, no NaN/Inf check",
                             lambda: torchrr.record(os.path.join(tmp, "nofinite.trr"),
                                                    native_stacks=False, check_finite=False)),
        # Also the ops folded into the op around them (RecorderOptions::all_ops).
        "torchrr-all": ("torchrr, all ops",
                        lambda: torchrr.record(os.path.join(tmp, "all.trr"), native_stacks=False,
                                               all_ops=True)),
        "torchrr-nomodules": ("torchrr, no module names",
                              lambda: record_without_modules(os.path.join(tmp, "nomod.trr"))),
        # The op callbacks alone (no module names, no Python stacks), against the profiler's
        # without stacks: what each tool's collection costs before stacks.
        "torchrr-core": ("torchrr, no module names, no Python stacks",
                         lambda: record_without_modules(os.path.join(tmp, "core.trr"),
                                                        python_stacks=False)),
        "anomaly": ("anomaly mode", lambda: torch.autograd.set_detect_anomaly(True)),
        "profiler": ("profiler (shapes, stacks)",
                     lambda: torch.profiler.profile(record_shapes=True, with_stack=True)),
        "profiler-nostacks": ("profiler (shapes)",
                              lambda: torch.profiler.profile(record_shapes=True)),
    }
    wanted = args.configs.split(",")
    unknown = [name for name in wanted if name not in available]
    if unknown:
        parser.error(f"--configs: unknown {', '.join(unknown)} "
                     f"(known: {', '.join(available)})")
    torch.set_num_threads(args.threads)
    model = peft_lora.build_model(args).to(getattr(torch, args.dtype))
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    input_ids = torch.randint(1, args.vocab, (args.batch, args.seq))
    input_ids = input_ids.to(args.device)
    cuda = args.device == "cuda"

    def step():
        logits = model(input_ids=input_ids).logits
        loss = peft_lora.next_token_loss(logits, input_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    def sync():
        if cuda:
            torch.cuda.synchronize()

    tmp = tempfile.mkdtemp(prefix="torchrr_bench_peft_")
    if "plain" not in wanted:
        wanted.insert(0, "plain")
    configs = dict(available[name] for name in wanted)
    if args.verify_saved:
        configs["torchrr --verify-saved"] = lambda: torchrr.record(
            os.path.join(tmp, "verify.trr"), native_stacks=False, verify_saved=True)
    times = {name: [] for name in configs}
    windows = {name: [] for name in configs}
    for _ in range(2):
        step()
    sync()
    others = [name for name in configs if name != "plain"]
    for round_index in range(args.rounds):
        shift = round_index % max(len(others), 1)
        for name in ["plain"] + others[shift:] + others[:shift]:
            make = configs[name]
            window_start = time.perf_counter()
            with make():
                step()  # Warm: the recorder interns, the profiler sets up.
                sync()
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                sync()
                times[name].append((time.perf_counter() - start) / args.steps * 1e3)
            sync()
            windows[name].append((time.perf_counter() - window_start) / (args.steps + 1) * 1e3)
    plain = statistics.median(times["plain"])
    where = (f"on {torch.cuda.get_device_name()}" if cuda
             else f"on the CPU ({args.threads} thread(s))")
    print(f"PEFT LoRA step {where}, {args.dtype}, hidden {args.hidden}, {args.layers} layers, "
          f"seq {args.seq}, batch {args.batch}, {args.rounds} rounds x {args.steps} steps, "
          f"medians:")
    # Paired: each round's time over the same round's plain time, then the median over rounds. The
    # machine's load drifts over seconds; a round's configurations run within a fraction of one.
    print("| configuration | step (ms) | ratio to plain | paired ratio "
          "| window, per step (ms) | window paired ratio |")
    print("|---|---|---|---|---|---|")
    for name in configs:
        ms = statistics.median(times[name])
        paired = statistics.median(t / p for t, p in zip(times[name], times["plain"]))
        window = statistics.median(windows[name])
        window_paired = statistics.median(w / p for w, p in zip(windows[name], windows["plain"]))
        print(f"| {name} | {ms:.1f} | {ms / plain:.2f}x | {paired:.2f}x | {window:.1f} "
              f"| {window_paired:.2f}x |")


if __name__ == "__main__":
    main()
