"""The first NaN or Inf, named where it was made (format 1.16's value ranges, on under `torchrr
record` with no flag): one program, each origin a mode, and the legal twins (masks that keep a
finite score per row, a finfo.min mask, nan_to_num and masked_fill that remove a NaN before the
loss, a GradScaler whose first steps overflow while its scale settles) that must give nothing."""
import json
import subprocess
import sys

import pytest

import torchrr
from conftest import cli, marker_line, needs_build, record_warm

PROGRAM = """\
import sys

import numpy as np
import torch

torch.manual_seed(0)
MODE = sys.argv[1]
w = torch.nn.Parameter(torch.randn(4, 8) * 0.1)
opt = torch.optim.SGD([w], lr=1e38 if MODE == "optimizer" else 0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0**127) if MODE == "legal_scaler" else None


def forward(x):
    h = x @ w.t()
    if MODE == "fp16_overflow":
        big = h.half() * 3000
        y = big * big  # ORIGIN_FP16
        return y.float().mean()
    if MODE == "bf16_overflow":
        big = h.bfloat16() * 1e20
        y = big * big  # ORIGIN_BF16
        return y.float().mean()
    if MODE == "backward_overflow":
        y = (h.half() * 100).float()  # ORIGIN_BACKWARD
        return y.mean() * 1e6
    if MODE == "log_zero":
        return torch.log(h.relu()).mean()  # ORIGIN_LOG
    if MODE in ("masked_row", "legal_mask", "legal_finfo_mask"):
        mask = torch.triu(torch.ones(8, 4, dtype=torch.bool), 1)
        if MODE == "masked_row":
            mask[0] = True  # The first row keeps no score.
        fill = torch.finfo(h.dtype).min if MODE == "legal_finfo_mask" else float("-inf")
        scores = (x.t() @ h).masked_fill(mask, fill)
        p = torch.softmax(scores, dim=-1)  # ORIGIN_SOFTMAX
        return p.pow(2).mean()
    if MODE == "where_trap":
        u = h - h.detach().amin()  # Zero at its smallest element.
        r = torch.where(u > 0, torch.sqrt(u), torch.zeros_like(u))  # ORIGIN_WHERE
        return r.mean()
    if MODE == "legal_nan_to_num":
        return torch.nan_to_num(torch.log(h), nan=0.0, neginf=0.0).mean()
    if MODE == "legal_masked_fill":
        return torch.log(h).masked_fill(h <= 0, 0.0).mean()
    if MODE == "legal_scaler":
        return h.pow(2).mean() * 100
    if MODE == "optimizer":
        return h.pow(2).mean() * 1e4
    return h.pow(2).mean()


for step in range(6 if MODE == "legal_scaler" else 3):
    x = torch.randn(8, 8)
    if MODE == "data":
        batch = np.random.default_rng(step).standard_normal((8, 8)).astype(np.float32)
        batch[3, 3] = np.nan
        x = torch.from_numpy(batch)  # ORIGIN_DATA
        h = x @ w.t()
        loss = h.pow(2).mean()
    else:
        loss = forward(x)
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()  # ORIGIN_STEP
    opt.zero_grad()
    print(step, float(loss))
"""

# mode: (cause, NaN (else Inf), reached, made in backward, dtype, op, marker of its line)
ORIGINS = {
    "fp16_overflow": ("overflow", False, "the loss", False, "float16", "aten::mul",
                      "ORIGIN_FP16"),
    "bf16_overflow": ("overflow", False, "the loss", False, "bfloat16", "aten::mul",
                      "ORIGIN_BF16"),
    "backward_overflow": ("overflow", False, "a gradient", True, "float16", "MulBackward0",
                          "ORIGIN_BACKWARD"),
    "log_zero": ("domain", False, "the loss", False, "float32", "aten::log", "ORIGIN_LOG"),
    "masked_row": ("masked_row", True, "the loss", False, "float32", "aten::softmax",
                   "ORIGIN_SOFTMAX"),
    "where_trap": ("where_trap", True, "a gradient", True, "float32", "SqrtBackward0",
                   "ORIGIN_WHERE"),
    "data": ("data", True, "the loss", False, "float32", "aten::lift_fresh", "ORIGIN_DATA"),
    "optimizer": ("optimizer", False, "a weight", False, "float32", "aten::add_",
                  "ORIGIN_STEP"),
}
LEGAL = ["plain", "legal_mask", "legal_finfo_mask", "legal_nan_to_num", "legal_masked_fill",
         "legal_scaler"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{mode: (script, trace, Report)}."""
    root = tmp_path_factory.mktemp("non_finite")
    script = root / "prog.py"
    script.write_text(PROGRAM)
    out = {}
    for mode in [*ORIGINS, *LEGAL]:
        trace = root / f"{mode}.trr"
        proc = record_warm(trace, [sys.executable, script, mode], timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        out[mode] = script, trace, torchrr.replay(trace)
    return out


@needs_build
@pytest.mark.parametrize("mode", list(ORIGINS))
def test_the_first_nan_or_inf_is_named_at_its_line(runs, mode):
    script, _, report = runs[mode]
    cause, nan, reached, backward, dtype, op, marker = ORIGINS[mode]
    n = report.non_finite
    assert n is not None, report.summary()
    assert (n.cause, n.nan, n.reached, n.backward) == (cause, nan, reached, backward), n
    assert n.op.op == op
    at = n.forward if backward else n.op
    assert at.user_frame.line == marker_line(script, marker), (at, n)
    if cause != "data":
        assert n.dtype == dtype
    if cause == "overflow" and not backward:
        assert n.dtype_max > 0 and 0 < n.input_max_abs < n.dtype_max
    assert report.exit_code == 16 and report.violations == []


@needs_build
@pytest.mark.parametrize("mode", LEGAL)
def test_legal_twins_give_nothing(runs, mode):
    _, _, report = runs[mode]
    assert report.non_finite is None, report.non_finite
    assert report.exit_code == 0 and report.raw["ranges_recorded"]
    if mode == "legal_scaler":
        # Its first steps' scaled gradients overflow and it skips them: a count, not an error.
        assert report.scaler_skipped_steps >= 1


@needs_build
def test_text_gnu_and_sarif_name_the_line(runs):
    script, trace, _ = runs["log_zero"]
    line = marker_line(script, "ORIGIN_LOG")
    text = subprocess.run([cli(), "replay", "--color", "never", trace], capture_output=True,
                          text=True)
    assert text.returncode == 16, text.stderr
    assert "the first Inf reached the loss: aten::log made it from finite inputs" in text.stdout
    assert f"{script}:{line}" in text.stdout
    assert "help: keep the argument in the function's domain" in text.stdout
    gnu = subprocess.run([cli(), "replay", "--format", "gnu", trace], capture_output=True,
                         text=True)
    assert f"{script}:{line}:" in gnu.stdout and "non_finite" in gnu.stdout, gnu.stdout
    sarif = json.loads(subprocess.run([cli(), "replay", "--format", "sarif", trace],
                                      capture_output=True, text=True).stdout)
    results = sarif["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["non_finite"]


TRAINER = """\
import sys

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
model = get_peft_model(LlamaForCausalLM(config),
                       LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))


class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        ids = torch.randint(1, 128, (16,), generator=torch.Generator().manual_seed(i))
        labels = ids.clone()
        if i == 2 and sys.argv[1] == "masked":
            labels[:] = -100  # A prompt-only example: no label left to learn from.
        return {"input_ids": ids, "labels": labels}


args = TrainingArguments(output_dir=sys.argv[2], per_device_train_batch_size=1, max_steps=8,
                         logging_steps=1, report_to="none", save_strategy="no", use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Data()).train()  # TRAIN
"""


@needs_build
@pytest.mark.parametrize("labels", ["masked", "all"])
def test_trainer_peft_step_with_no_label_is_named_in_the_loss(tmp_path, labels):
    """transformers' Trainer logs such a step's NaN loss as 0 (its NaN filter); the recording
    names the division by no token in transformers' loss, run from the user's train() line."""
    pytest.importorskip("peft")
    script = tmp_path / "train.py"
    script.write_text(TRAINER)
    trace = tmp_path / "run.trr"
    proc = record_warm(trace, [sys.executable, script, labels, tmp_path / "out"], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = torchrr.replay(trace)
    if labels == "all":
        assert report.non_finite is None and report.exit_code == 0, report.non_finite
        return
    n = report.non_finite
    assert n is not None and report.exit_code == 16
    assert (n.cause, n.nan, n.reached, n.op.op) == ("domain", True, "the loss", "aten::div")
    assert n.op.user_frame.line == marker_line(script, "TRAIN")
    assert any((f.file or "").endswith("transformers/loss/loss_utils.py") for f in n.op.stack)


@needs_build
def test_the_page_shows_it(runs, tmp_path):
    _, trace, _ = runs["masked_row"]
    page = tmp_path / "page.html"
    proc = subprocess.run([cli(), "report", trace, "-o", page], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "the first NaN reached the loss: aten::softmax.int made it from a row of -inf" in \
        page.read_text()


@needs_build
def test_no_check_finite_records_no_ranges(tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    trace = tmp_path / "off.trr"
    proc = record_warm(trace, [sys.executable, script, "log_zero"],
                       flags=("--no-check-finite",))
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = torchrr.replay(trace)
    assert report.non_finite is None and not report.raw["ranges_recorded"]


@needs_build
def test_fix_has_no_patch_for_it_and_says_so(runs):
    """No rewrite of the program is certain for a NaN's origin: fix names it, with its help, and
    exits as for a violation it cannot patch, never as a clean trace."""
    script, trace, _ = runs["where_trap"]
    proc = subprocess.run([cli(), "fix", trace], capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr
    assert f"first made by SqrtBackward0 (the backward of aten::sqrt) at {script}:" in proc.stdout
    assert "no certain patch" in proc.stdout
    _, clean, _ = runs["plain"]
    proc = subprocess.run([cli(), "fix", clean], capture_output=True, text=True)
    assert proc.returncode == 0 and "nothing to fix" in proc.stdout
