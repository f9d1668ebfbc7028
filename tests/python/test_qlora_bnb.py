"""A QLoRA block as a user runs it: bitsandbytes' 4-bit `Linear4bit` (its CPU path) with PEFT LoRA
adapters, trained two steps under `torchrr record`. bitsandbytes' `MatMul4Bit` keeps the packed
weight and its quantization state on its ctx (`ctx.tensors`, `ctx.state`), not with
save_for_backward, and reentrant checkpointing recomputes the block from the weights as they are
in backward: a packed weight refilled between forward and backward (weight streaming) is a
silently wrong gradient that PyTorch does not see. The clean step gives nothing, with
checkpointing off, non-reentrant and reentrant."""
import sys

import pytest

import torchrr
from conftest import marker_line, needs_build, record_warm

pytest.importorskip("bitsandbytes")
pytest.importorskip("peft")

PROGRAM = """\
import sys

import bitsandbytes as bnb
import torch
import torch.utils.checkpoint
from peft import LoraConfig, get_peft_model

torch.manual_seed(0)
MODE = sys.argv[1]


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = bnb.nn.Linear4bit(16, 32, bias=False, compute_dtype=torch.float32)
        self.down = bnb.nn.Linear4bit(32, 16, bias=False, compute_dtype=torch.float32)

    def mlp(self, x):
        return self.down(torch.relu(self.up(x)))

    def forward(self, x):
        if MODE == "plain":
            return self.mlp(x)
        return torch.utils.checkpoint.checkpoint(  # CHECKPOINT
            self.mlp, x, use_reentrant=MODE == "reentrant")


model = Block()
for lin in (model.up, model.down):
    lin.weight = bnb.nn.Params4bit(torch.randn(lin.out_features, lin.in_features),
                                   requires_grad=False, quant_type="nf4").to("cpu")
model = get_peft_model(model, LoraConfig(r=4, target_modules=["up", "down"]))
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
x = torch.randn(4, 16, requires_grad=True)
for step in range(2):
    loss = model(x).pow(2).mean()
    if "refill" in sys.argv and step == 1:
        # Weight streaming: the next layer's packed weight into the same buffer.
        packed = model.base_model.model.down.base_layer.weight
        packed.data.copy_(torch.roll(packed.data, 1, 0))  # REFILL
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{(mode, refill): (script, replayed Report)}."""
    root = tmp_path_factory.mktemp("qlora")
    script = root / "qlora.py"
    script.write_text(PROGRAM)
    out = {}
    for mode, refill in (("plain", False), ("nonreentrant", False), ("reentrant", False),
                         ("plain", True), ("reentrant", True)):
        trace = root / f"{mode}{'_refill' if refill else ''}.trr"
        args = [sys.executable, script, mode] + (["refill"] if refill else [])
        proc = record_warm(trace, args, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode, refill] = script, torchrr.replay(trace)
    return out


@needs_build
@pytest.mark.parametrize("mode", ["plain", "nonreentrant", "reentrant"])
def test_a_clean_qlora_step_gives_nothing(runs, mode):
    _, report = runs[mode, False]
    assert report.violations == [] and report.ops > 0, report.violations


@needs_build
@pytest.mark.parametrize("mode", ["plain", "reentrant"])
def test_a_refilled_4bit_weight_is_named_at_the_refill(runs, mode):
    script, report = runs[mode, True]
    assert len(report.violations) == 1, report.violations
    v = report.violations[0]
    assert v.kind == "silent" and not v.pytorch_raised
    assert v.culprit.user_frame.line == marker_line(script, "REFILL")
    if mode == "reentrant":
        # The recomputation read the refilled weight: the checkpoint call is the victim.
        assert v.read_by_recompute and v.victim.op == "CheckpointFunction"
        assert v.victim.user_frame.line == marker_line(script, "CHECKPOINT")
    else:
        # What MatMul4Bit kept on its ctx, read by its backward.
        assert v.victim.op == "MatMul4Bit" and not v.read_by_recompute
