"""Distributed launchers under `torchrr record`: the launcher records nothing, each worker it
starts records its own rank's trace (run.rankN.trr), whichever launcher it is."""
import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest

import torchrr
from conftest import free_port, marker_line, needs_build, record

pytestmark = needs_build

WORKER = textwrap.dedent("""\
    import os, torch
    rank = int(os.environ["RANK"])
    w = torch.randn(8, 8, requires_grad=True)
    h = torch.sigmoid(torch.randn(4, 8) @ w)  # VICTIM
    if rank == 1:
        h.mul_(2)  # BUG
    try:
        h.sum().backward()
    except RuntimeError:
        print("rank", rank, "raised", flush=True)
    """)


def _culprits(trace):
    return [v.culprit.user_frame.line for v in torchrr.replay(trace).violations]


@pytest.mark.skipif(importlib.util.find_spec("accelerate") is None, reason="needs accelerate")
def test_accelerate_launch_records_each_worker(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import torch.distributed as dist\ndist.init_process_group('gloo')\n" +
                      WORKER + "dist.barrier()\ndist.destroy_process_group()\n")
    accelerate = os.path.join(os.path.dirname(sys.executable), "accelerate")
    trace = tmp_path / "run.trr"
    # --multi_gpu is accelerate's word for several processes; without a GPU they use gloo.
    proc = record(trace, [accelerate, "launch", "--multi_gpu", "--num_processes", "2",
                          "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
                          "no", "--main_process_port", str(free_port()), script],
                  cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not trace.exists(), "the launcher recorded itself"
    assert _culprits(tmp_path / "run.rank0.trr") == []
    assert _culprits(tmp_path / "run.rank1.trr") == [marker_line(script, "BUG")]
    assert "run.rank1.trr" in proc.stderr  # The verdict after the program.


def test_workers_of_a_launcher_torchrr_does_not_know_record_their_ranks(tmp_path):
    # A recorded program that starts its ranks itself (as Lightning's and many in-house launchers
    # do): each child of another rank records into its own trace.
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    launcher = tmp_path / "launcher.py"
    launcher.write_text(textwrap.dedent(f"""\
        import os, subprocess, sys, torch
        torch.ones(2).add(1)
        children = [subprocess.Popen([sys.executable, {str(worker)!r}],
                                     env=dict(os.environ, RANK=str(rank)))
                    for rank in range(2)]
        sys.exit(max(child.wait() for child in children))
        """))
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, launcher], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _culprits(trace) == []
    assert _culprits(tmp_path / "run.rank0.trr") == []
    assert _culprits(tmp_path / "run.rank1.trr") == [marker_line(worker, "BUG")]
