"""`torchrr repro`: a recorded planted bug becomes a script that, under plain torch and without the
program, raises PyTorch's message for a raising violation (the same words, shape and versions),
or shows the gradient difference for a silent write; what it cannot express it refuses."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import PYTORCH_INPLACE, cli, needs_build, record, record_warm

pytestmark = needs_build

CASES = Path(__file__).parent / "cases"
# The catalog's autograd.Function case: it saves what its forward chose, no ATen op to call.
CUSTOM_FUNCTION = (CASES / "custom_function.py").read_text()

SIGMOID_MUL = textwrap.dedent("""\
    import torch
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.sigmoid(x @ torch.randn(3, 3))
    y.mul_(2)
    y.sum().backward()
    """)

# nn.Linear saves its input for the weight's gradient; relu(inplace=True) writes that input.
LINEAR_RELU = textwrap.dedent("""\
    import torch
    lin1, lin2 = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)
    h = lin1(torch.randn(2, 8))
    y = lin2(h)
    torch.nn.functional.relu(h, inplace=True)
    y.sum().backward()
    """)

# A write through .data: another version counter over the saved weight's bytes, so PyTorch raises
# nothing and the input's gradient is computed from the doubled weight.
DATA_WRITE = textwrap.dedent("""\
    import torch
    w = torch.randn(3, 3, requires_grad=True)
    x = torch.randn(4, 3, requires_grad=True)
    y = x @ w
    w.data.mul_(2)
    y.sum().backward()
    """)

# PyTorch's message, less the hint whose wording changes across releases; or its first sentence
# for a saved tensor detached in place, freed by an earlier backward pass, or cached by selective
# checkpointing and then written.
MESSAGE = re.compile(r"RuntimeError: (one of the variables needed for gradient computation .*? "
                     r"expected version \d+ instead|Trying to use a saved tensor that has been "
                     r"detached in-place|Trying to backward through the graph a second time|"
                     r"Tensor cached during selective activation checkpoint has been mutated)")


def _recorded(tmp_path, source):
    script = tmp_path / "bug.py"
    script.write_text(source)
    trace = tmp_path / "bug.trr"
    proc = record_warm(trace, [sys.executable, script])
    return trace, proc


def _repro(trace, out, *flags):
    return subprocess.run([cli(), "repro", str(trace), "-o", str(out), *flags],
                          capture_output=True, text=True, timeout=60)


def _run(script):
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)


def _raises_the_recorded_message(tmp_path, source):
    trace, proc = _recorded(tmp_path, source)
    recorded = MESSAGE.search(proc.stderr)
    assert recorded, proc.stderr
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    text = out.read_text()
    assert text.startswith("# torchrr repro: ")
    assert "import torchrr" not in text and "bug.py" in text
    ran = _run(out)
    assert ran.returncode == 1, ran.stderr
    got = MESSAGE.search(ran.stderr)
    assert got, f"the script did not raise PyTorch's error:\n{ran.stderr}"
    assert got.group(1) == recorded.group(1)
    return text


def test_sigmoid_then_mul_in_place_raises_the_same_message(tmp_path):
    text = _raises_the_recorded_message(tmp_path, SIGMOID_MUL)
    assert "aten.sigmoid.default" in text and "aten.mul_.Tensor" in text
    assert "bug.py:3" in text and "bug.py:4" in text


def test_linear_then_relu_in_place_raises_the_same_message(tmp_path):
    text = _raises_the_recorded_message(tmp_path, LINEAR_RELU)
    assert "aten.relu_.default" in text


# Catalog cases of silent writes: a weight written through .data, saves whose hooks packed the
# tensor itself (an identity pack, save_on_cpu of a CPU tensor), which turn the version check off,
# a saved weight's storage swapped by `.data =` (an EMA swap, spectral norm's), a write whose
# version bump _unsafe_preserve_version_counter undid, an unpack hook's float16 round trip, and
# writes into what checkpointing recomputed and handed over unchecked (the recomputed write, an
# optimizer step before backward).
@pytest.mark.parametrize("case", [None, "weight_norm_data", "hook_identity_pack",
                                  "save_on_cpu_write", "ema_swap", "spectral_norm_swap",
                                  "preserve_version_counter", "unpack_hook_dtype_silent",
                                  "checkpoint_recomputed_write", "checkpoint_optimizer_between",
                                  "ctx_stash_refill"])
def test_a_silent_write_shows_the_gradient_difference(tmp_path, case):
    source = DATA_WRITE if case is None else (CASES / f"{case}.py").read_text()
    trace, proc = _recorded(tmp_path, source)
    assert PYTORCH_INPLACE not in proc.stderr
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    assert case is not None or ".data" in out.read_text()
    ran = _run(out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "the gradients differ" in ran.stdout


def test_a_write_through_another_storage_over_the_saved_memory_shows_the_difference(tmp_path):
    # The C++ sample's silent_raw_write scales the saved `up` through a tensor from_blob made over
    # its memory: another storage, another counter; --verify-saved records the addresses that
    # make it a view of the saved bytes in the script.
    lora_step = Path(cli()).with_name("lora_step")
    if not lora_step.exists():
        pytest.skip("build/bin/lora_step is not built")
    trace = tmp_path / "raw.trr"
    proc = record(trace, [lora_step, "--device", "cpu", "--steps", "1", "--bug",
                          "silent_raw_write"], flags=["--verify-saved"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    text = out.read_text()
    assert "(recorded as another storage over that memory)" in text, text
    assert "lora_model.cc" in text
    ran = _run(out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "the gradients differ" in ran.stdout


def test_an_autograd_function_is_called_through_a_stand_in_that_keeps_its_save(tmp_path):
    text = _raises_the_recorded_message(tmp_path, CUSTOM_FUNCTION)
    # Square's body is not called: a Function of the same name saves the same input.
    assert "class Square(torch.autograd.Function):" in text
    assert "ctx.save_for_backward(inputs[0])" in text
    assert "1 of them through a stand-in" in text


# The Function saves its output: PyTorch's message names the output's grad_fn, which the stand-in's
# class name gives its node.
SAVED_OUTPUT_FUNCTION = textwrap.dedent("""\
    import torch


    class Exp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = x.exp()
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, grad):
            (y,) = ctx.saved_tensors
            return grad * y


    x = torch.randn(4, 3, requires_grad=True)
    y = Exp.apply(x * 2)
    y.mul_(3)
    y.sum().backward()
    """)


def test_a_stand_in_saves_its_output_under_the_recorded_name(tmp_path):
    text = _raises_the_recorded_message(tmp_path, SAVED_OUTPUT_FUNCTION)
    assert "class Exp(torch.autograd.Function):" in text
    assert "ctx.save_for_backward(outputs[0])" in text


# Compiled regions and reentrant checkpointing are custom Functions too: AOTAutograd's region saves
# its input (aot_eager) or its output (inductor, after a graph break), checkpoint saves its inputs;
# non-reentrant checkpointing's frame keeps its inputs and checks their versions as a save does.
@pytest.mark.parametrize("case", ["compile_input_write", "compile_output_write",
                                  "checkpoint_reentrant_input", "checkpoint_input"])
def test_compiled_regions_and_checkpoint_functions_raise_the_same_message(tmp_path, case):
    text = _raises_the_recorded_message(tmp_path, (CASES / f"{case}.py").read_text())
    assert "(torch.autograd.Function):" in text


# A Function whose forward writes its input in place, after another op saved it: the stand-in for
# the Function makes the write, before its own save, as the forward did.
def test_a_function_that_writes_its_input_in_forward_is_stood_in_with_the_write(tmp_path):
    text = _raises_the_recorded_message(
        tmp_path, (CASES / "function_forward_write.py").read_text())
    assert "class _XEntropy(torch.autograd.Function):" in text
    forward = text[text.index("class _XEntropy"):]
    assert forward.index("standin_write(inputs[0], 1)") < forward.index("ctx.save_for_backward")


# Inductor hands a saved view of the region's input back over the input's bytes with a counter of
# its own; a Function's ctx stash is kept with no version check: both silent, the stand-in keeps
# each save as it was (`.data` of the input, a ctx attribute).
@pytest.mark.parametrize("case,kept", [("compile_inductor_saved_view", ".data.as_strided("),
                                       ("compile_ctx_stash", "ctx.unchecked = ")])
def test_a_compiled_regions_silent_save_shows_the_gradient_difference(tmp_path, case, kept):
    trace, proc = _recorded(tmp_path, (CASES / f"{case}.py").read_text())
    if PYTORCH_INPLACE in proc.stderr:
        pytest.skip("this torch checks the stashed tensor's version (before 2.11)")
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    assert "1 through a stand-in" in made.stderr and kept in out.read_text()
    ran = _run(out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "the gradients differ" in ran.stdout


# An unpack hook hands backward another shape or dtype than was saved, and backward's formula
# fails on it: the script's hooks hand backward what the recorded one did, and it raises the
# same error.
@pytest.mark.parametrize("case", ["unpack_hook_shape", "unpack_hook_wrong_dtype"])
def test_an_unpack_hooks_tensor_raises_the_same_error(tmp_path, case):
    trace, proc = _recorded(tmp_path, (CASES / f"{case}.py").read_text())
    recorded = re.findall(r"^RuntimeError: (.*)$", proc.stderr, re.M)
    assert recorded, proc.stderr
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    assert "saved_tensors_hooks(lambda t: t, unpack)" in out.read_text()
    ran = _run(out)
    assert ran.returncode == 1 and f"RuntimeError: {recorded[0]}" in ran.stderr, ran.stderr


# Writes --verify-saved's fingerprints see and no recorded op made (ctypes, numpy): the script
# changes the saved bytes with a stand-in write past the version counter, and says so.
@pytest.mark.parametrize("case", ["ctypes_write", "numpy_write"])
def test_a_write_no_recorded_op_made_gets_a_stand_in_write(tmp_path, case):
    trace = tmp_path / "bug.trr"
    record_warm(trace, [sys.executable, CASES / f"{case}.py"], flags=["--verify-saved"])
    out = tmp_path / "repro.py"
    made = _repro(trace, out)
    assert made.returncode == 0, made.stderr
    assert "a stand-in write changes them" in out.read_text()
    ran = _run(out)
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "the gradients differ" in ran.stdout


# A torch.library custom op writes the saved tensor: the script has none of its code, and a
# stand-in writes the tensor once per version bump the op made, which the message counts.
def test_an_op_outside_aten_is_called_through_a_stand_in_write(tmp_path):
    text = _raises_the_recorded_message(tmp_path, (CASES / "custom_op_write.py").read_text())
    assert "# A stand-in for torchrr_case::scale_, an op outside aten" in text
    assert "torchrr_case" not in text.replace("# A stand-in for torchrr_case::scale_", "")


def test_a_file_it_did_not_write_is_not_replaced(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    out = tmp_path / "mine.py"
    out.write_text("print('my own script')\n")
    made = _repro(trace, out)
    assert made.returncode == 2 and "--force" in made.stderr
    assert out.read_text() == "print('my own script')\n"
    assert _repro(trace, out).returncode == 2
    assert _repro(trace, out, "--force").returncode == 0
    assert _repro(trace, out).returncode == 0  # Its own script now: replaced without --force.


def test_dash_writes_the_script_to_stdout(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    made = subprocess.run([cli(), "repro", str(trace), "-o", "-"], capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    assert made.stdout.startswith("# torchrr repro: ")
    ran = subprocess.run([sys.executable, "-"], input=made.stdout, capture_output=True, text=True,
                         timeout=120)
    assert MESSAGE.search(ran.stderr), ran.stderr


def test_device_flag_is_what_the_script_runs_on(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    out = tmp_path / "repro.py"
    assert _repro(trace, out, "--device", "cpu").returncode == 0
    assert "DEVICE = 'cpu'" in out.read_text()
    assert _repro(trace, out, "--violation", "5").returncode == 12


# Catalog cases whose slices need what the planted ones above do not: an optimizer step inside
# its record_function scope writing a parameter view's base twice, ops under autocast (a bfloat16
# saved tensor from float32 operands), a saved input written by `+=`, a masked_fill_ on softmax's
# result; a saved tensor detach_()ed; a second backward pass through a graph the first freed; the
# ops a compiled region ran when AOTAutograd traced its backward (after a graph break); a matmul's
# output selective checkpointing cached, then written (the script checkpoints it as recorded).
@pytest.mark.parametrize("case", ["optimizer_between", "autocast_output_write", "saved_input_iadd",
                                  "softmax_masked_fill", "detach_inplace", "freed_second_backward",
                                  "compile_inside_graph_break", "sac_mutation"])
def test_catalog_cases_raise_the_same_message(tmp_path, case):
    _raises_the_recorded_message(tmp_path, (CASES / f"{case}.py").read_text())


def test_a_redacted_trace_gives_a_script_without_the_redacted_strings(tmp_path):
    secret = tmp_path / "acme_secret"
    secret.mkdir()
    trace, _ = _recorded(secret, SIGMOID_MUL)
    shared = tmp_path / "shared.trr"
    redacted = subprocess.run([cli(), "redact", str(trace), "-o", str(shared),
                               "--map", "acme_secret=project"], capture_output=True, text=True)
    assert redacted.returncode == 0, redacted.stderr
    out = tmp_path / "repro.py"
    assert _repro(shared, out).returncode == 0
    text = out.read_text()
    assert "acme_secret" not in text and "project/bug.py:4" in text
    assert MESSAGE.search(_run(out).stderr)
    # Without the ops' arguments the script could not call them: refused, nothing written.
    bare = tmp_path / "bare.trr"
    subprocess.run([cli(), "redact", str(trace), "-o", str(bare), "--drop-values"], check=True,
                   capture_output=True)
    made = _repro(bare, tmp_path / "bare.py")
    assert made.returncode == 12 and "--drop-values" in made.stderr
    assert not (tmp_path / "bare.py").exists()


def _check(trace, *flags, python=sys.executable, cwd=None):
    env = {**os.environ, "TORCHRR_PYTHON": str(python)}
    return subprocess.run([cli(), "repro", "--check", str(trace), *flags], capture_output=True,
                          text=True, timeout=180, env=env, cwd=cwd)


def test_check_runs_the_script_and_says_it_raised_the_recorded_message(tmp_path):
    trace, proc = _recorded(tmp_path, SIGMOID_MUL)
    recorded = MESSAGE.search(proc.stderr)
    before = sorted(p.name for p in tmp_path.iterdir())
    checked = _check(trace, cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("reproduced: the script raised PyTorch's error: ")
    assert recorded.group(1) in checked.stdout
    # The script was a temporary one: nothing written beside the trace or in the working dir.
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_check_with_an_output_keeps_the_script_it_ran(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    out = tmp_path / "repro.py"
    checked = _check(trace, "-o", out)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert out.read_text().startswith("# torchrr repro: ")
    assert _check(trace, "-o", "-").returncode == 2


def test_check_shows_a_silent_writes_gradient_difference(tmp_path):
    trace, _ = _recorded(tmp_path, DATA_WRITE)
    checked = _check(trace)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.startswith("reproduced: the gradients differ")


def _fake_python(tmp_path, body):
    fake = tmp_path / "fake_python"
    fake.write_text("#!/bin/sh\n" + body + "\n")
    fake.chmod(0o755)
    return fake


def test_check_says_when_the_script_did_not_reproduce(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    # A run that ends cleanly, then one that raises another error: exit 13, with the last line.
    quiet = _check(trace, python=_fake_python(tmp_path, "exit 0"))
    assert quiet.returncode == 13, quiet.stdout + quiet.stderr
    assert quiet.stdout.startswith("not reproduced: the script exited with status 0")
    other = _check(trace, python=_fake_python(tmp_path, "echo 'ValueError: elsewhere' >&2; exit 1"))
    assert other.returncode == 13 and "ValueError: elsewhere" in other.stdout, other.stdout


def test_check_stops_a_script_at_its_timeout(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    slow = _check(trace, "--timeout", "1", python=_fake_python(tmp_path, "exec sleep 60"))
    assert slow.returncode == 13, slow.stdout + slow.stderr
    assert "ran past --timeout 1s" in slow.stdout


def test_check_without_torch_or_python_is_an_error_that_says_so(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    missing = _check(trace, python=tmp_path / "no_such_python")
    assert missing.returncode == 7 and "TORCHRR_PYTHON" in missing.stderr
    no_torch = _check(trace, python=_fake_python(
        tmp_path, "echo \"ModuleNotFoundError: No module named 'torch'\" >&2; exit 1"))
    assert no_torch.returncode == 7 and "has no torch" in no_torch.stderr


def test_without_check_an_output_is_required(tmp_path):
    trace, _ = _recorded(tmp_path, SIGMOID_MUL)
    made = subprocess.run([cli(), "repro", str(trace)], capture_output=True, text=True)
    assert made.returncode == 2 and "-o" in made.stderr
