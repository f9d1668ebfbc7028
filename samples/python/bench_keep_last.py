#!/usr/bin/env python3
"""Whole-run recording: the PEFT LoRA sample trained for --steps steps plain, recorded whole
(torchrr), recorded keeping only the last 2 steps (torchrr --keep-last 2), and the same with the
window kept on disk too (--spill), each run in a process of its own, the four interleaved over --rounds rounds so that the machine's noise hits
them alike. Per configuration, with paired ratios to plain (each round's figure over the same
round's plain figure, then the median over rounds): the median step time; the whole run (the steps
and stopping the recording, which writes a --keep-last window); the CPU time of all the process's
threads over that run (the writer thread's work included, which a busy machine feels even when
the training thread does not wait for it); the time to stop; the process's peak resident memory;
and the trace's size, in bytes and per step kept.

Usage: bench_keep_last.py [--rounds R] [--steps N] [--keep-last K] [model options of peft_lora.py]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

CONFIGS = ("plain", "torchrr", "torchrr --keep-last", "torchrr --keep-last --spill")


def run_one(args, config, trace):
    """In the child process: trains, records as `config` says, prints one JSON line."""
    import torch

    import peft_lora
    import torchrr
    torch.set_num_threads(1)
    model = peft_lora.build_model(args)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    input_ids = torch.randint(1, args.vocab, (args.batch, args.seq))
    if config == "torchrr":
        torchrr.start(trace)
    elif config == "torchrr --keep-last":
        torchrr.start(trace, keep_last=args.keep_last)
    elif config == "torchrr --keep-last --spill":
        torchrr.start(trace, keep_last=args.keep_last, spill=trace + ".spill")
    times = []
    run_start = time.perf_counter()
    cpu_start = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(args.steps):
        start = time.perf_counter()
        logits = model(input_ids=input_ids).logits
        loss = peft_lora.next_token_loss(logits, input_ids)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    torchrr.stop()  # Writes the window (--keep-last), or the rest of the trace.
    stop_ms = (time.perf_counter() - start) * 1e3
    cpu_end = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "run_s": time.perf_counter() - run_start,
        "cpu_s": (cpu_end.ru_utime - cpu_start.ru_utime) + (cpu_end.ru_stime - cpu_start.ru_stime),
        "step_ms": statistics.median(times) * 1e3,
        "stop_ms": stop_ms,
        "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
        "trace_bytes": os.path.getsize(trace) if os.path.exists(trace) else 0,
    }))


def main():
    import peft_lora
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--keep-last", type=int, default=2)
    parser.add_argument("--child", choices=CONFIGS, help=argparse.SUPPRESS)
    parser.add_argument("--trace", help=argparse.SUPPRESS)
    peft_lora.add_model_arguments(parser, hidden=64, vocab=256, seq=32, batch=2)
    args = parser.parse_args()
    args.device = "cpu"
    if args.child:
        run_one(args, args.child, args.trace)
        return
    forwarded = [a for a in sys.argv[1:]]
    results = {name: [] for name in CONFIGS}
    tmp = tempfile.mkdtemp(prefix="torchrr_bench_keep_last_")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for round_index in range(args.rounds):
        shift = round_index % len(CONFIGS)
        order = list(CONFIGS[shift:] + CONFIGS[:shift])
        for name in order:
            trace = os.path.join(tmp, name.replace(" ", "_").replace("-", "") + ".trr")
            out = subprocess.run([sys.executable, __file__, *forwarded, "--child", name,
                                  "--trace", trace], capture_output=True, text=True, env=env,
                                 check=True).stdout
            results[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"PEFT LoRA sample on the CPU (1 thread), hidden {args.hidden}, {args.layers} layers, "
          f"seq {args.seq}, batch {args.batch}: {args.steps} steps per run, {args.rounds} rounds, "
          f"--keep-last {args.keep_last}; medians over rounds:")
    print("| configuration | step (ms) | paired ratio | run, steps and stop (s) | paired ratio "
          "| CPU, all threads (s) | paired ratio | stop (ms) | peak RSS (MiB) | paired ratio "
          "| trace (bytes) | trace bytes per step |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    plain = results["plain"]
    for name in CONFIGS:
        runs = results[name]
        def paired(key):
            return statistics.median(r[key] / p[key] for r, p in zip(runs, plain))
        step = statistics.median(r["step_ms"] for r in runs)
        run = statistics.median(r["run_s"] for r in runs)
        cpu = statistics.median(r["cpu_s"] for r in runs)
        rss = statistics.median(r["maxrss_kb"] for r in runs) / 1024
        stop = statistics.median(r["stop_ms"] for r in runs)
        size = int(statistics.median(r["trace_bytes"] for r in runs))
        kept = args.steps if name == "torchrr" else args.keep_last if "keep" in name else 0
        per_step = f"{size / kept:,.0f}" if kept else "-"
        print(f"| {name} | {step:.1f} | {paired('step_ms'):.2f}x | {run:.2f} "
              f"| {paired('run_s'):.2f}x | {cpu:.2f} | {paired('cpu_s'):.2f}x | {stop:.0f} "
              f"| {rss:.0f} | {paired('maxrss_kb'):.2f}x | {size:,} | {per_step} |")


if __name__ == "__main__":
    main()
