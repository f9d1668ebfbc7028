"""A program that ends its image without atexit: os._exit right after the bug, and an exec of
itself (launchers re-exec). The trace holds what the image recorded, and an exec'd image under
`torchrr record` records into FILE.execN.trr beside it."""
import os
import subprocess
import sys
import textwrap

import torchrr
from conftest import cli, marker_line, needs_build, record

pytestmark = needs_build

EXITS = textwrap.dedent("""\
    import os, sys, torch
    x = torch.randn(4, requires_grad=True)
    y = torch.sigmoid(x)
    y.mul_(2)  # BUG
    try:
        y.sum().backward()
    except RuntimeError:
        os._exit(3)  # Past atexit: the trace must still be closed.
    """)

EXECS = textwrap.dedent("""\
    import os, sys, torch
    image = int(sys.argv[1])
    x = torch.randn(4, requires_grad=True)
    y = torch.sigmoid(x)
    if image == 0:
        y.mul_(2)  # FIRST
    else:
        y.add_(1)  # SECOND
    try:
        y.sum().backward()
    except RuntimeError:
        pass
    if image == 0:
        os.execvp(sys.executable, [sys.executable, __file__, "1"])
    """)


def _culprit_lines(trace):
    report = torchrr.replay(trace)
    return [v.culprit.user_frame.line for v in report.violations]


def test_os_exit_right_after_the_bug_keeps_the_trace(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(EXITS)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 3, proc.stderr
    info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stdout + info.stderr  # Closed, not cut.
    assert _culprit_lines(trace) == [marker_line(script, "BUG")]
    assert "BUG" in proc.stderr  # The verdict after the program.

    # torchrr.start() in the program itself, no `torchrr record`: the same.
    started = tmp_path / "started.py"
    started.write_text("import sys, torchrr\ntorchrr.start(sys.argv[1])\n" + EXITS)
    own = tmp_path / "own.trr"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, started, own], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 3, proc.stderr
    assert _culprit_lines(own) == [marker_line(started, "BUG")]


def test_an_exec_closes_the_trace_and_the_new_image_records_beside_it(tmp_path):
    script = tmp_path / "execs.py"
    script.write_text(EXECS)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script, "0"])
    assert proc.returncode == 0, proc.stderr
    second = tmp_path / "run.exec1.trr"
    assert _culprit_lines(trace) == [marker_line(script, "FIRST")]
    assert _culprit_lines(second) == [marker_line(script, "SECOND")]
    # Both verdicts after the program: each trace this run wrote.
    assert "FIRST" in proc.stderr and "SECOND" in proc.stderr, proc.stderr
