"""DDP under torchrun (gloo on CPU), recorded: one trace per rank (run.rank<N>.trr); a bug on one
rank only is reported in that rank's trace; DDP's gradient buckets and their in-place all-reduce
are legal; `torchrr replay run.rank*.trr` replays each and sums up per rank."""
import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import cli, free_port, marker_line, needs_build, record, same_file

pytestmark = needs_build

PROGRAM = textwrap.dedent("""\
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(8, 16)
            self.l2 = torch.nn.Linear(16, 1)
            self.bug = False

        def forward(self, x):
            h = torch.sigmoid(self.l1(x))
            out = self.l2(h)  # VICTIM
            if self.bug:
                h.mul_(2)  # CULPRIT
            return out


    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = Net()
    model = DDP(net)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    for step in range(2):
        net.bug = rank == 1 and step == 1  # Rank 1, second step only.
        out = model(x)
        optimizer.zero_grad()
        try:
            out.sum().backward()
        except RuntimeError:
            break  # Rank 1's error; rank 0's all-reduce then fails as rank 1 leaves.
        optimizer.step()
    dist.destroy_process_group()
    """)


def test_ddp_one_trace_per_rank_and_the_bug_in_its_rank(tmp_path):
    script = tmp_path / "ddp.py"
    script.write_text(PROGRAM)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = record(tmp_path / "run.trr",
                  [torchrun, "--nproc-per-node", "2", "--master-port", str(free_port()), script],
                  timeout=240, cwd=tmp_path)
    traces = sorted(p.name for p in tmp_path.glob("run.rank*.trr"))
    assert traces == ["run.rank0.trr", "run.rank1.trr"], (traces, proc.stderr[-2000:])

    def replay(*names):
        return subprocess.run([cli(), "replay", "--json", *names], capture_output=True,
                              text=True, timeout=120, cwd=tmp_path)

    rank0 = replay("run.rank0.trr")
    assert rank0.returncode == 0, rank0.stdout[-2000:] + rank0.stderr
    assert json.loads(rank0.stdout)["violations"] == []
    rank1 = replay("run.rank1.trr")
    assert rank1.returncode == 1, rank1.stderr
    first = json.loads(rank1.stdout)["violations"][0]
    assert first["kind"] == "version" and first["pytorch_raised"]
    assert same_file(first["culprit"]["user_frame"]["file"], script)
    assert first["culprit"]["user_frame"]["line"] == marker_line(script, "CULPRIT")
    assert first["victim"]["user_frame"]["line"] == marker_line(script, "VICTIM")

    both = replay("run.rank0.trr", "run.rank1.trr")
    assert both.returncode == 1, both.stderr
    assert [len(t["violations"]) > 0 for t in json.loads(both.stdout)["traces"]] == [False, True]
    text = subprocess.run([cli(), "replay", "run.rank0.trr", "run.rank1.trr"], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert "  run.rank0.trr (rank 0): no violation\n" in text.stdout
    assert "  run.rank1.trr (rank 1): 2 violations\n" in text.stdout
