#!/usr/bin/env python3
"""Both LoRA samples, every planted bug and none, recorded on the CPU and on CUDA and replayed:
the verdicts must be the same on both devices (kind, evidence, culprit and victim lines, backward
node, versions, whether PyTorch raised), every bug must be found and `none` must report nothing.
Silent bugs (`silent_*`) are recorded with --verify-saved. Runs are parallel.

Usage: compare_samples.py TORCHRR LORA_STEP PYTHON PEFT_SCRIPT WORK_DIR [--devices cpu,cuda]
       [--jobs N]
Prints a table and PASS/FAIL per bug; exit status 1 when any failed.
"""
import argparse
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


def list_bugs(cmd):
    out = subprocess.run(cmd + ["--list-bugs"], capture_output=True, text=True, check=True)
    return [line.split()[0] for line in out.stdout.splitlines() if line.strip()]


def verdict(report):
    if not report["violations"]:
        return None
    v = report["violations"][0]

    def where(op):
        frame = (op or {}).get("user_frame") or {}
        return f"{os.path.basename(frame.get('file') or '?')}:{frame.get('line')}" if op else None

    return {"kind": v["kind"], "evidence": v.get("evidence"), "culprit": where(v["culprit"]),
            "victim": where(v["victim"]), "node": v["backward_node"]["name"],
            "saved": v["saved_version"], "current": v["current_version"],
            "raised": v["pytorch_raised"]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("torchrr")
    parser.add_argument("lora_step")
    parser.add_argument("python")
    parser.add_argument("peft_script")
    parser.add_argument("work")
    parser.add_argument("--devices", default="cpu,cuda")
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--timeout", type=int, default=240)
    args = parser.parse_args()
    os.makedirs(args.work, exist_ok=True)
    devices = args.devices.split(",")
    samples = {"cpp": [args.lora_step], "peft": [args.python, args.peft_script]}
    jobs = []
    for sample, cmd in samples.items():
        for bug in list_bugs(cmd):
            for device in devices:
                jobs.append((sample, bug, device))

    def run(job):
        sample, bug, device = job
        trace = os.path.join(args.work, f"{sample}-{bug}-{device}.trr")
        steps = "2" if sample == "cpp" or bug in ("none", "optimizer_before_backward") else "1"
        flags = ["--verify-saved"] if bug.startswith("silent_") else []
        env = dict(os.environ, OMP_NUM_THREADS="2")
        try:
            rec = subprocess.run([args.torchrr, "record", "-o", trace, *flags, "--",
                                  *samples[sample], "--device", device, "--steps", steps,
                                  "--bug", bug], capture_output=True, text=True, env=env,
                                 timeout=args.timeout)
            rep = subprocess.run([args.torchrr, "replay", "--json", trace], capture_output=True,
                                 text=True, timeout=args.timeout)
            report = json.loads(rep.stdout)
        except (subprocess.TimeoutExpired, json.JSONDecodeError) as error:
            return job, {"error": str(error)[:300]}
        return job, {"record_exit": rec.returncode, "verdict": verdict(report),
                     "stderr": rec.stderr[-400:]}

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(pool.map(run, jobs))

    failed = 0
    for sample, cmd in samples.items():
        for bug in list_bugs(cmd):
            got = {d: results[(sample, bug, d)] for d in devices}
            problems = []
            for d, r in got.items():
                if "error" in r:
                    problems.append(f"{d}: {r['error']}")
                elif bug == "none" and r["verdict"] is not None:
                    problems.append(f"{d}: violations for --bug none: {r['verdict']}")
                elif bug != "none" and r["verdict"] is None:
                    problems.append(f"{d}: no violation found (record exit {r['record_exit']}: "
                                    f"{r['stderr'][-200:]})")
            verdicts = [json.dumps(r.get("verdict"), sort_keys=True) for r in got.values()]
            if not problems and len(set(verdicts)) != 1:
                problems.append("verdicts differ: " + " vs ".join(
                    f"{d}={v}" for d, v in zip(got, verdicts)))
            failed += bool(problems)
            shown = got[devices[0]].get("verdict")
            print(("PASS " if not problems else "FAIL ") + f"{sample} {bug}: " +
                  (json.dumps(shown) if not problems else "; ".join(problems)), flush=True)
    print(f"{len(jobs) // len(devices) - failed} passed, {failed} failed "
          f"({len(jobs)} recordings on {', '.join(devices)})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
