"""A recording that stopped early says so: in `torchrr info`, before any verdict of `torchrr
replay`, on each violation, in the JSON, and in replay's exit code (8). Never "nothing was
modified" as if the run had been recorded whole. The stop is injected with the hidden flag
--fail-at-op (RecorderOptions::fail_at_op), which fails the Nth op's end as an internal error
would. `torchrr record` clears every TORCHRR_* option variable it is not given, so the flag,
not the variable, reaches the recorder. A trace that holds no op (a --steps range the run never
reached) is no verdict either: replay exits 10 and says so first."""
import json
import subprocess
import sys
import textwrap

import torchrr
from conftest import cli, needs_build, record

pytestmark = needs_build

EXIT_INCOMPLETE = 8
EXIT_EMPTY = 10

LEGAL = textwrap.dedent("""\
    import torch
    w = torch.ones(8, requires_grad=True)
    for _ in range(5):
        torch.sigmoid(w * 2).sum().backward()
    print("done")
    """)

# The bug comes first (ops 1-3), the stop later: the violation is found and still marked.
BUG_THEN_STOP = textwrap.dedent("""\
    import torch
    w = torch.ones(8, requires_grad=True)
    a = torch.sigmoid(w)
    a.mul_(2)
    try:
        a.sum().backward()
    except RuntimeError:
        pass
    for _ in range(5):
        torch.sigmoid(w * 2).sum().backward()
    print("done")
    """)


def _record(tmp_path, source, fail_at):
    script = tmp_path / "script.py"
    script.write_text(source)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], flags=["--fail-at-op", str(fail_at)])
    assert proc.returncode == 0, proc.stderr  # The program is not affected.
    assert proc.stdout.strip() == "done"
    assert proc.stderr.count("recording stopped") == 1, proc.stderr
    return trace


def _replay(trace, *flags):
    return subprocess.run([cli(), "replay", *flags, str(trace)], capture_output=True, text=True,
                          timeout=60)


def test_stopped_recording_is_never_a_clean_verdict(tmp_path):
    trace = _record(tmp_path, LEGAL, fail_at=6)
    text = _replay(trace)
    assert text.returncode == EXIT_INCOMPLETE, text.stdout + text.stderr
    first = text.stdout.splitlines()[0]
    assert first.startswith("warning: incomplete recording: the recorder stopped"), first
    assert "fault injected" in first
    assert "no saved tensor was modified in the recorded part, but the recording is incomplete" \
        in text.stdout
    doc = json.loads(_replay(trace, "--json").stdout)
    assert doc["recording"]["complete"] is False
    assert "fault injected" in doc["recording"]["stopped"]["message"]
    info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0
    assert "recording:        incomplete: stopped early: " in info.stdout
    info_json = json.loads(subprocess.run([cli(), "info", "--json", str(trace)],
                                          capture_output=True, text=True, timeout=60).stdout)
    assert info_json["recording"]["complete"] is False


def test_python_replay_reports_an_incomplete_recording(tmp_path):
    report = torchrr.replay(_record(tmp_path, LEGAL, fail_at=6))
    assert report.exit_code == EXIT_INCOMPLETE
    assert report.recording["complete"] is False and report.violations == []


# The run dies at step 5 of 20; the recording keeps steps 10 and 11, which it never reaches.
DIES_BEFORE_THE_STEPS = textwrap.dedent("""\
    import torch
    import torchrr
    w = torch.ones(8, requires_grad=True)
    for step in range(20):
        torchrr.step()
        y = torch.sigmoid(w * 2)
        if step == 5:
            y.mul_(2)
        y.sum().backward()
    """)


def test_a_trace_with_no_op_is_never_a_clean_verdict(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(DIES_BEFORE_THE_STEPS)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], flags=["--steps", "10:11"])
    assert proc.returncode == 1 and "RuntimeError" in proc.stderr, proc.stderr
    text = _replay(trace)
    assert text.returncode == EXIT_EMPTY, text.stdout + text.stderr
    assert text.stdout.splitlines()[0].startswith("no op was recorded: this trace says nothing of "
                                                  "the run"), text.stdout
    # How the run ended is kept, though the step it ended in is not.
    assert ("the program ended with an error in a step this trace does not hold: one of the "
            "variables needed for gradient computation") in text.stdout, text.stdout
    doc = json.loads(_replay(trace, "--json").stdout)
    assert doc["recording"]["empty"] is True and doc["ops"] == 0
    report = torchrr.replay(trace)
    assert report.exit_code == EXIT_EMPTY and report.recording["empty"] is True


def test_violations_before_the_stop_are_reported_and_marked(tmp_path):
    trace = _record(tmp_path, BUG_THEN_STOP, fail_at=12)
    doc = json.loads(_replay(trace, "--json").stdout)
    assert doc["violations"], doc
    assert all(v["recording_incomplete"] for v in doc["violations"])
    text = _replay(trace)
    assert text.returncode == EXIT_INCOMPLETE
    assert "recording incomplete: a write or use it missed could change this verdict" in text.stdout


def test_a_whole_recording_is_complete(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(LEGAL)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    text = _replay(trace)
    assert text.returncode == 0
    assert "incomplete" not in text.stdout
    assert json.loads(_replay(trace, "--json").stdout)["recording"] == {
        "complete": True, "empty": False, "stopped": None, "records_lost": 0, "steps": None}


FAILING_BACKWARD = textwrap.dedent("""\
    import torch


    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            raise RuntimeError("this backward always fails")


    w = torch.ones(8, requires_grad=True)
    Fails.apply(w).sum().backward()
    """)


def test_a_backward_that_threw_unexplained_is_never_a_clean_verdict(tmp_path):
    script = tmp_path / "fails.py"
    script.write_text(FAILING_BACKWARD)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 1 and "always fails" in proc.stderr, proc.stderr
    text = _replay(trace)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "error: backward raised an error that torchrr does not explain" in text.stdout
    assert "FailsBackward" in text.stdout
    assert "no saved tensor was modified, but backward raised 1 error" in text.stdout
    doc = json.loads(_replay(trace, "--json").stdout)
    [error] = doc["unexplained_errors"]
    assert error["backward_op"]["op"] == "FailsBackward"
    assert "always fails" in error["message"]
