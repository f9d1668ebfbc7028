"""Python processes a recorded program starts afresh (subprocess, torch.multiprocessing.spawn):
under `torchrr record --follow-forks` each records into a trace of its own (FILE.pidN.trr) and a
bug there is named to its line; without it they record nothing, and the first one started is
warned about, once."""
import sys
import textwrap

import torchrr
from conftest import marker_line, needs_build, record

pytestmark = needs_build

CHILD = textwrap.dedent("""\
    import torch
    x = torch.ones(8, requires_grad=True)
    y = torch.sigmoid(x)  # VICTIM
    y.mul_(2)  # CULPRIT
    y.sum().backward()
    """)

PARENT = textwrap.dedent("""\
    import subprocess
    import sys
    import torch
    (torch.ones(2, requires_grad=True) * 2).sum().backward()
    for _ in range(2):
        subprocess.run([sys.executable, sys.argv[1]])
    """)

# torch.multiprocessing.spawn's worker runs in a fresh interpreter that imports this script.
SPAWN = textwrap.dedent("""\
    import torch
    import torch.multiprocessing as mp

    def worker(index):
        x = torch.ones(8, requires_grad=True)
        y = torch.sigmoid(x)  # VICTIM
        y.mul_(2)  # CULPRIT
        try:
            y.sum().backward()
        except RuntimeError:
            pass

    if __name__ == "__main__":
        mp.spawn(worker, nprocs=1)
    """)


def _children_traces(tmp_path):
    return sorted(tmp_path.glob("run.pid*.trr"))


def test_subprocess_children_record_with_follow_forks(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    proc = record(tmp_path / "run.trr", [sys.executable, parent, child],
                  flags=("--follow-forks", "--quiet"))
    assert proc.returncode == 0, proc.stderr
    assert "not recorded" not in proc.stderr, proc.stderr
    traces = _children_traces(tmp_path)
    assert len(traces) == 2, (traces, proc.stderr)
    for trace in traces:
        [violation] = torchrr.replay(trace).violations
        assert violation.culprit.user_frame.line == marker_line(child, "CULPRIT")
        assert violation.victim.user_frame.line == marker_line(child, "VICTIM")
    assert torchrr.replay(tmp_path / "run.trr").violations == []


def test_without_follow_forks_the_first_python_child_is_warned_about(tmp_path):
    child = tmp_path / "child.py"
    child.write_text(CHILD)
    parent = tmp_path / "parent.py"
    parent.write_text(PARENT)
    proc = record(tmp_path / "run.trr", [sys.executable, parent, child], flags=("--quiet",))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("torchrr: warning: this program started another Python process") \
        == 1, proc.stderr
    assert "--follow-forks" in proc.stderr
    assert _children_traces(tmp_path) == []


def test_spawned_workers_record_with_follow_forks(tmp_path):
    script = tmp_path / "spawn.py"
    script.write_text(SPAWN)
    proc = record(tmp_path / "run.trr", [sys.executable, script],
                  flags=("--follow-forks", "--quiet"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    # The spawn start method runs a resource tracker too: a Python process with no tensor op.
    reports = [torchrr.replay(trace) for trace in _children_traces(tmp_path)]
    found = [v for report in reports for v in report.violations]
    assert len(found) == 1, [(r.trace, r.ops) for r in reports]
    assert found[0].culprit.user_frame.line == marker_line(script, "CULPRIT")
