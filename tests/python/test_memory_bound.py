"""Every verb that reads a trace is bounded in memory by a multiple of the trace's decompressed
size (replayer/cli/memory_limit.h, docs/reliability.md "Memory"): past the bound it stops at
once with one error line and exit code 14, and `--max-memory` sets the bound."""
import subprocess
import sys
import time

from conftest import cli, needs_build, record

pytestmark = needs_build

EXIT_MEMORY = 14
PROGRAM = [sys.executable, "-c", (
    "import torch\n"
    "x = torch.ones(64, requires_grad=True)\n"
    "for _ in range(50):\n"
    "    (x * 2).sigmoid().sum().backward()\n")]

# Each verb's arguments after the trace ({out}: its output file).
VERBS = {"info": [], "dump": [], "replay": [], "export": ["--chrome-trace", "-o", "{out}.json"],
         "redact": ["-o", "{out}.trr"], "report": ["-o", "{out}.html"],
         "repro": ["-o", "{out}.py"], "fix": []}


def _run(verb, trace, out, *extra):
    args = [a.format(out=out) for a in VERBS[verb]]
    return subprocess.run([cli(), verb, str(trace), *args, *extra], capture_output=True,
                          text=True, timeout=120)


def test_each_verb_stops_with_one_line_past_its_bound(tmp_path):
    trace = tmp_path / "run.trr"
    assert record(trace, PROGRAM, timeout=120, flags=["--quiet"]).returncode == 0
    for verb in VERBS:
        started = time.monotonic()
        proc = _run(verb, trace, tmp_path / verb, "--max-memory", "16K")
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        assert proc.returncode == EXIT_MEMORY, (verb, proc.returncode, proc.stderr)
        assert len(errors) == 1 and "--max-memory" in errors[0], (verb, proc.stderr)
        assert str(trace) in errors[0], (verb, proc.stderr)
        assert time.monotonic() - started < 30, verb
        # The default bound (16 times the decompressed trace plus 1 GiB) leaves it room.
        proc = _run(verb, trace, tmp_path / f"{verb}.default")
        assert proc.returncode != EXIT_MEMORY, (verb, proc.stderr)


def test_max_memory_takes_sizes_and_refuses_anything_else(tmp_path):
    trace = tmp_path / "run.trr"
    assert record(trace, PROGRAM, timeout=120, flags=["--quiet"]).returncode == 0
    assert _run("info", trace, tmp_path / "x", "--max-memory", "2G").returncode == 0
    for bad in ("8Q", "-1", "0", "G"):
        proc = _run("info", trace, tmp_path / "x", "--max-memory", bad)
        assert proc.returncode == 2 and "--max-memory" in proc.stderr, (bad, proc.stderr)
