#!/usr/bin/env python3
"""`torchrr record -- PROGRAM` passes the exit status through and closes the trace cleanly
whether the program returns, calls exit(), or dies of an uncaught exception (whose message is
recorded), or ends its image without atexit: _exit, _Exit, and an exec, whose new image records
into FILE.exec1.trr. Usage: check_exit_modes.py TORCHRR EXIT_MODES WORK_DIR"""
import json
import os
import subprocess
import sys

torchrr, program, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
passed = failed = 0
# mode: (expected exit status, expected error message fragment or None)
cases = {"return": (0, None), "exit": (3, None),
         "throw": (134, "planted uncaught exception"),
         "backward": (134, "modified by an inplace operation"),
         "_exit": (5, None), "_Exit": (6, None), "execv": (0, None)}


def check_trace(trace, message=None):
    """What is wrong with the trace at `trace`: it must be closed cleanly and hold ops (and an
    error record holding `message`), and replay must find ops in it."""
    info = subprocess.run([torchrr, "info", trace], capture_output=True, text=True)
    dump = subprocess.run([torchrr, "dump", "--json", trace], capture_output=True, text=True)
    records = [json.loads(line) for line in dump.stdout.splitlines() if line.strip()]
    errors = [r.get("message", "") for r in records if r.get("kind") == "error"]
    ops = [r for r in records if r.get("kind") == "op"]
    replay = subprocess.run([torchrr, "replay", trace], capture_output=True, text=True)
    problems = []
    if info.returncode != 0:
        problems.append(f"trace not closed cleanly: torchrr info exit {info.returncode}: "
                        f"{info.stderr.strip()}")
    if not ops:
        problems.append("no ops recorded")
    if message and not any(message in e for e in errors):
        problems.append(f"no error record containing {message!r} (errors: {errors})")
    if replay.returncode not in (0, 1):
        problems.append(f"torchrr replay exit {replay.returncode}: {replay.stderr.strip()}")
    return [f"{os.path.basename(trace)}: {p}" for p in problems]


for mode, (status, message) in cases.items():
    trace = os.path.join(work, mode + ".trr")
    for old in (trace, os.path.join(work, mode + ".exec1.trr")):
        if os.path.exists(old):
            os.unlink(old)
    rec = subprocess.run([torchrr, "record", "-o", trace, "--", program, mode],
                         capture_output=True, text=True)
    problems = check_trace(trace, message)
    if rec.returncode != status:
        problems.append(f"exit status {rec.returncode}, expected {status}")
    if mode == "execv":
        problems += check_trace(os.path.join(work, mode + ".exec1.trr"))
    if "warning" in rec.stderr:
        problems.append(f"warned: {rec.stderr.strip()}")
    ok = not problems
    passed += ok
    failed += not ok
    print(("PASS " if ok else "FAIL ") + mode + ("" if ok else ": " + "; ".join(problems)))
print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
