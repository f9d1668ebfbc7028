#!/usr/bin/env python3
"""End to end on the C++ LoRA sample: record each planted bug with `torchrr record`, replay it,
and check the report against the source and against PyTorch's own message.

For each bug the first violation must name the line marked `// BUG(name)` as the culprit, the
line marked `// VICTIM(name)` (when the sample marks one) as the victim, and the same saved and
current versions as PyTorch's message; PyTorch must have raised. `--bug none` reports nothing.
A silent bug (`silent_*`: a write behind autograd's back, nothing raises) is recorded with
--verify-saved and must come back as a `silent` violation found by fingerprint, with its victim.
Also: recording changes nothing (the same losses, bit for bit, with and without the recorder).

Usage: check_lora_step.py TORCHRR LORA_STEP SAMPLE_SOURCE_DIR WORK_DIR
"""
import json
import os
import re
import subprocess
import sys

torchrr, lora_step, source_dir, work = sys.argv[1:5]
os.makedirs(work, exist_ok=True)
STEPS = "2"


def marked_lines(tag):
    """{name: (file, line)} for every `// TAG(name)` comment in the sample's sources."""
    found = {}
    pattern = re.compile(r"//\s*" + tag + r"\((\w+)\)")
    for name in sorted(os.listdir(source_dir)):
        if not name.endswith((".cc", ".h")):
            continue
        with open(os.path.join(source_dir, name)) as f:
            for number, line in enumerate(f, 1):
                m = pattern.search(line)
                if m and m.group(1) not in found:
                    found[m.group(1)] = (name, number)
    return found


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


culprits, victims = marked_lines("BUG"), marked_lines("VICTIM")
bugs = [line.split()[0] for line in run([lora_step, "--list-bugs"]).stdout.splitlines()
        if line.strip()]
passed, failed = 0, 0


def check(name, ok, why=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
    if ok:
        passed += 1
    else:
        failed += 1


# Recording changes nothing: same losses, bit for bit.
plain = run([lora_step, "--device", "cpu", "--steps", "3"])
traced = run([lora_step, "--device", "cpu", "--steps", "3", "--trace",
              os.path.join(work, "same.trr")])
losses = lambda out: [l for l in out.splitlines() if l.startswith("step ")]
check("bit-for-bit losses with and without the recorder",
      plain.returncode == 0 and traced.returncode == 0 and losses(plain.stdout) == losses(traced.stdout)
      and len(losses(plain.stdout)) == 3,
      f"plain={losses(plain.stdout)} traced={losses(traced.stdout)} rc={plain.returncode},{traced.returncode}")

def check_silent(bug, rec, rep, violations):
    problems = []
    if rec.returncode != 0 or rep.returncode != 1 or not violations:
        check(bug, False, f"record exit {rec.returncode}, replay exit {rep.returncode}, "
                          f"{len(violations)} violations")
        return
    first = violations[0]
    if (first["kind"], first.get("evidence")) != ("silent", "fingerprint"):
        problems.append(f"kind {first['kind']} evidence {first.get('evidence')}")
    if first["pytorch_raised"]:
        problems.append("pytorch_raised for a write no version counter saw")
    fingerprint = first.get("fingerprint") or {}
    if not fingerprint or fingerprint["at_save"] == fingerprint["at_use"]:
        problems.append(f"fingerprints {fingerprint}")
    vframe = (first.get("victim") or {}).get("user_frame") or {}
    vfile, vline = victims[bug]
    if not (vframe.get("file", "").endswith(vfile) and vframe.get("line") == vline):
        problems.append(f"victim at {vframe.get('file')}:{vframe.get('line')}, "
                        f"expected {vfile}:{vline}")
    # The write went through another storage over the same memory: a candidate that wrote, called
    # from the BUG line.
    bfile, bline = culprits[bug]
    writers = [c for c in first.get("candidates", []) if c.get("role") == "wrote" and
               any(f.get("file", "").endswith(bfile) and f.get("line") == bline
                   for f in c.get("stack", []))]
    if not writers:
        problems.append(f"no candidate that wrote, called from {bfile}:{bline}: "
                        f"{[(c.get('op'), c.get('user_frame')) for c in first.get('candidates', [])]}")
    elif (first.get("culprit") or {}).get("id") != writers[0]["id"]:
        problems.append(f"culprit {first.get('culprit')} is not the write {writers[0]['id']}")
    check(bug, not problems, "; ".join(problems))


for bug in bugs:
    trace = os.path.join(work, bug + ".trr")
    silent = bug.startswith("silent_")
    rec = run([torchrr, "record", "-o", trace] + (["--verify-saved"] if silent else []) +
              ["--", lora_step, "--device", "cpu", "--steps", STEPS, "--bug", bug])
    rep = run([torchrr, "replay", "--json", trace])
    try:
        report = json.loads(rep.stdout)
    except json.JSONDecodeError:
        check(bug, False, f"replay printed no JSON (exit {rep.returncode}): {rep.stderr[-300:]}")
        continue
    violations = report["violations"]
    if silent:
        check_silent(bug, rec, rep, violations)
        continue
    if bug == "none":
        check(bug, rec.returncode == 0 and rep.returncode == 0 and not violations,
              f"record exit {rec.returncode}, replay exit {rep.returncode}, {len(violations)} violations")
        continue
    if rec.returncode != 1 or rep.returncode != 1 or not violations:
        check(bug, False, f"record exit {rec.returncode}, replay exit {rep.returncode}, "
                          f"{len(violations)} violations")
        continue
    first = violations[0]
    frame = first["culprit"].get("user_frame") or {}
    want_file, want_line = culprits[bug]
    problems = []
    if not (frame.get("file", "").endswith(want_file) and frame.get("line") == want_line):
        problems.append(f"culprit at {frame.get('file')}:{frame.get('line')}, "
                        f"expected {want_file}:{want_line}")
    if bug in victims:
        vframe = (first.get("victim") or {}).get("user_frame") or {}
        vfile, vline = victims[bug]
        if not (vframe.get("file", "").endswith(vfile) and vframe.get("line") == vline):
            problems.append(f"victim at {vframe.get('file')}:{vframe.get('line')}, "
                            f"expected {vfile}:{vline}")
    m = re.search(r"is at version (\d+); expected version (\d+)", rec.stderr)
    if not m:
        problems.append("PyTorch's message not found in the program's stderr")
    elif (first["current_version"], first["saved_version"]) != (int(m.group(1)), int(m.group(2))):
        problems.append(f"versions saved {first['saved_version']} current "
                        f"{first['current_version']}, PyTorch says saved {m.group(2)} current "
                        f"{m.group(1)}")
    if not first["pytorch_raised"]:
        problems.append("pytorch_raised is false")
    if not (first.get("pytorch_message") or "").startswith("one of the variables needed"):
        problems.append("PyTorch's message was not recorded")
    check(bug, not problems, "; ".join(problems))

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
