"""samples/python/peft_lora.py (transformers + PEFT LoRA) under `torchrr record`: every planted
bug's culprit is its `# BUG(name)` line, the victim its `# VICTIM(name)` line, and `--bug none`
trains with no violation. The runs (transformers and PEFT take seconds to import) go two at a
time, once for the module."""
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import torchrr
from conftest import (PYTORCH_INPLACE, REPO, cli, marker_line, needs_build, record, same_file,
                      trace_order_problems)

SAMPLE = REPO / "samples" / "python" / "peft_lora.py"

pytestmark = needs_build


def _have_hf():
    import importlib.util

    missing = [name for name in ("transformers", "peft") if importlib.util.find_spec(name) is None]
    return f"{', '.join(missing)} not installed" if missing else None


HF_MISSING = _have_hf()


# The planted bugs, from their markers (cheap to collect; test_list_bugs checks --list-bugs).
BUGS = ["none"] + sorted(set(re.findall(r"# BUG\((\w+)\)", SAMPLE.read_text())))


def record_bugs(base, bugs, sample_flags=(), timeout=180):
    """{bug: (process, trace)}: the sample recorded once per bug, two at a time."""
    if HF_MISSING is not None:
        pytest.skip(f"transformers/peft not importable: {HF_MISSING}")

    def run(bug):
        trace = base / f"{bug}.trr"
        steps = "2" if bug in ("none", "optimizer_before_backward") else "1"
        flags = ["--verify-saved"] if bug.startswith("silent_") else []
        proc = record(trace, [sys.executable, SAMPLE, "--device", "cpu", "--steps", steps,
                              "--bug", bug, *sample_flags], timeout=timeout, flags=flags)
        return bug, (proc, trace)

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(run, bugs))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return record_bugs(tmp_path_factory.mktemp("peft"), BUGS)


def test_list_bugs():
    out = subprocess.run([sys.executable, SAMPLE, "--list-bugs"], capture_output=True,
                         text=True, check=True)
    listed = [line.split()[0] for line in out.stdout.splitlines() if line.strip()]
    assert sorted(listed) == sorted(BUGS)
    assert len(BUGS) - 1 >= 5


def test_no_bug_trains_cleanly(runs):
    proc, trace = runs["none"]
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [line.split()[:2] for line in proc.stdout.splitlines()] == [["step", "0"],
                                                                         ["step", "1"]]
    report = torchrr.replay(trace)
    assert report.violations == [] and report.ops > 1000
    assert trace_order_problems(trace) == []


@pytest.mark.parametrize("bug", [b for b in BUGS if b.startswith("silent_")])
def test_silent_bug(runs, bug):
    """A write behind autograd's back: nothing raises; --verify-saved's fingerprints show the saved
    bytes changed, and the op that made the alias is a candidate, called from the BUG line."""
    proc, trace = runs[bug]
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = torchrr.replay(trace)
    assert report.violations, "no violation found"
    v = report.violations[0]
    assert (v.kind, v.evidence) == ("silent", "fingerprint")
    assert not v.pytorch_raised
    assert v.backward_node.name == "MulBackward0"
    assert same_file(v.victim.user_frame.file, SAMPLE)
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
    bug_line = marker_line(SAMPLE, rf"BUG\({bug}\)")
    called_from_bug = [c for c in v.candidates
                       if any(f.python and same_file(f.file, SAMPLE) and f.line == bug_line
                              for f in c.op.stack)]
    assert called_from_bug, v.candidates
    # The write through the DLPack alias is the culprit: its stack passes through the BUG line.
    assert v.culprit is not None and v.culprit.op == "aten::mul_", v.culprit
    assert bug_line in [f.line for f in v.culprit.stack if f.python and same_file(f.file, SAMPLE)]


def repro_and_run(trace, out):
    """`torchrr repro TRACE -o OUT`, then OUT under plain Python: (repro's stderr, the script's
    text, the script's CompletedProcess)."""
    made = subprocess.run([cli(), "repro", str(trace), "-o", str(out)], capture_output=True,
                          text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    ran = subprocess.run([sys.executable, str(out)], capture_output=True, text=True, timeout=120)
    return made.stderr, out.read_text(), ran


def test_the_silent_bugs_reproducer_shows_the_gradient_difference(runs, tmp_path):
    # The DLPack alias is another storage over the saved `up`: --verify-saved's addresses make it a
    # view of up's bytes in the script, and the write through it changes the gradient.
    _, text, ran = repro_and_run(runs["silent_dlpack"][1], tmp_path / "repro.py")
    assert "(recorded as another storage over that memory)" in text
    assert ran.returncode == 1 and "the gradients differ" in ran.stdout, ran.stdout + ran.stderr


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "none" and not b.startswith("silent_")])
def test_planted_bug(runs, bug):
    proc, trace = runs[bug]
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert PYTORCH_INPLACE in proc.stderr
    report = torchrr.replay(trace)
    assert report.violations
    v = report.violations[0]
    assert v.kind == "version" and v.pytorch_raised
    assert PYTORCH_INPLACE in (v.pytorch_message or "")
    assert v.current_version > v.saved_version
    assert same_file(v.victim.user_frame.file, SAMPLE)
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
    assert same_file(v.culprit.user_frame.file, SAMPLE)
    assert v.culprit.user_frame.line == marker_line(SAMPLE, rf"BUG\({bug}\)")


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "none"])
def test_fix_check_makes_every_planted_bug_replay_clean(runs, bug, tmp_path):
    """`torchrr fix --check`: a certain patch for each planted bug, whose re-run of the sample
    (on patched copies: the sample itself is left alone) replays with no violation."""
    before = SAMPLE.read_bytes()
    proc = subprocess.run([cli(), "fix", "--check", str(runs[bug][1])], capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not certain" not in proc.stdout and "+++ " in proc.stdout, proc.stdout
    assert "with this patch: backward ran" in proc.stdout and ", 0 violations" in proc.stdout
    assert SAMPLE.read_bytes() == before


# --gradient-checkpointing: each decoder layer is recomputed in backward (non-reentrant, as
# transformers' Trainer runs it), and PyTorch no longer checks the tensors saved inside a layer.
# What each bug becomes there (the gradients are checked by test_gradient_checkpointing_grads):
#   silent   PyTorch says nothing and the gradient is wrong (inplace_activation, and
#            optimizer_before_backward: the recomputation uses the stepped weights), or unchanged
#            by a write of equal values (softmax_mask: the causal mask already zeroed them); the
#            same culprit and victim lines as without checkpointing
#   version  outside the checkpointed layers: PyTorch raises as before (view_write)
#   none     the recomputation stops at its last save, before the write: the gradient is right
#            (slice_assign)
#   aliased  silent_dlpack: the recomputation runs the MLP again, DLPack alias and all, and
#            backward uses the bytes it left (--verify-saved: the alias is over the recomputed
#            tensor's memory); culprit the write through the alias, called from the BUG line
#   program  residual_add: checkpointing makes the embeddings' output require grad (PEFT's
#            enable_input_require_grads), so layer 0's residual is a leaf that requires grad and
#            the in-place add raises in the forward ("a leaf Variable ... in-place"): no saved
#            tensor's story; the report names that error and the BUG line that raised it
GC_EXPECT = {"none": None, "inplace_activation": "silent", "softmax_mask": "silent",
             "optimizer_before_backward": "silent", "view_write": "version", "slice_assign": None,
             "silent_dlpack": "aliased", "residual_add": "program"}


@pytest.fixture(scope="module")
def gc_runs(tmp_path_factory):
    return record_bugs(tmp_path_factory.mktemp("peft_gc"), GC_EXPECT,
                       ["--gradient-checkpointing"], timeout=240)


@pytest.mark.parametrize("bug", ["inplace_activation", "optimizer_before_backward"])
def test_a_silent_write_under_checkpointing_has_a_reproducer(gc_runs, bug, tmp_path):
    # Checkpointing recomputed the layer in backward and handed the saved tensor over with no
    # version check: the script calls the forward's save and write, the save under identity hooks
    # that check nothing either, and shows the gradient difference.
    _, text, ran = repro_and_run(gc_runs[bug][1], tmp_path / "repro.py")
    assert "identity hooks check nothing either" in text, text
    assert ran.returncode == 1 and "the gradients differ" in ran.stdout, ran.stdout + ran.stderr


@pytest.mark.parametrize("bug", list(GC_EXPECT))
def test_gradient_checkpointing(gc_runs, bug):
    proc, trace = gc_runs[bug]
    kind = GC_EXPECT[bug]
    assert proc.returncode == (1 if kind in ("version", "program") else 0), proc.stderr[-2000:]
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok"
    if kind is None:
        assert report.violations == [], report.violations[:1]
        return
    bug_line = marker_line(SAMPLE, rf"BUG\({bug}\)")
    if kind == "program":
        assert report.violations == [], report.violations[:1]
        error = report.program_error
        assert error is not None and error["type"] == "RuntimeError", error
        assert "leaf Variable" in error["message"]
        assert error["op"]["op"] == "aten::add_"
        assert same_file(error["op"]["user_frame"]["file"], SAMPLE)
        assert error["op"]["user_frame"]["line"] == bug_line
        return
    if kind == "aliased":
        v = report.violations[0]
        assert (v.kind, v.evidence) == ("silent", "aliased_write"), v
        assert v.recomputed and not v.pytorch_raised
        assert v.culprit is not None and v.culprit.op == "aten::mul_", v.culprit
        assert bug_line in [f.line for f in v.culprit.stack if same_file(f.file, SAMPLE)]
        assert same_file(v.victim.user_frame.file, SAMPLE)
        assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
        return
    assert report.violations, "no violation found"
    v = report.violations[0]
    assert v.kind == kind
    if kind == "silent":
        assert v.evidence == "unchecked_save" and v.recomputed and not v.pytorch_raised
    else:
        assert v.pytorch_raised
    assert same_file(v.victim.user_frame.file, SAMPLE)
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
    assert same_file(v.culprit.user_frame.file, SAMPLE)
    assert v.culprit.user_frame.line == marker_line(SAMPLE, rf"BUG\({bug}\)")


GRADIENTS = """
import argparse, sys, torch
sys.path.insert(0, sys.argv[1])
import peft_lora as sample

def grads(bug, checkpointing):
    sample.BUG = bug
    parser = argparse.ArgumentParser()
    sample.add_model_arguments(parser)
    args = parser.parse_args(["--gradient-checkpointing"] if checkpointing else [])
    args.device = "cpu"
    model = sample.build_model(args)
    model.train()
    ids = torch.randint(1, args.vocab, (args.batch, args.seq),
                        generator=torch.Generator().manual_seed(1))
    sample.next_token_loss(model(input_ids=ids).logits, ids).backward()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}

right = grads("none", False)
for bug in sys.argv[2:]:
    got = grads(bug, True)
    print(bug, max((got[n] - right[n]).abs().max().item() for n in right))
"""


def test_gradient_checkpointing_grads():
    """What GC_EXPECT says of the gradients: with checkpointing, inplace_activation's gradient is
    wrong (its forward is the no-bug one's: the gradient should be too), slice_assign's and
    softmax_mask's equal the no-bug ones."""
    if HF_MISSING is not None:
        pytest.skip(f"transformers/peft not importable: {HF_MISSING}")
    proc = subprocess.run([sys.executable, "-c", GRADIENTS, str(SAMPLE.parent),
                           "inplace_activation", "slice_assign", "softmax_mask"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    diff = {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines()}
    assert diff["inplace_activation"] > 1e-5
    assert diff["slice_assign"] == 0.0 and diff["softmax_mask"] == 0.0


# --compile: the model under torch.compile. A bug inside the model is an in-place write that
# AOTAutograd's trace of the backward meets when it compiles the model: PyTorch raises on the
# first call, and the ops run from torch.fx's Interpreter report the lines of the graph nodes they
# run, the same culprit and victim lines as eager (aot_eager for each bug; inductor, the default,
# traces the same way, checked once). view_write's loss is outside the model: eager code, as
# before. optimizer_before_backward changes weights that the compiled region saved: the victim is
# that region (its op "Torch-Compiled Region: 0/0"), named by the line inside it that backward
# uses each weight for (the first PyTorch meets is an attention weight's). silent_dlpack: dynamo
# breaks the graph at torch.from_dlpack, so `up` is saved by the region before the break (its
# CompiledFunction, in mlp_forward) and scaled by the region after it; --verify-saved's
# fingerprints see the bytes change. With aot_eager the write is the aten::copy_ AOTAutograd runs
# back into the mutated input, in the region called from the BUG line; inductor writes from its
# own kernel, not an op: the region that made the alias is the candidate. The victim is the region
# that saved `up`, named by the line that uses it (`act * up`), as in eager.
COMPILE_BUGS = ["none", "inplace_activation", "softmax_mask", "slice_assign", "residual_add",
                "view_write", "optimizer_before_backward", "silent_dlpack"]
INDUCTOR_BUGS = ["inplace_activation", "silent_dlpack"]


@pytest.fixture(scope="module")
def compile_runs(tmp_path_factory):
    runs = record_bugs(tmp_path_factory.mktemp("peft_aot_eager"), COMPILE_BUGS,
                       ["--compile", "aot_eager"], timeout=300)
    inductor = record_bugs(tmp_path_factory.mktemp("peft_inductor"), INDUCTOR_BUGS,
                           ["--compile", "inductor"], timeout=300)
    runs.update({f"{bug}@inductor": run for bug, run in inductor.items()})
    return runs


@pytest.mark.parametrize("bug", COMPILE_BUGS + [f"{bug}@inductor" for bug in INDUCTOR_BUGS])
def test_compile(compile_runs, bug):
    proc, trace = compile_runs[bug]
    bug, _, backend = bug.partition("@")
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok"
    if bug == "none":
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert report.violations == []
        return
    if bug.startswith("silent_"):
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert report.violations, "no violation found"
        v = report.violations[0]
        assert (v.kind, v.evidence) == ("silent", "fingerprint") and not v.pytorch_raised
        assert v.backward_node.name == "CompiledFunctionBackward"
        # The region that ran the MLP up to the break, named by the line that saved `up` in eager.
        assert v.victim.op.startswith("Torch-Compiled Region")
        assert same_file(v.victim.user_frame.file, SAMPLE)
        assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")
        bug_line = marker_line(SAMPLE, rf"BUG\({bug}\)")
        through_bug = [c for c in v.candidates
                       if any(same_file(f.file, SAMPLE) and f.line == bug_line for f in c.op.stack)]
        assert through_bug, v.candidates
        if backend == "inductor":
            assert v.culprit is None, v.culprit
        else:
            assert v.culprit is not None and v.culprit.detail == "aten::copy_", v.culprit
            assert bug_line in [f.line for f in v.culprit.stack if same_file(f.file, SAMPLE)]
        return
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert PYTORCH_INPLACE in proc.stderr
    assert report.violations, "no violation found"
    v = report.violations[0]
    assert v.kind == "version" and v.pytorch_raised
    assert same_file(v.culprit.user_frame.file, SAMPLE)
    assert v.culprit.user_frame.line == marker_line(SAMPLE, rf"BUG\({bug}\)")
    assert same_file(v.victim.user_frame.file, SAMPLE)
    if bug == "optimizer_before_backward":
        # One node saved every weight: PyTorch stops at the first in the region's saved order
        # (an attention projection's, called at self_attn), not at the last layer's down_proj as
        # in eager. Each weight is reported at the line that uses it, down_proj's among them.
        assert v.backward_node.name == "CompiledFunctionBackward"
        assert v.victim.op.startswith("Torch-Compiled Region")
        assert v.victim.user_frame.function in ("decoder_layer_forward", "mlp_forward")
        victims = {w.victim.user_frame.line for w in report.violations}
        assert marker_line(SAMPLE, rf"VICTIM\({bug}\)") in victims, victims
        return
    assert v.victim.user_frame.line == marker_line(SAMPLE, rf"VICTIM\({bug}\)")


def test_a_compiled_regions_save_becomes_a_standalone_reproducer(compile_runs, tmp_path):
    # optimizer_before_backward under aot_eager: the region's CompiledFunction, which saved every
    # weight, becomes a stand-in that saves the one the message names; the script raises the run's
    # message under plain torch, and keeps only what reaches that weight.
    proc, trace = compile_runs["optimizer_before_backward"]
    said, text, ran = repro_and_run(trace, tmp_path / "repro.py")
    assert "1 through a stand-in" in said
    assert "class CompiledFunction(torch.autograd.Function):" in text
    assert len(text.splitlines()) < 130, text
    recorded = re.search(r"(one of the variables needed .*? instead)", proc.stderr)
    assert recorded, proc.stderr[-2000:]
    assert ran.returncode == 1 and recorded.group(1) in ran.stderr, ran.stderr[-2000:]
