"""A trace shaped like `make demo`'s for the tests of export, redact and report: a small MLP
trained for a step (forward, backward, optimizer), then a second step whose forward modifies the
sigmoid's output in place, so PyTorch raises in backward. Recorded once per test module."""
import sys
import textwrap
from pathlib import Path

from conftest import marker_line, record

SCRIPT = textwrap.dedent("""\
    import torch

    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 16)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)


    def mlp_forward(x, bug):
        gate = layer(x)
        act = torch.sigmoid(gate)  # VICTIM
        if bug:
            act.mul_(gate)  # BUG
        return act.sum()


    for step in range(2):
        optimizer.zero_grad()
        loss = mlp_forward(torch.randn(4, 16), bug=step == 1)
        try:
            loss.backward()
        except RuntimeError as error:
            print("backward raised:", str(error).splitlines()[0])
            break
        optimizer.step()
    """)


def record_demo_like(directory, *, cwd=None, env=None):
    """Writes the script into `directory`, records it, and returns (trace, script, bug line,
    victim line)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / "mlp_step.py"
    script.write_text(SCRIPT)
    trace = directory / "run.trr"
    proc = record(trace, [sys.executable, script], cwd=cwd, env=env)
    assert trace.exists(), f"record wrote no trace: {proc.stderr}"
    assert "backward raised" in proc.stdout, proc.stdout + proc.stderr
    return trace, script, marker_line(script, "BUG"), marker_line(script, "VICTIM")
