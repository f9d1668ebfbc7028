"""`torchrr record --locate-write EARLIER.trr`: a write into a saved tensor's bytes that no op made
(found by --verify-saved's fingerprints, with no culprit) is named to the line that made it by a
second run that watches those bytes line by line; a run that does not repeat the write, or a
trace with nothing to locate, says so."""
import sys
import textwrap

from conftest import marker_line, needs_build, record

pytestmark = needs_build

# A fused loss that stores into its input's memory through data_ptr(), as Triton kernels do.
FUSED = textwrap.dedent("""\
    import ctypes
    import os
    import torch

    def fused_loss(logits):
        loss = logits.sum()
        if os.environ.get("SKIP_WRITE") != "1":
            zeros = torch.zeros_like(logits)
            ctypes.memmove(logits.data_ptr(), zeros.data_ptr(), logits.numel() * 4)  # WRITE
        return loss

    x = torch.randn(8, requires_grad=True)
    y = torch.sigmoid(x)
    loss = fused_loss(y)  # CALL
    y.sum().backward()
    """)

NUMPY = textwrap.dedent("""\
    import torch
    x = torch.randn(8, requires_grad=True)
    y = torch.sigmoid(x)
    view = y.detach().numpy()
    total = float(view.sum())
    view *= 0.5  # WRITE
    y.sum().backward()
    """)


def _locate(tmp_path, script, env=None):
    first = tmp_path / "first.trr"
    proc = record(first, [sys.executable, script], flags=("--verify-saved", "--quiet"))
    assert proc.returncode == 0, proc.stderr
    return record(tmp_path / "second.trr", [sys.executable, script], env=env,
                  flags=("--locate-write", str(first), "--quiet"))


def test_a_write_through_data_ptr_is_named_with_its_caller(tmp_path):
    script = tmp_path / "fused.py"
    script.write_text(FUSED)
    proc = _locate(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert "changed while this line ran" in proc.stderr, proc.stderr
    assert f"fused.py:{marker_line(script, 'WRITE')} in fused_loss" in proc.stderr, proc.stderr
    assert f"called from {script}:{marker_line(script, 'CALL')}" in proc.stderr, proc.stderr


def test_a_numpy_write_is_named(tmp_path):
    script = tmp_path / "numpy_write.py"
    script.write_text(NUMPY)
    proc = _locate(tmp_path, script)
    assert f"numpy_write.py:{marker_line(script, 'WRITE')} in <module>" in proc.stderr, \
        proc.stderr


def test_a_run_without_the_write_says_so(tmp_path):
    script = tmp_path / "fused.py"
    script.write_text(FUSED)
    proc = _locate(tmp_path, script, env={"SKIP_WRITE": "1"})
    assert "did not change between its save and its use in this run" in proc.stderr, proc.stderr
    assert "changed while this line ran" not in proc.stderr


def test_a_trace_without_such_a_write_has_nothing_to_locate(tmp_path):
    script = tmp_path / "clean.py"
    script.write_text("import torch\n(torch.ones(2, requires_grad=True) * 2).sum().backward()\n")
    proc = _locate(tmp_path, script)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to locate" in proc.stderr, proc.stderr
