"""`torchrr fix --check` on a rank's trace of a torchrun launch (2 gloo ranks on the CPU): the
whole launch is re-run on the patched copy and the same rank's new trace replayed; the other
ranks' traces are reported when they hold violations. A rank that no torchrun on this machine
started is refused with exit 11."""
import os
import subprocess
import sys

from conftest import cli, marker_line, needs_build, record, record_ranks
from test_fix import PLANTED, files_under, fix, write_program

pytestmark = needs_build

# argv: the number of steps, or "forever"; "rank0_writes": after them, rank 0 alone writes into
# a saved tensor. Every rank's step writes into what sigmoid saved, so each trace names that line.
PROGRAM = """\
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
w = torch.ones(4, requires_grad=True)
steps = None if sys.argv[1] == "forever" else int(sys.argv[1])
step = 0
while steps is None or step < steps:
    y = (w * (rank + 1)).sigmoid()
    y.mul_(2)  # every rank's write
    y.sum().backward()
    dist.all_reduce(w.grad)
    w.grad = None
    step += 1
if "rank0_writes" in sys.argv:
    dist.barrier()
    if rank == 0:
        z = w.exp()
        z.add_(1)  # rank 0's own write
        z.sum().backward()
dist.destroy_process_group()
"""


def test_check_reruns_the_whole_launch_and_replays_the_same_rank(tmp_path):
    script, documents, _ = record_ranks(tmp_path, "ranks.py", PROGRAM, "3")
    assert all(documents[r]["violations"] for r in (0, 1)), documents
    before = files_under(tmp_path)
    check = fix("--check", "run.rank1.trr", cwd=tmp_path, timeout=240)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    # A lone rank would fail in init_process_group; the launch ran both, with the same argument.
    assert "with this patch: backward ran (3 passes), 0 violations" in lines, check.stdout
    assert (f"  (rank 1 of the launch re-run as: torchrun --standalone --nproc-per-node 2 "
            f"{script} 3)") in lines, check.stdout
    assert not [line for line in lines if line.startswith("but ")], check.stdout
    assert files_under(tmp_path) == before, "--check wrote beside the user's files"


def test_another_ranks_violations_make_the_check_fail(tmp_path):
    script, documents, _ = record_ranks(tmp_path, "ranks.py", PROGRAM, "2", "rank0_writes")
    check = fix("--check", "run.rank1.trr", cwd=tmp_path, timeout=240)
    assert check.returncode == 1, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert "with this patch: backward ran (2 passes), 0 violations" in lines, check.stdout
    at = lines.index("but rank 0's trace has 1 violation")
    assert lines[at + 1:] == [f"  version: aten::add_ at {script}:"
                              f"{marker_line(script, 'rank 0.s own write')}"], check.stdout
    assert script.read_text() == PROGRAM, "--check wrote the user's file"


def test_steps_stops_a_launch_that_never_ends(tmp_path):
    script, _, _ = record_ranks(tmp_path, "ranks.py", PROGRAM, "forever")
    before = files_under(tmp_path)
    check = fix("--check", "--steps", 2, "--timeout", 120, "run.rank0.trr", cwd=tmp_path,
                timeout=240)
    assert check.returncode == 0, check.stdout + check.stderr
    assert ("with this patch, in the first 2 steps: backward ran (2 passes), 0 violations"
            in check.stdout.splitlines()), check.stdout
    assert files_under(tmp_path) == before, "--check wrote beside the user's files"


def test_ranks_on_several_machines_are_refused(tmp_path):
    record_ranks(tmp_path, "ranks.py", PROGRAM, "1")
    # rank 0's trace as another machine would have written it: its host is another name.
    redact = subprocess.run([cli(), "redact", "run.rank0.trr", "-o", "other.trr"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert redact.returncode == 0, redact.stderr
    os.replace(tmp_path / "other.trr", tmp_path / "run.rank0.trr")
    check = fix("--check", "run.rank1.trr", cwd=tmp_path)
    assert check.returncode == 11, check.stdout + check.stderr
    assert check.stderr.count("\n") == 1 and "several machines" in check.stderr, check.stderr


def test_a_rank_that_torchrun_did_not_start_is_refused(tmp_path):
    # RANK and WORLD_SIZE set by hand (as a scheduler's launcher would): `python script.py`, not
    # torchrun's `python -u script.py`, so the launch is unknown.
    body, _, _ = PLANTED["mul_after_sigmoid"]
    script = write_program(tmp_path, "by_hand", body)
    record(tmp_path / "by_hand.trr", [sys.executable, script.name], cwd=script.parent,
           env={"RANK": "1", "WORLD_SIZE": "2"})
    check = fix("--check", tmp_path / "by_hand.rank1.trr", cwd=script.parent)
    assert check.returncode == 11, check.stdout + check.stderr
    assert check.stderr.count("\n") == 1 and "not as torchrun starts a worker" in check.stderr, \
        check.stderr
