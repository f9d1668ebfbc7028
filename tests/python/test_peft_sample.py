"""samples/python/peft_lora.py (transformers + PEFT LoRA) under `torchrr record`: every planted
bug's culprit is its `# BUG(name)` line, the victim its `# VICTIM(name)` line, and `--bug none`
trains with no violation. The runs (transformers and PEFT take seconds to import) go two at a
time, once for the module."""
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import torchrr
from conftest import (PYTORCH_INPLACE, REPO, marker_line, needs_build, record, same_file,
                      trace_order_problems)

SAMPLE = REPO / "samples" / "python" / "peft_lora.py"

pytestmark = needs_build


def _have_hf():
    import importlib.util

    missing = [name for name in ("transformers", "peft") if importlib.util.find_spec(name) is None]
    return f"{', '.join(missing)} not installed" if missing else None


HF_MISSING = _have_hf()


# The planted bugs, from their markers (cheap to collect; test_list_bugs checks --list-bugs).
BUGS = ["none"] + sorted(set(re.findall(r"# BUG\((\w+)\)", SAMPLE.read_text())))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    if HF_MISSING is not None:
        pytest.skip(f"transformers/peft not importable: {HF_MISSING}")
    base = tmp_path_factory.mktemp("peft")

    def run(bug):
        trace = base / f"{bug}.trr"
        steps = "2" if bug in ("none", "optimizer_before_backward") else "1"
        flags = ["--verify-saved"] if bug.startswith("silent_") else []
        proc = record(trace, [sys.executable, SAMPLE, "--device", "cpu", "--steps", steps,
                              "--bug", bug], timeout=180, flags=flags)
        return bug, (proc, trace)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, BUGS))


def test_list_bugs():
    out = subprocess.run([sys.executable, SAMPLE, "--list-bugs"], capture_output=True,
                         text=True, check=True)
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert sorted(listed) == sorted(BUGS)
    assert len(BUGS) - 1 >= 5


def test_no_bug_trains_cleanly(runs):
    proc, trace = runs["none"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[:2] for line in proc.stdout.splitlines()] == [["step", "0"],
                                                                         ["step", "1"]]
    report = torchrr.replay(trace)
    assert report.violations == [] and report.ops > 1000
    assert trace_order_problems(trace) == []


@pytest.mark.parametrize("bug", [b for b in BUGS if b.startswith("silent_")])
def test_silent_bug(runs, bug):
    """A write behind autograd's back: nothing raises; --verify-saved's fingerprints show the saved
    bytes changed, and the op that made the alias is a candidate, called from the BUG line."""
    proc, trace = runs[bug]
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = torchrr.replay(trace)
    assert report.violations, "no violation found"
    v = report.violations[0]
    assert (v.kind, v.evidence) == ("silent", "fingerprint")
    assert not v.pytorch_raised
    assert v.backward_node.name == "MulBackward0"
    assert same_file(v.victim.user_frame.file, SAMPLE)
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
    bug_line = marker_line(SAMPLE, rf"BUG\({bug}\)")
    called_from_bug = [c for c in v.candidates
                       if any(f.python and same_file(f.file, SAMPLE) and f.line == bug_line
                              for f in c.op.stack)]
    assert called_from_bug, v.candidates
    # The write through the DLPack alias is the culprit: its stack passes through the BUG line.
    assert v.culprit is not None and v.culprit.op == "aten::mul_", v.culprit
    assert bug_line in [f.line for f in v.culprit.stack if f.python and same_file(f.file, SAMPLE)]


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "none" and not b.startswith("silent_")])
def test_planted_bug(runs, bug):
    proc, trace = runs[bug]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert PYTORCH_INPLACE in proc.stderr
    report = torchrr.replay(trace)
    assert report.violations
    v = report.violations[0]
    assert v.kind == "version" and v.pytorch_raised
    assert PYTORCH_INPLACE in (v.pytorch_message or "")
    assert v.current_version > v.saved_version
    assert same_file(v.victim.user_frame.file, SAMPLE)
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
    assert same_file(v.culprit.user_frame.file, SAMPLE)
    assert v.culprit.user_frame.line == marker_line(SAMPLE, rf"BUG\({bug}\)")
