"""A script at a path whose bytes are not UTF-8 (a Latin-1 directory name, as Python decodes it
with surrogate escapes) keeps its path in the trace: `torchrr replay` shows the culprit's file with
the byte escaped, and the JSON report with U+FFFD in its place; never `<unknown file>`."""
import os
import subprocess
import sys
import textwrap

import torchrr
from conftest import cli, needs_build

pytestmark = needs_build

BUG = textwrap.dedent("""\
    import torch
    x = torch.ones(4, requires_grad=True)
    y = torch.sigmoid(x)
    y.mul_(2)  # CULPRIT
    y.sum().backward()
    """)


def test_a_script_at_a_latin1_path_keeps_its_path(tmp_path):
    directory = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(directory)
    script = os.path.join(directory, b"bug.py")
    with open(script, "w") as f:
        f.write(BUG)
    trace = tmp_path / "run.trr"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rec = subprocess.run([cli(), "record", "-o", str(trace), "--", sys.executable, script],
                         capture_output=True, timeout=120, env=env)
    assert rec.returncode == 1, rec.stderr.decode(errors="replace")[-2000:]

    text = subprocess.run([cli(), "replay", str(trace)], capture_output=True, timeout=60)
    assert text.returncode == 1, text.stderr
    shown = os.fsencode(tmp_path) + b"/caf\\xe9/bug.py:4 in <module>"
    assert b"--> " + shown in text.stdout, text.stdout.decode(errors="replace")
    assert b"<unknown file>" not in text.stdout

    report = torchrr.replay(trace)
    frame = report.violations[0].culprit.user_frame
    assert frame.file == str(tmp_path) + "/caf\ufffd/bug.py"
    assert frame.line == 4
