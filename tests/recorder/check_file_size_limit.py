#!/usr/bin/env python3
"""`torchrr record` of a native program under a file-size limit (ulimit -f, RLIMIT_FSIZE): the
limit stops the recording with one warning, never the program (whose SIGXFSZ would otherwise
kill it), and what was written before the limit reads as far as it verifies.
Usage: check_file_size_limit.py TORCHRR EXIT_MODES WORK_DIR"""
import os
import resource
import subprocess
import sys

torchrr, program, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)


def record(trace, limit):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return subprocess.run([torchrr, "record", "-o", trace, "--", program, "return"],
                          capture_output=True, text=True, timeout=120,
                          preexec_fn=None if limit is None else set_limit)


def info_code(trace):
    return subprocess.run([torchrr, "info", trace], capture_output=True, timeout=60).returncode


whole = os.path.join(work, "whole.trr")
proc = record(whole, None)
if proc.returncode != 0 or info_code(whole) != 0:
    sys.exit(f"FAIL: recording without a limit: exit {proc.returncode}: {proc.stderr}")
size = os.path.getsize(whole)

# limit: (where the write fails, the `torchrr info` exit codes the cut trace may give)
# The trace is the file header, a small FileInfo chunk, one chunk of records (most of the file)
# and the index; its size varies by a few bytes from run to run.
cases = {
    0: ("the header, written when the recording starts", {3}),
    20: ("the FileInfo chunk, written when the recording starts", {3, 4}),
    size // 2: ("the records, written by the writer thread as the trace closes", {4}),
}
failed = 0
for limit, (where, info_codes) in cases.items():
    trace = os.path.join(work, f"limit{limit}.trr")
    proc = record(trace, limit)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("torchrr: warning")]
    problems = []
    if proc.returncode != 0:
        problems.append(f"exit status {proc.returncode}, expected 0 (128+25: killed by SIGXFSZ)")
    if len(warnings) != 1 or "File too large" not in warnings[0]:
        problems.append(f"expected one warning about the limit, got: {proc.stderr.strip()!r}")
    code = info_code(trace)
    if code not in info_codes:
        problems.append(f"torchrr info exit {code}, expected one of {sorted(info_codes)}")
    failed += bool(problems)
    print(f"{'FAIL' if problems else 'PASS'} limit {limit} bytes ({where})"
          + ("" if not problems else ": " + "; ".join(problems)))
sys.exit(1 if failed else 0)
