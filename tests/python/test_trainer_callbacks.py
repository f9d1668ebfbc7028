"""torchrr.callbacks: the trainers' own optimizer steps are torchrr's steps.

Each trainer runs 4 optimizer steps of 2 micro-batches under `torchrr record --keep-last 2`; the
trace must keep the last 2 of those 4 steps (its steps 2 and 3), and each kept step must hold its
2 backward passes. Without the callback the recorder counts micro-batches, which the same check
tells apart.
"""
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

import torchrr
from conftest import needs_build, record

TRAINER_STEPS = Path(__file__).parent / "trainer_steps.py"
needs_lightning = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                     reason="lightning is not installed (requirements.txt)")


def kept_steps(tmp_path, trainer, *args):
    """Records trainer_steps.py TRAINER under --keep-last 2; returns the replay's
    recording.steps, its backward passes and the optimizer steps the trainer printed."""
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, TRAINER_STEPS, trainer, tmp_path / "out", *args],
                  flags=["--keep-last", "2"], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert trace.exists(), proc.stderr  # The recorder says why it did not record.
    trainer_steps = int(proc.stdout.split("optimizer steps")[-1].split()[0])
    report = torchrr.replay(trace)
    return report.recording["steps"], report.backward_passes, trainer_steps


def test_importing_the_callbacks_imports_no_trainer():
    code = ("import sys, torchrr.callbacks; "
            "print([m for m in ('torch', 'transformers', 'lightning') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@needs_build
def test_transformers_trainer_steps(tmp_path):
    steps, passes, trainer_steps = kept_steps(tmp_path, "transformers", "callback")
    assert trainer_steps == 4
    assert (steps["first"], steps["last"], steps["count"], steps["window"]) == (2, 3, 2, True)
    assert passes == 2 * 2  # The 2 kept optimizer steps' micro-batches.


@needs_build
def test_transformers_trainer_without_the_callback_counts_micro_batches(tmp_path):
    steps, passes, trainer_steps = kept_steps(tmp_path, "transformers", "none")
    assert trainer_steps == 4
    assert (steps["first"], steps["last"], passes) == (6, 7, 2)


@needs_build
@needs_lightning
def test_lightning_trainer_steps(tmp_path):
    # 8 batches in one epoch: 4 optimizer steps of 2.
    steps, passes, trainer_steps = kept_steps(tmp_path, "lightning", "callback", 8, 1)
    assert trainer_steps == 4
    assert (steps["first"], steps["last"], steps["count"], steps["window"]) == (2, 3, 2, True)
    assert passes == 2 * 2


@needs_build
@needs_lightning
def test_lightning_steps_restart_with_each_epoch(tmp_path):
    # 3 batches an epoch, 2 epochs: Lightning steps after batches 1 and 2 of each epoch, so the
    # last step holds one micro-batch.
    steps, passes, trainer_steps = kept_steps(tmp_path, "lightning", "callback", 3, 2)
    assert trainer_steps == 4
    assert (steps["first"], steps["last"], passes) == (2, 3, 2 + 1)

