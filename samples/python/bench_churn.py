#!/usr/bin/env python3
"""Recorder cost on short-lived tensors: a loop of ``x.add(1)`` on a 4-element tensor (every
output dies at once), plain and recorded (Python stacks off and on), in rounds
within one process; medians of microseconds per iteration and the recorder's added time per op.

Usage: bench_churn.py [--rounds R] [--iterations N]
"""
import argparse
import contextlib
import os
import statistics
import tempfile
import time

import torch

import torchrr


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=20000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    x = torch.ones(4)

    def loop():
        start = time.perf_counter()
        for _ in range(args.iterations):
            x.add(1)
        return (time.perf_counter() - start) / args.iterations * 1e6

    tmp = tempfile.mkdtemp(prefix="torchrr_bench_churn_")
    trace = os.path.join(tmp, "churn.trr")
    configs = {
        "plain": contextlib.nullcontext,
        "recorded, no stacks": lambda: torchrr.record(trace, native_stacks=False,
                                                      python_stacks=False),
        "recorded, Python stacks": lambda: torchrr.record(trace, native_stacks=False),
    }
    times = {name: [] for name in configs}
    loop()
    with torchrr.record(trace, native_stacks=False, python_stacks=False):
        loop()  # aten::add and the ops that wrap the scalar 1 into a tensor.
        ops_per_iteration = torchrr.ops_recorded() / args.iterations
    for _ in range(args.rounds):
        for name, make in configs.items():
            with make():
                times[name].append(loop())
    plain = statistics.median(times["plain"])
    print(f"x.add(1) on 4 floats ({ops_per_iteration:.0f} ops per iteration), {args.rounds} rounds "
          f"x {args.iterations} iterations, medians:")
    print("| configuration | us per iteration | ratio to plain | added us per op |")
    print("|---|---|---|---|")
    for name in configs:
        us = statistics.median(times[name])
        print(f"| {name} | {us:.2f} | {us / plain:.2f}x | {(us - plain) / ops_per_iteration:.2f} |")


if __name__ == "__main__":
    main()
