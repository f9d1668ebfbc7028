#!/usr/bin/env python3
"""Step time of the PEFT LoRA sample on the CPU: plain, under torchrr (Python stacks on), under
torch.autograd.set_detect_anomaly(True), and under torch.profiler.profile(record_shapes=True,
with_stack=True). The four configurations run interleaved in rounds within one process, so the
machine's noise hits them alike; the table gives medians and ratios to plain.

Usage: bench_peft.py [--rounds R] [--steps K] [--threads T] [--hidden H] [--layers L] [--seq S]
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


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_args = argparse.Namespace(device="cpu", seed=0, layers=args.layers, hidden=args.hidden,
                                    vocab=512, seq=args.seq, batch=4, lr=1e-3)
    model = peft_lora.build_model(model_args)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    input_ids = torch.randint(1, model_args.vocab, (model_args.batch, model_args.seq))

    def step():
        logits = model(input_ids=input_ids).logits
        loss = peft_lora.next_token_loss(logits, input_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    tmp = tempfile.mkdtemp(prefix="torchrr_bench_peft_")
    configs = {
        "plain": contextlib.nullcontext,
        "torchrr (Python stacks)": lambda: torchrr.record(os.path.join(tmp, "run.trr"),
                                                          native_stacks=False),
        "anomaly mode": lambda: torch.autograd.set_detect_anomaly(True),
        "profiler (shapes, stacks)": lambda: torch.profiler.profile(record_shapes=True,
                                                                    with_stack=True),
    }
    times = {name: [] for name in configs}
    for _ in range(2):
        step()
    for _ in range(args.rounds):
        for name, make in configs.items():
            with make():
                step()  # Warm: the recorder interns, the profiler sets up.
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    plain = statistics.median(times["plain"])
    print(f"PEFT LoRA step on the CPU ({args.threads} thread(s), hidden {args.hidden}, "
          f"{args.layers} layers, seq {args.seq}, batch 4), {args.rounds} rounds x "
          f"{args.steps} steps, medians:")
    print("| configuration | step (ms) | ratio to plain |")
    print("|---|---|---|")
    for name in configs:
        ms = statistics.median(times[name])
        print(f"| {name} | {ms:.1f} | {ms / plain:.2f}x |")


if __name__ == "__main__":
    main()
