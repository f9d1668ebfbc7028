"""The in-process API: `with torchrr.record(...)`, start()/stop(), replay()'s errors."""
import sys

import pytest

import torchrr
from conftest import PYTORCH_INPLACE, needs_build

THIS = __file__


def sigmoid_bug():
    import torch

    x = torch.randn(6, requires_grad=True)
    y = torch.sigmoid(x)  # VICTIM
    y.add_(1)  # CULPRIT
    y.sum().backward()


def line_of(marker):
    with open(THIS) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# " + marker))


def test_import_does_not_import_torch():
    import subprocess

    code = "import sys, torchrr; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(torchrr.__path__[0] + "/..")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@needs_build
def test_record_context_manager_records_the_exception(tmp_path):
    trace = tmp_path / "api.trr"
    with pytest.raises(RuntimeError, match=PYTORCH_INPLACE):
        with torchrr.record(trace, native_stacks=False) as rec:
            assert rec.recording and torchrr.recording()
            sigmoid_bug()
    assert not torchrr.recording()
    report = torchrr.replay(trace)
    assert len(report.violations) == 1
    v = report.violations[0]
    assert v.pytorch_raised and PYTORCH_INPLACE in v.pytorch_message
    assert v.backward_node.name == "SigmoidBackward0"
    assert (v.culprit.op, v.culprit.user_frame.line) == ("aten::add_", line_of("CULPRIT"))
    assert v.culprit.user_frame.function == "sigmoid_bug"
    assert v.culprit.user_frame.file == THIS
    assert v.victim.user_frame.line == line_of("VICTIM")
    # Frames below the user's: pytest's own (site-packages) are framework, this file is not.
    python = [f for f in v.culprit.stack if f.python]
    assert not python[0].framework
    assert any(f.framework and "site-packages" in f.file for f in python)


@needs_build
def test_second_recording_names_the_same_code_again(tmp_path):
    # Code objects are interned for the process; each trace must still describe them.
    for name in ("first.trr", "second.trr"):
        assert torchrr.start(tmp_path / name, native_stacks=False)
        try:
            sigmoid_bug()
        except RuntimeError:
            pass
        assert torchrr.stop()
        v = torchrr.replay(tmp_path / name).violations[0]
        assert v.culprit.user_frame is not None, name
        assert v.culprit.user_frame.function == "sigmoid_bug", name


@needs_build
def test_python_stacks_off(tmp_path):
    trace = tmp_path / "nostacks.trr"
    with torchrr.record(trace, native_stacks=False, python_stacks=False):
        try:
            sigmoid_bug()
        except RuntimeError:
            pass
    v = torchrr.replay(trace).violations[0]
    assert v.culprit.op == "aten::add_"
    assert v.culprit.stack == [] and v.culprit.user_frame is None


@needs_build
def test_start_twice_and_stop_without_start(tmp_path):
    assert not torchrr.stop()
    assert torchrr.start(tmp_path / "a.trr", native_stacks=False)
    try:
        assert not torchrr.start(tmp_path / "b.trr")  # Already recording: a warning, False.
    finally:
        assert torchrr.stop()


@needs_build
def test_replay_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        torchrr.replay(tmp_path / "missing.trr")
    junk = tmp_path / "junk.trr"
    junk.write_bytes(b"not a trace at all" * 10)
    with pytest.raises(torchrr.ReplayError) as info:
        torchrr.replay(junk)
    assert info.value.exit_code == 3
