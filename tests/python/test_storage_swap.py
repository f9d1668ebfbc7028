"""`.data =` on a saved tensor between its save and backward's use of it (set_data: no op of the
dispatcher's, no version bump): PyTorch raises nothing and the gradient uses the new values.
torchrr reports it by default, without --verify-saved: kind silent, evidence storage_swap, the
assignment's line as culprit. A swap after backward, or on a tensor nothing saved, is legal."""
import sys
import textwrap

import torchrr
from conftest import marker_line, needs_build, record_warm

pytestmark = needs_build

# A spectral-norm layer as GAN code writes it: the weight rescaled through .data at every forward,
# the discriminator called on real and fake data before one backward.
SPECTRAL = textwrap.dedent("""\
    import torch
    torch.manual_seed(0)
    class SNLinear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(8, 8))
        def forward(self, x):
            sigma = torch.linalg.matrix_norm(self.weight.data, ord=2)
            self.weight.data = self.weight.data / sigma  # SWAP
            return x @ self.weight  # VICTIM
    d = SNLinear()
    real = torch.randn(4, 8, requires_grad=True)
    fake = torch.randn(4, 8, requires_grad=True)
    loss = d(real).mean() - d(fake).mean()
    loss.backward()
    """)

LEGAL = textwrap.dedent("""\
    import torch
    w = torch.nn.Parameter(torch.randn(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    for step in range(2):
        (x @ w).sum().backward()
        w.data = w.data / 2  # After backward.
    b = torch.nn.Parameter(torch.randn(4))
    b.data = b.data * 2  # Nothing saved b yet.
    (x @ w + b).sum().backward()
    m = torch.nn.Linear(4, 4)
    m.double()  # Module._apply moves each parameter to new storage through .data.
    m(torch.randn(2, 4, dtype=torch.float64, requires_grad=True)).sum().backward()
    """)


def _violations(tmp_path, source, name):
    script = tmp_path / f"{name}.py"
    script.write_text(source)
    trace = tmp_path / f"{name}.trr"
    proc = record_warm(trace, [sys.executable, script])
    assert proc.returncode == 0, proc.stderr
    return script, torchrr.replay(trace).violations


def test_data_assignment_between_save_and_use_is_reported(tmp_path):
    script, violations = _violations(tmp_path, SPECTRAL, "spectral")
    assert violations, "the swap was not reported"
    v = violations[0]
    assert (v.kind, v.evidence, v.pytorch_raised) == ("silent", "storage_swap", False)
    assert v.culprit.user_frame.line == marker_line(script, "SWAP")
    assert v.victim.user_frame.line == marker_line(script, "VICTIM")
    assert v.backward_node.name == "MmBackward0"


def test_data_assignments_that_backward_never_sees_are_legal(tmp_path):
    _, violations = _violations(tmp_path, LEGAL, "legal")
    assert violations == []
