"""Tensor types beyond plain strided ones (nested, sparse, quantized, FakeTensor) are recorded,
never a reason to stop the whole recording."""
import subprocess
import sys
import textwrap

from conftest import cli, needs_build, record_warm

pytestmark = needs_build

SCRIPT = textwrap.dedent("""\
    import warnings
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    warnings.simplefilter("ignore")
    nt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], requires_grad=True)
    torch.nested.to_padded_tensor((nt * 2).sin(), 0.0).sum().backward()
    s = torch.randn(4, 4).to_sparse().requires_grad_()
    torch.sparse.mm(s, torch.randn(4, 2)).sum().backward()
    q = torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.quint8)
    q.dequantize().sum().item()
    with FakeTensorMode():
        a = torch.randn(3, 3, requires_grad=True)
        (a * 2).sum().backward()
    print("done")
    """)


def test_unusual_tensors_do_not_stop_the_recording(tmp_path):
    script = tmp_path / "types.py"
    script.write_text(SCRIPT)
    trace = tmp_path / "run.trr"
    proc = record_warm(trace, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "done"
    assert "recording stopped" not in proc.stderr, proc.stderr
    replay = subprocess.run([cli(), "replay", str(trace)], capture_output=True, text=True,
                            timeout=60)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "no saved tensor was modified (" in replay.stdout
