"""`torchrr record -- python ...` through the sitecustomize: chaining to the user's
sitecustomize, which processes record, and torchrun's one trace per rank."""
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import torchrr
from conftest import marker_line, needs_build, record

pytestmark = needs_build


def test_users_sitecustomize_keeps_working(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent("""\
        import os
        os.environ["USER_SITECUSTOMIZE_RAN"] = "yes"
        with open(os.environ["USER_SITECUSTOMIZE_FILE"], "w") as f:
            f.write("ran")
        """))
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent("""\
        import os, sys, torch
        assert os.environ.get("USER_SITECUSTOMIZE_RAN") == "yes", "user sitecustomize did not run"
        x = torch.ones(3, requires_grad=True)
        (x * 2).sum().backward()
        print("ok")
        """))
    marker = tmp_path / "marker.txt"
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script],
                  env={"PYTHONPATH": str(site), "USER_SITECUSTOMIZE_FILE": str(marker)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert marker.read_text() == "ran"
    report = torchrr.replay(trace)
    assert report.ops > 0 and report.violations == []


def test_only_the_first_python_process_records(tmp_path):
    # A child Python process (a DataLoader worker, a subprocess) must not overwrite the trace.
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent("""\
        import subprocess, sys, torch
        torch.ones(2).add(1)
        child = "import torch, torchrr; torch.ones(2).mul(3); print(torchrr.recording())"
        out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        print(out.stdout.strip(), out.returncode)
        """))
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "0"]
    names = {f.name for f in tmp_path.iterdir()}
    assert "run.trr" in names and not any(".rank" in n for n in names)
    assert torchrr.replay(trace).ops > 0


def test_options_left_in_the_environment_do_not_apply(tmp_path):
    # `torchrr record` passes its options through TORCHRR_* variables; one the caller's
    # environment holds is not an option it was given.
    script = tmp_path / "bug.py"
    script.write_text(textwrap.dedent("""\
        import torch
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
        y.add_(1)  # CULPRIT
        y.sum().backward()
        """))
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], env={"TORCHRR_PYTHON_STACKS": "0"})
    assert proc.returncode != 0 and "modified by an inplace operation" in proc.stderr
    culprit = torchrr.replay(trace).violations[0].culprit
    assert culprit.user_frame is not None and culprit.user_frame.line == 4, culprit.stack


def test_autograd_cache_is_off_unless_the_user_set_it(tmp_path, monkeypatch):
    # A compiled region loaded from AOTAutograd's cache has no backward graph to say which line
    # each saved tensor is for: `torchrr record` turns that cache off, unless the user chose.
    monkeypatch.delenv("TORCHINDUCTOR_AUTOGRAD_CACHE", raising=False)
    script = tmp_path / "env.py"
    script.write_text("import os, torch\nprint(os.environ.get('TORCHINDUCTOR_AUTOGRAD_CACHE'))\n")
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 0 and proc.stdout.strip() == "0", proc.stderr
    proc = record(trace, [sys.executable, script], env={"TORCHINDUCTOR_AUTOGRAD_CACHE": "1"})
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr


def test_not_recording_without_torch_import(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("print(sum(range(10)))\n")
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == 0 and proc.stdout.strip() == "45", proc.stderr
    assert not trace.exists()


def test_torchrun_two_cpu_ranks_write_one_trace_each(tmp_path):
    torchrun = Path(sys.executable).parent / "torchrun"
    if not torchrun.exists():
        pytest.skip(f"no torchrun beside {sys.executable}")
    script = tmp_path / "ddp.py"
    script.write_text(textwrap.dedent("""\
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        w = torch.ones(4, requires_grad=True)
        y = torch.sigmoid(w * (dist.get_rank() + 1))
        if dist.get_rank() == 1:
            y.mul_(2)  # CULPRIT
        y.sum().backward()
        dist.all_reduce(w.grad)
        dist.destroy_process_group()
        """))
    trace = tmp_path / "run.trr"
    start = time.monotonic()
    try:
        proc = record(trace, [torchrun, "--standalone", "--nproc-per-node", "2", script],
                      timeout=90, cwd=tmp_path)
    except subprocess.TimeoutExpired:
        pytest.skip("torchrun with 2 gloo ranks took over 90 s here")
    elapsed = time.monotonic() - start
    names = sorted(f.name for f in tmp_path.iterdir() if f.suffix == ".trr")
    assert names == ["run.rank0.trr", "run.rank1.trr"], (names, proc.stderr[-3000:])
    assert proc.returncode != 0  # Rank 1 raised.
    assert torchrr.replay(tmp_path / "run.rank0.trr").violations == []
    v = torchrr.replay(tmp_path / "run.rank1.trr").violations[0]
    assert v.backward_node.name == "SigmoidBackward0" and v.pytorch_raised
    assert v.culprit.user_frame.line == 6
    print(f"torchrun: {elapsed:.1f} s")


BUGGY = textwrap.dedent("""\
    import torch
    x = torch.randn(4, requires_grad=True)
    y = torch.sigmoid(x)  # VICTIM
    y.mul_(2)  # CULPRIT
    y.sum().backward()
    """)


def test_the_verdict_follows_the_programs_error(tmp_path):
    # The user sees culprit and victim lines where the program died, without a replay command.
    script = tmp_path / "buggy.py"
    script.write_text(BUGGY)
    proc = record(tmp_path / "run.trr", [sys.executable, script], cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    error = proc.stderr.index("RuntimeError: one of the variables needed")
    verdict = proc.stderr.index("torchrr: 1 violation in ")
    assert error < verdict, proc.stderr  # After the program's own output.
    shown = proc.stderr[verdict:]
    assert f"  culprit: {script}:{marker_line(script, 'CULPRIT')} in <module>\n" in shown, shown
    assert "        4 | y.mul_(2)  # CULPRIT\n" in shown, shown
    assert f"  victim:  {script}:{marker_line(script, 'VICTIM')} in <module>\n" in shown, shown
    assert "  help: make aten::mul_.Tensor out of place (aten::mul)" in shown, shown
    trace = str(tmp_path / "run.trr")
    assert f"torchrr replay {trace}; as a page: torchrr report {trace} -o" in shown, shown


def test_no_verdict_when_quiet_or_clean(tmp_path):
    script = tmp_path / "buggy.py"
    script.write_text(BUGGY)
    quiet = record(tmp_path / "quiet.trr", [sys.executable, script], flags=["--quiet"])
    assert quiet.returncode == 1 and "RuntimeError" in quiet.stderr
    assert "violation" not in quiet.stderr, quiet.stderr
    clean = tmp_path / "clean.py"
    clean.write_text("import torch\nx = torch.ones(3, requires_grad=True)\n"
                     "torch.sigmoid(x).sum().backward()\n")
    proc = record(tmp_path / "clean.trr", [sys.executable, clean])
    # Only where the trace is: no verdict.
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(f"torchrr: wrote {tmp_path / 'clean.trr'} (the trace, "), \
        proc.stderr
    assert proc.stderr.count("\n") == 1, proc.stderr
