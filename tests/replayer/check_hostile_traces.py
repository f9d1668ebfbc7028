#!/usr/bin/env python3
"""`torchrr replay`, `info` and `dump` (text and --json) on the crafted traces of
tests/golden/errors (tests/golden/make_golden.cc --hostile): each gives its exit code, prints text
with no control character but its line breaks and JSON that parses, and finds the one violation
the training loop has; every verb that reads a trace stays within its time and memory bounds
(docs/reliability.md, "Memory") on each. Usage: check_hostile_traces.py TORCHRR ERRORS_DIR"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

torchrr, errors = sys.argv[1:3]

# file: (replay's exit code, info's and dump's)
EXIT_CODES = {
    "source_paths.trr": (1, 0),   # One violation; a whole trace.
    "escapes.trr": (1, 0),
    "non_utf8.trr": (1, 0),
    "reordered.trr": (5, 5),      # Corrupt wins over the violation.
    "duplicated.trr": (5, 5),
    "fake_headers.trr": (5, 5),   # Nothing verifies.
    "long_strings.trr": (1, 0),   # A 1 MiB function name in every frame.
    "private_files.trr": (1, 0),  # Frames in ~/.ssh/id_rsa and ~/.aws/credentials.
    "zero_records.trr": (4, 4),   # Cut before its first record.
    "dangling_names.trr": (1, 0),  # The node's and its saved members' names never defined.
    "doubling_ids.trr": (0, 0),   # Op ids 2, 4, ... 2^61.
    "many_threads.trr": (0, 0),   # 20,000 threads, one op each.
}
NO_VIOLATION = {"fake_headers.trr", "zero_records.trr", "doubling_ids.trr", "many_threads.trr"}
# Seconds any verb may take on any of these files (each is at most 256 KiB).
TIME_BOUND_S = 10
VERBS = [["replay"], ["replay", "--json"], ["info"], ["info", "--json"], ["dump"],
         ["dump", "--json"]]
# Bytes a terminal would act on: C0 controls but the line break, DEL, and C1 controls in UTF-8.
CONTROL = re.compile(rb"[\x00-\x09\x0b-\x1f\x7f]|\xc2[\x80-\x9f]")

problems = []


def check(ok, what):
    if not ok:
        problems.append(what)


def run(verb, name):
    """Exit code, stdout, stderr; exit -1 when it ran past 60 s."""
    try:
        proc = subprocess.run([torchrr, *verb, f"{errors}/{name}"], capture_output=True,
                              stdin=subprocess.DEVNULL, timeout=60)
    except subprocess.TimeoutExpired:
        return -1, b"", b"timed out after 60 s"
    return proc.returncode, proc.stdout, proc.stderr


for name, (replay_code, read_code) in EXIT_CODES.items():
    for verb in VERBS:
        what = f"torchrr {' '.join(verb)} {name}"
        rc, out, err = run(verb, name)
        want = replay_code if verb[0] == "replay" else read_code
        check(rc == want, f"{what}: exit {rc}, want {want}: {err.decode(errors='replace')[-300:]}")
        check(not CONTROL.search(err), f"{what}: a control character on stderr")
        if "--json" not in verb:
            check(not CONTROL.search(out), f"{what}: a control character in the text")
            check(not re.search(rb"^error: forged", out, re.M), f"{what}: a forged line")
            try:
                out.decode("utf-8")
            except UnicodeDecodeError:
                problems.append(f"{what}: text that is not UTF-8")
            continue
        try:
            text = out.decode("utf-8")
            # dump --json: one document per line; replay and info: one document.
            documents = ([json.loads(line) for line in text.splitlines()] if verb[0] == "dump"
                         else [json.loads(text)])
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            problems.append(f"{what}: not JSON: {e}")
            continue
        check(documents, f"{what}: no JSON")
        if verb[0] == "replay" and documents:
            violations = documents[0]["violations"]
            want_violations = 0 if name in NO_VIOLATION else 1
            check(len(violations) == want_violations,
                  f"{what}: {len(violations)} violations, want {want_violations}")

# What the escaped and the Latin-1 strings look like, and that no special file is quoted.
rc, out, _ = run(["replay"], "escapes.trr")
check(b"--> /tmp/\\x1b]0;pwned\\x07train.py:12 in train_step\\nerror: forged by the trace\n" in out,
      "replay escapes.trr: the culprit's location is not shown escaped")
rc, out, _ = run(["info"], "escapes.trr")
check(b"command line:     python train\\x1b]2;title\\x07.py --lr\\n1e-4\n" in out,
      "info escapes.trr: the command line is not shown escaped")
rc, out, _ = run(["replay"], "non_utf8.trr")
check(b"--> /home/ana/caf\\xe9/train.py:12 in \\xe9tape\n" in out,
      "replay non_utf8.trr: the file is not shown, escaped")
rc, out, _ = run(["replay", "--json"], "non_utf8.trr")
try:
    frame = json.loads(out)["violations"][0]["culprit"]["user_frame"]
except (ValueError, LookupError):
    frame = None
check(frame and frame["file"] == "/home/ana/caf\ufffd/train.py",
      f"replay --json non_utf8.trr: culprit's frame {frame!r}")
rc, out, _ = run(["replay"], "source_paths.trr")
check(b" |     " not in out, "replay source_paths.trr: a special file was quoted")
check(b"= culprit: aten::add_ changed the version 5 -> 6" in out,
      "replay source_paths.trr: no culprit line")

# Long strings: output grows with the trace, not with the string times its uses (8 KiB each).
rc, out, _ = run(["replay"], "long_strings.trr")
check(len(out) < 1 << 20, f"replay long_strings.trr: {len(out)} bytes of output")
rc, out, _ = run(["dump"], "long_strings.trr")
check(len(out) < 16 << 20, f"dump long_strings.trr: {len(out)} bytes of output")
# A stranger's frames naming private files: said, never read.
rc, out, _ = run(["replay"], "private_files.trr")
check(b" |     " not in out, "replay private_files.trr: a private file was quoted")
check(b"/root/.ssh/id_rsa is not quoted" in out, "replay private_files.trr: no word of not quoting")
# Cut before its first record: not a clean run.
rc, out, _ = run(["replay"], "zero_records.trr")
check(b"o op was recorded" in out, "replay zero_records.trr: does not say no op was recorded")
rc, out, _ = run(["replay"], "dangling_names.trr")
check(b"needed by a node the trace does not name (#" in out,
      "replay dangling_names.trr: the unnamed node is not said to be unnamed")
check(b"`?`" not in out and b"needed by  (" not in out,
      "replay dangling_names.trr: an empty name or a `?` printed")
rc, out, _ = run(["info"], "zero_records.trr")
check(b"recording:        incomplete" in out, "info zero_records.trr: not said incomplete")


def decompressed_bytes(path):
    """The raw lengths of the file's chunks, walked from the file header (no resync)."""
    data = open(path, "rb").read()
    at, total = 16, 0
    while at + 24 <= len(data) and data[at:at + 4] == b"TRRC":
        _, _, compressed, raw = struct.unpack("<HHII", data[at + 4:at + 16])
        total, at = total + raw, at + 24 + compressed
    return total


# Time and memory: every verb that reads a trace, on every file. wait4 gives each child's own
# peak; Popen.wait would reap it first, so it is reaped here.
with tempfile.TemporaryDirectory() as out_dir:
    for name in EXIT_CODES:
        path = f"{errors}/{name}"
        bound_kib = (16 * decompressed_bytes(path) + (1 << 30)) // 1024
        for verb in (["replay"], ["info"], ["dump", "--json"],
                     ["export", "--chrome-trace", "-o", f"{out_dir}/{name}.json"],
                     ["redact", "-o", f"{out_dir}/{name}.redacted.trr"],
                     ["repro", "-o", f"{out_dir}/{name}.py"]):
            started = time.monotonic()
            proc = subprocess.Popen([torchrr, verb[0], path, *verb[1:]],
                                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL)
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.monotonic() - started
            what = f"torchrr {verb[0]} {name}"
            check(seconds < TIME_BOUND_S, f"{what}: {seconds:.1f} s")
            check(usage.ru_maxrss < bound_kib, f"{what}: {usage.ru_maxrss} KiB, bound {bound_kib}")
            check(proc.returncode != 14, f"{what}: past its memory bound")

for p in problems:
    print("FAIL:", p)
print(f"check_hostile_traces: {len(problems)} problem(s)")
sys.exit(1 if problems else 0)
