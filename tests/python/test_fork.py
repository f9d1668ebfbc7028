"""Forked processes under `torchrr record`: a forked child stops recording before it runs anything,
never waits on the parent's locks or threads, and leaves the parent's trace intact. DataLoader
workers are forked children in nearly every training run."""
import sys
import textwrap

import pytest

import torchrr
from conftest import needs_build, record

pytestmark = needs_build

DATALOADER = textwrap.dedent("""\
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Squares(Dataset):
        def __len__(self):
            return 64
        def __getitem__(self, i):
            x = torch.full((8,), float(i))
            return x.mul(x).add_(1)  # Ops in the worker: it must not record them.

    if __name__ == "__main__":
        w = torch.ones(8, requires_grad=True)
        loader = DataLoader(Squares(), batch_size=8, num_workers=2,
                            multiprocessing_context="fork")
        for epoch in range(2):
            for batch in loader:
                (batch * w).sigmoid().sum().backward()
        print("done")
    """)

FORK_CHILD = textwrap.dedent("""\
    import os, sys, torch, torchrr

    w = torch.ones(16, requires_grad=True)
    (w * 2).sum().backward()
    pid = os.fork()
    if pid == 0:
        # Many ops: more than the inherited queue holds, with no writer thread here.
        x = torch.zeros(16)
        for _ in range(20000):
            x.add_(1)
        print("child recording:", torchrr.recording(), flush=True)
        sys.exit(0)  # A normal exit: the parent's atexit handlers run here too.
    _, status = os.waitpid(pid, 0)
    (w * 3).sigmoid().sum().backward()
    print("child status:", os.waitstatus_to_exitcode(status))
    """)


def _assert_clean(trace):
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok", report.trace
    assert report.violations == []
    return report


@pytest.mark.parametrize("run", range(6))
def test_dataloader_workers_never_hang(tmp_path, run):
    script = tmp_path / "loader.py"
    script.write_text(DATALOADER)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    report = _assert_clean(trace)
    # The workers' ops are not in the parent's trace: 16 batches of mul and add_ would be there.
    assert report.backward_passes == 16


def test_forked_child_exits_normally_and_the_parents_trace_is_intact(tmp_path):
    script = tmp_path / "fork.py"
    script.write_text(FORK_CHILD)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script], timeout=90, flags=["--max-buffer-mb", "1"])
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "child recording: False" in lines
    assert "child status: 0" in lines
    report = _assert_clean(trace)
    assert report.backward_passes == 2
    assert report.ops < 20000  # None of the child's.
