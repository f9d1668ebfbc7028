"""Forked processes under `torchrr record`: a forked child stops recording before it runs anything,
never waits on the parent's locks or threads, and leaves the parent's trace intact. With
--follow-forks it records into a trace of its own, FILE.pidN.trr, started afresh in the child.
DataLoader workers are forked children in nearly every training run."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import torchrr
from conftest import cli, needs_build, record, trace_order_problems

pytestmark = needs_build

DATALOADER = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            x = torch.full((8,), float(i))
            return x.mul(x).add_(1)  # Ops in the worker: never in the parent's trace.

    if __name__ == "__main__":
        w = torch.ones(8, requires_grad=True)
        loader = DataLoader(Squares(), batch_size=8, num_workers=2,
                            multiprocessing_context="fork")
        for epoch in range(2):
            for batch in loader:
                (batch * w).sigmoid().sum().backward()
        print("done")
    """)

# The child runs ops (more than the inherited queue holds, with no writer thread of the parent's
# here) inside a range opened before the fork, then a backward pass, and exits normally (the
# parent's atexit handlers run in it too). It must not keep the parent's trace open (and locked).
FORK_CHILD = textwrap.dedent("""\
    import os, sys, torch, torchrr

    w = torch.ones(16, requires_grad=True)
    (w * 2).sum().backward()
    with torch.autograd.profiler.record_function("around the fork"):
        pid = os.fork()
        if pid == 0:
            x = torch.zeros(16)
            for _ in range(20000):
                x.add_(1)
    if pid == 0:
        v = torch.ones(4, requires_grad=True)
        (v * 5).sigmoid().sum().backward()
        print("child recording:", torchrr.recording(), flush=True)
        fds = "/proc/self/fd"
        held = [fd for fd in os.listdir(fds) if os.path.realpath(f"{fds}/{fd}") ==
                os.environ["TORCHRR_OUTPUT"]]
        print("child holds the parent's trace:", bool(held), flush=True)
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    (w * 3).sigmoid().sum().backward()
    print("child pid:", pid)
    print("child status:", os.waitstatus_to_exitcode(status))
    """)

# torchrr.start(follow_forks=True) without `torchrr record`: a child and a grandchild, each
# exiting normally without a stop() of its own.
API_GRANDCHILD = textwrap.dedent("""\
    import os, sys, torch, torchrr

    torchrr.start(sys.argv[1], follow_forks=True)
    a = torch.ones(4).mul(2)
    child = os.fork()
    if child == 0:
        b = torch.ones(4).add(1)
        grandchild = os.fork()
        if grandchild == 0:
            c = torch.ones(4).sub(1)
            sys.exit(0)
        _, status = os.waitpid(grandchild, 0)
        print("grandchild:", grandchild, os.waitstatus_to_exitcode(status), flush=True)
        sys.exit(0)
    _, status = os.waitpid(child, 0)
    print("child:", child, os.waitstatus_to_exitcode(status))
    torchrr.stop()
    """)

# A child that execs at once (subprocess with a preexec_fn forks with fork(), not vfork).
FORK_EXEC = textwrap.dedent("""\
    import subprocess, sys, torch

    w = torch.ones(4, requires_grad=True)
    subprocess.run(["true"], preexec_fn=lambda: None, check=True)
    (w * 2).sum().backward()
    print("done")
    """)


def _assert_clean(trace):
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok", report.trace
    assert report.violations == []
    return report


def _info(trace):
    """`torchrr info --json` of a trace that must read whole (exit 0)."""
    proc = subprocess.run([cli(), "info", "--json", str(trace)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, f"{trace}: torchrr info exit {proc.returncode}: {proc.stderr}"
    return json.loads(proc.stdout)


def _op_names(trace):
    """The names of the ops recorded in `trace` (`torchrr dump --json`)."""
    proc = subprocess.run([cli(), "dump", "--json", str(trace)], capture_output=True, text=True,
                          timeout=60, check=True)
    records = [json.loads(line) for line in proc.stdout.splitlines()]
    strings = {r["id"]: r["text"] for r in records if r.get("kind") == "string"}
    return {strings.get(r["name"]) for r in records if r.get("kind") == "op"}


def _child_traces(directory):
    return sorted(directory.glob("run.pid*.trr"))


def _record(tmp_path, source, flags=(), env=None):
    """Records the Python program `source` into tmp_path/run.trr; returns (its stdout lines, the
    trace) once it exited 0."""
    script = tmp_path / "program.py"
    script.write_text(source)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], timeout=90, flags=flags, env=env)
    assert proc.returncode == 0, proc.stderr
    if "--follow-forks" in flags:
        assert "torchrr: warning" not in proc.stderr, proc.stderr
    return proc.stdout.splitlines(), trace


@pytest.mark.parametrize("run", range(6))
def test_dataloader_workers_never_hang(tmp_path, run):
    lines, trace = _record(tmp_path, DATALOADER)
    assert lines == ["done"]
    report = _assert_clean(trace)
    # The workers' ops are not in the parent's trace: 16 batches of mul and add_ would be there.
    assert report.backward_passes == 16
    assert _child_traces(tmp_path) == []


def test_forked_child_exits_normally_and_the_parents_trace_is_intact(tmp_path):
    # Left in the caller's environment, not asked for on the command line: torchrr record clears it.
    lines, trace = _record(tmp_path, FORK_CHILD, flags=["--max-buffer-mb", "1"],
                           env={"TORCHRR_FOLLOW_FORKS": "1"})
    assert "child recording: False" in lines
    assert "child holds the parent's trace: False" in lines
    assert "child status: 0" in lines
    report = _assert_clean(trace)
    assert report.backward_passes == 2
    assert report.ops < 20000  # None of the child's.
    assert _child_traces(tmp_path) == []


def test_followed_child_records_its_own_trace(tmp_path):
    lines, trace = _record(tmp_path, FORK_CHILD, flags=["--follow-forks"])
    assert "child recording: True" in lines
    assert "child holds the parent's trace: False" in lines
    assert "child status: 0" in lines
    child_pid = int(next(line for line in lines if line.startswith("child pid:")).split()[-1])
    assert _child_traces(tmp_path) == [tmp_path / f"run.pid{child_pid}.trr"]
    child_trace = tmp_path / f"run.pid{child_pid}.trr"

    parent_info, child_info = _info(trace), _info(child_trace)
    assert child_info["info"]["pid"] == child_pid, child_info
    assert parent_info["info"]["pid"] != child_pid

    parent = _assert_clean(trace)
    assert parent.backward_passes == 2
    assert parent.ops < 20000  # None of the child's.
    child = _assert_clean(child_trace)
    assert child.ops >= 20000  # Its add_s, none of the parent's before the fork...
    assert child.backward_passes == 1  # ...nor after.
    # Nothing of the parent's in the child's records: the range opened before the fork ends in
    # the child, unrecorded there, as its name and id are the parent's.
    assert trace_order_problems(child_trace) == []
    assert trace_order_problems(trace) == []


def test_a_child_that_execs_at_once_leaves_no_trace(tmp_path):
    lines, trace = _record(tmp_path, FORK_EXEC, flags=["--follow-forks"])
    assert lines == ["done"]
    _assert_clean(trace)
    assert _child_traces(tmp_path) == []


def test_followed_grandchild_through_the_python_api(tmp_path):
    script = tmp_path / "program.py"
    script.write_text(API_GRANDCHILD)
    trace = tmp_path / "run.trr"
    env = dict(os.environ, PYTHONPATH=str(Path(torchrr.__path__[0]).parent))
    proc = subprocess.run([sys.executable, str(script), str(trace)], env=env,
                          capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "torchrr: warning" not in proc.stderr, proc.stderr
    pids = {line.split()[0]: (int(line.split()[1]), line.split()[2])
            for line in proc.stdout.splitlines()}
    assert pids["child:"][1] == "0" and pids["grandchild:"][1] == "0", proc.stdout
    child, grandchild = pids["child:"][0], pids["grandchild:"][0]
    # Each named after the trace of the process it was forked from.
    expected = {trace: "aten::mul", tmp_path / f"run.pid{child}.trr": "aten::add",
                tmp_path / f"run.pid{child}.pid{grandchild}.trr": "aten::sub"}
    assert sorted(tmp_path.glob("*.trr")) == sorted(expected)
    for path, own_op in expected.items():
        assert _info(path)["closed_cleanly"], path
        names = _op_names(path)
        assert own_op in names, (path, names)
        assert not names & ({"aten::mul", "aten::add", "aten::sub"} - {own_op}), (path, names)


@pytest.mark.parametrize("run", range(4))
def test_followed_dataloader_workers_never_hang(tmp_path, run):
    lines, trace = _record(tmp_path, DATALOADER, flags=["--follow-forks"])
    assert lines == ["done"]
    report = _assert_clean(trace)
    assert report.backward_passes == 16
    # Two workers per epoch, each closed by multiprocessing's finalizers before os._exit.
    workers = _child_traces(tmp_path)
    assert len(workers) == 4, workers
    worker_ops = 0
    for worker in workers:
        _info(worker)
        worker_report = _assert_clean(worker)
        assert worker_report.backward_passes == 0
        worker_ops += worker_report.ops
    # Each of the 64 items: a full, a mul and an add_, in one worker or the other.
    assert worker_ops >= 3 * 64, worker_ops
