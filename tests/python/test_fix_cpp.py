"""`torchrr fix` on a culprit line of C++: the rewrites on source text alone (each shape, and the
places where no rewrite is certain), then the C++ sample's planted bugs recorded with the CLI."""
import json
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, MISSING_BUILD, cli, record
from test_fix import changed_lines
from torchrr import _fix_cpp as cpp


def source(text):
    return cpp.CppSource("/src/train.cc", textwrap.dedent(text).lstrip("\n"))


def in_function(body):
    """`body` as the body of a function with a parameter `t`, its locals declared first."""
    return source("torch::Tensor Step(torch::Tensor t, const torch::Tensor& g) {\n"
                  "  auto x = torch::sigmoid(t);\n"
                  "  torch::Tensor h;\n"
                  "  h = torch::tanh(t);\n"
                  + textwrap.indent(textwrap.dedent(body).lstrip("\n"), "  ")
                  + "  return x;\n}\n")


def rewrite_at(src, line, op):
    return cpp.CppRewriter(src, line, op).statement()


@pytest.mark.parametrize("line, op, new", [
    ("x.mul_(g);  // keep\n", "mul_", "  x = x.mul(g);  // keep\n"),
    ("x += h;\n", "add_", "  x = x + h;\n"),
    ("x -= h * 2;  /* a comment */\n", "sub_", "  x = x - (h * 2);  /* a comment */\n"),
    ("x *= -g;\n", "mul_", "  x = x * (-g);\n"),
    ("x /= torch::exp(h);\n", "div_", "  x = x / torch::exp(h);\n"),
    ("torch::relu_(x);\n", "relu_", "  x = torch::relu(x);\n"),
    ("at::sigmoid_(h);  // at::\n", "sigmoid_", "  h = at::sigmoid(h);  // at::\n"),
    ("x.masked_fill_(x > 0.5, 0.0);\n", "fill_", "  x = x.masked_fill(x > 0.5, 0.0);\n"),
    ("x.index_put_({0}, h);\n", "copy_", "  x = x.index_put({0}, h);\n"),
    ("x.zero_();\n", "zero_", "  x = torch::zeros_like(x);\n"),
    ("torch::nn::functional::relu(x, torch::nn::functional::ReLUFuncOptions().inplace(true));\n",
     "relu_", "  x = torch::nn::functional::relu(x, "
              "torch::nn::functional::ReLUFuncOptions().inplace(false));\n"),
    ("h = F::relu(h, F::ReLUFuncOptions().inplace(true));\n", "relu_",
     "  h = F::relu(h, F::ReLUFuncOptions().inplace(false));\n"),
    ("x.mul_(g);  // \"quoted\" x += 1;\n", "mul_", "  x = x.mul(g);  // \"quoted\" x += 1;\n"),
    # A comment aligned with its neighbours' stays in its column while the code fits before it.
    ("x.mul_(g);          // aligned\n", "mul_", "  x = x.mul(g);       // aligned\n"),
    ("x.mul_(g);    // aligned\n", "mul_", "  x = x.mul(g);  // aligned\n"),
])
def test_the_statement_made_out_of_place(line, op, new):
    src = in_function(line)
    rewrite = rewrite_at(src, 5, op)
    assert rewrite is not None and rewrite.certain, rewrite
    assert (rewrite.first_line, rewrite.last_line, rewrite.new) == (5, 5, new)
    assert rewrite.old == src.lines[4]


# A write through views of a local variable (`x.select(0, 1).zero_()`): the variable is cloned on
# a line of its own first, so that the views, and the write, are the clone's.
@pytest.mark.parametrize("line, op", [
    ("x.select(0, 1).zero_();  // keep\n", "zero_"),
    ("x.narrow(0, 0, 2).t().mul_(g);\n", "mul_"),
])
def test_a_write_through_a_view_clones_the_variable_first(line, op):
    src = in_function(line)
    rewrite = rewrite_at(src, 5, op)
    assert rewrite is not None and rewrite.certain, rewrite
    assert rewrite.new == "  x = x.clone();\n" + src.lines[4], rewrite
    assert "through a view of `x`" in rewrite.why


@pytest.mark.parametrize("body, op, why", [
    # A statement over several lines, and a line of two statements.
    ("x.mul_(\n    g);\n", "mul_", "several lines"),
    ("auto y = h +\n    x.mul_(g);\n", "mul_", "several lines"),
    ("x.mul_(g); h.add_(1);\n", "mul_", "several statements"),
    ("if (x.defined()) { x.mul_(g); }\n", "mul_", "no statement alone"),
    # A macro: its definition, or a call of one.
    ("#define SCALE(v) v.mul_(g)\n", "mul_", "macro"),
    ("SCALE_IN_PLACE(x.mul_(g));\n", "mul_", "macro"),
    # A receiver that is an expression, a result that is used.
    ("torch::exp(x).mul_(2);\n", "mul_", "through an expression"),
    ("x.select(0, 1).mul(2).zero_();\n", "zero_", "through an expression"),
    ("t.select(0, 1).zero_();\n", "zero_", "argument of Step()"),
    ("auto y = x.mul_(2);\n", "mul_", "its result is used"),
    ("return x.mul_(2);\n", "mul_", "its result is used"),
    ("torch::relu_(torch::exp(x));\n", "relu_", "is an expression"),
    # Rebinding would hide the write from other holders of the tensor.
    ("t.mul_(2);\n", "mul_", "argument of Step()"),
    ("t += h;\n", "add_", "argument of Step()"),
    ("w_.mul_(2);\n", "mul_", "not declared in this function"),
    ("self.w.mul_(2);\n", "mul_", "is a member"),
    ("model->w += h;\n", "add_", "is a member"),
    ("auto r = x;\nr.mul_(2);\n", "mul_", "bound to another name"),
    ("auto& r = x;\nr.mul_(2);\n", "mul_", "is a reference"),
    ("auto v = x.view({-1});\nv.mul_(2);\n", "mul_", "view of another tensor"),
    ("auto v = x[0];\nv.mul_(2);\n", "mul_", "view of another tensor"),
    ("x.copy_(h);\n", "copy_", "no out-of-place twin"),
    ("F::relu(torch::exp(x), F::ReLUFuncOptions().inplace(true));\n", "relu_",
     "inplace(true)"),
    ("x[0] += h;\n", "add_", "into an expression"),
])
def test_no_certain_rewrite_where_the_line_is_not_one_of_the_shapes(body, op, why):
    src = in_function(body)
    line = 4 + len(textwrap.dedent(body).lstrip("\n").splitlines())
    if body.startswith("x.mul_(\n"):
        line = 5  # The call's first line.
    rewrite = rewrite_at(src, line, op)
    assert rewrite is not None and not rewrite.certain and rewrite.new is None, rewrite
    assert why in rewrite.why or any(why in choice for choice in rewrite.choices), rewrite
    assert rewrite.choices, rewrite


def test_a_loop_variable_and_a_reference_are_not_rebound():
    src = source("""
        void Clamp(std::vector<torch::Tensor>& ps) {
          for (auto p : ps) {
            p.mul_(2);
          }
          const torch::Tensor& first = ps[0];
          torch::Tensor second = ps[1].clone();
          second.mul_(2);
        }
        """)
    assert "loop's variable" in rewrite_at(src, 3, "mul_").why
    assert rewrite_at(src, 7, "mul_").certain  # A clone is the variable's own tensor.


def test_text_in_a_string_or_a_comment_is_not_code():
    src = in_function('std::cout << "x += h;";\n// x.mul_(g);\n')
    assert rewrite_at(src, 5, "add_") is None
    assert rewrite_at(src, 6, "mul_") is None


def test_a_name_that_starts_like_a_keyword_is_a_name():
    src = source("""
        void Step(const torch::Tensor& g) {
          auto forces = torch::exp(g);
          forces.mul_(2);
        }
        """)
    assert rewrite_at(src, 3, "mul_").new == "  forces = forces.mul(2);\n"


def test_an_op_other_than_the_lines_gets_no_rewrite():
    # The trace says add_, the line multiplies: the write is not this statement's.
    assert rewrite_at(in_function("x *= h;\n"), 5, "add_") is None


def test_an_optimizer_step_moves_after_backward():
    src = source("""
        void Step(Model& model, torch::optim::Optimizer& opt) {
          auto loss = model->forward(x);
          opt.step();  // update
          opt.zero_grad();
          loss.backward();
          log(loss);
        }
        """)
    rewrite = cpp.CppRewriter(src, 3, "mul_").after_backward()
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (3, 5)
    assert rewrite.new == "  opt.zero_grad();\n  loss.backward();\n  opt.step();  // update\n"


def test_a_constraint_under_a_no_grad_guard_moves_with_its_block():
    src = source("""
        void Step(torch::Tensor w) {
          auto loss = (w * w).sum();
          {
            torch::NoGradGuard no_grad;
            w.clamp_(-1, 1);
          }
          loss.backward();
        }
        """)
    rewriter = cpp.CppRewriter(src, 5, "clamp_")
    assert rewriter.under_no_grad() is not None
    rewrite = rewriter.after_backward()
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (3, 7), rewrite
    assert rewrite.new == ("  loss.backward();\n  {\n    torch::NoGradGuard no_grad;\n"
                           "    w.clamp_(-1, 1);\n  }\n")


def test_no_move_without_a_backward_in_the_same_block():
    src = source("""
        void Step() {
          if (bug) {
            opt.step();
          }
          loss.backward();
        }
        """)
    rewrite = cpp.CppRewriter(src, 3, "mul_").after_backward()
    assert not rewrite.certain and rewrite.new is None


def test_the_module_construction_with_inplace_options():
    src = source("""
        act_ = register_module("act", torch::nn::ReLU(torch::nn::ReLUOptions().inplace(true)));
        drop_ = torch::nn::Dropout(torch::nn::DropoutOptions().p(0.1).inplace(true));  // drop
        out = F::relu(x, torch::nn::functional::ReLUFuncOptions().inplace(true));
        """)
    assert cpp.module_class([{"framework": True, "function": "at::_ops::relu_::call()"},
                             {"framework": True, "function":
                              "torch::nn::ReLUImpl::forward(at::Tensor)"}]) == "ReLU"
    assert cpp.module_class([{"framework": False, "function": "torch::nn::ReLUImpl::forward"}]) \
        is None
    found = cpp.module_constructions(src, "Dropout")
    assert [line for line, _ in found] == [2]
    rewrite = cpp.construction_rewrite(src, *found[0], True)
    assert rewrite.new == ("drop_ = torch::nn::Dropout(torch::nn::DropoutOptions().p(0.1)"
                           ".inplace(false));  // drop\n")
    assert [line for line, _ in cpp.module_constructions(src, "ReLU")] == [1]


@pytest.mark.parametrize("text, name, new", [
    ("auto h = act * up;  // saved\n", "up", "auto h = act * up.clone();  // saved\n"),
    ("auto y = norm->forward(x);\n", "x", "auto y = norm->forward(x.clone());\n"),
    ("auto r = torch::rsqrt(x.pow(2) + e);\n", "x",
     "auto r = torch::rsqrt(x.clone().pow(2) + e);\n"),
    ("return x * w;\n", "x", "return x.clone() * w;\n"),
    ("x = f(x);\n", "x", None),           # Read and assigned.
    ("auto x = f(a);\n", "x", None),      # Declared.
    ("auto h = self.x * 2;\n", "x", None),  # A member's name.
    ("auto h = x(2);\n", "x", None),      # Called.
    ("auto h = f(x) + g(x);\n", "x", None),  # Read twice.
])
def test_a_clone_where_a_cpp_line_reads_the_saved_tensor(text, name, new):
    rewrite = cpp.clone_read_at(source(text), 1, name)
    assert (rewrite.new if rewrite else None) == new


def test_the_name_a_cpp_line_writes_and_the_names_it_passes():
    src = source("""
        x.mul_(g);
        return x.mul_(w);
        x += y;
        Scale(up, 0.5, t);
        """)
    assert [cpp.written_name(src, n) for n in (1, 2, 3, 4)] == ["x", "x", "x", ""]
    assert cpp.passed_names(src, 4) == ["up", "t"]


# -- The C++ sample's planted bugs, recorded --------------------------------------------------

LORA_STEP = Path(cli()).with_name("lora_step") if MISSING_BUILD is None else None
needs_sample = pytest.mark.skipif(LORA_STEP is None or not LORA_STEP.exists(),
                                  reason="build/bin/lora_step is not built")
SAMPLES = REPO / "samples" / "cpp"
# bug: (file, the lines the patch removes, the lines it adds); None: no certain patch.
CERTAIN = {
    "inplace_activation": ("lora_model.cc", ["    act.mul_(gate);              "
                                             "// BUG(inplace_activation)"],
                           ["    act = act.mul(gate);         // BUG(inplace_activation)"]),
    "softmax_mask": ("lora_model.cc",
                     ["    probs.masked_fill_(future, 0.0);  // BUG(softmax_mask)"],
                     ["    probs = probs.masked_fill(future, 0.0);  // BUG(softmax_mask)"]),
    "view_write": ("lora_model.cc", [], ["    log_probs = log_probs.clone();"]),
    "optimizer_before_backward": ("lora_step.cc", ["    optimizer.step();  "
                                                   "// BUG(optimizer_before_backward)"],
                                  ["    optimizer.step();  // BUG(optimizer_before_backward)"]),
    # The write is into a function's argument: the clone goes where the saved tensor is read,
    # at the call into the norm that saved it, or at the victim's own line.
    "residual_add": ("lora_model.cc",
                     ["  auto attn_out = self_attn_->forward(input_norm_->forward(x));"],
                     ["  auto attn_out = self_attn_->forward(input_norm_->forward(x.clone()));"]),
    # A helper writes through a from_blob alias of what it is given: the clone at the victim's
    # line, where the saved tensor is read.
    "silent_raw_write": ("lora_model.cc",
                         ["  auto hidden = act * up;  // VICTIM(silent_raw_write)"],
                         ["  auto hidden = act * up.clone();  // VICTIM(silent_raw_write)"]),
    "two_writes": ("lora_model.cc",
                   ["  auto inv_rms = torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps_);  "
                    "// VICTIM(two_writes)"],
                   ["  auto inv_rms = torch::rsqrt(x.clone().pow(2).mean(-1, /*keepdim=*/true) + "
                    "eps_);  // VICTIM(two_writes)"]),
    # The write is into a member (a cache of RoPE tables) that the next layer's call writes
    # again: the clone goes where the victim's function takes its view of it.
    "slice_assign": ("lora_model.cc", ["  auto tables = Tables(x.size(-2));"],
                     ["  auto tables = Tables(x.size(-2)).clone();"]),
}


def _record(tmp_path, bug):
    trace = tmp_path / f"{bug}.trr"
    # A silent bug shows only in the saved bytes' fingerprints.
    flags = ["--quiet", *(["--verify-saved"] if bug.startswith("silent_") else [])]
    proc = record(trace, [LORA_STEP, "--device", "cpu", "--steps", "2", "--bug", bug],
                  flags=flags)
    assert trace.exists(), proc.stderr
    return trace


def fix(*args):
    return subprocess.run([cli(), "fix", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


@needs_sample
@pytest.mark.parametrize("bug", sorted(CERTAIN))
def test_a_planted_bug_on_a_rewritable_line_gets_its_cpp_patch(tmp_path, bug):
    name, removed, added = CERTAIN[bug]
    trace = _record(tmp_path, bug)
    proc = fix(trace)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"--- a/samples/cpp/{name}" in proc.stdout, proc.stdout
    diff_removed, diff_added = changed_lines(proc.stdout)
    assert diff_removed == removed and diff_added == added, proc.stdout

    edits = json.loads(fix("--json", trace).stdout)["edits"]
    assert len(edits) == 1 and edits[0]["certain"], edits
    assert edits[0]["file"] == str(SAMPLES / name)
    # replay ends pointing at fix --check, which builds a C++ program again.
    replay = subprocess.run([cli(), "replay", str(trace)], capture_output=True, text=True,
                            timeout=60)
    assert replay.stdout.splitlines()[-1] == (
        f"try: torchrr fix {trace} --check (a patch for the culprit's C++ line, checked by "
        "building the program again and re-running it)")


def _build_and_sources():
    """Each file of the sample's sources and of its objects in the build, with its modification
    time."""
    objects = LORA_STEP.parent.parent / "samples"
    files = [*SAMPLES.iterdir(), *objects.rglob("*.o"), *objects.rglob("*.a"), LORA_STEP]
    return {path: path.stat().st_mtime_ns for path in files}


# Every planted bug: its patch is in the sample's static library (lora_model.cc) or in the
# program's own file (lora_step.cc), the two ways a patched object goes into the program.
BUGS = sorted(set(re.findall(r"// BUG\((\w+)\)", "".join(
    p.read_text() for p in SAMPLES.glob("*.cc")))))


@needs_sample
@pytest.mark.parametrize("bug", BUGS)
def test_check_builds_the_sample_again_with_the_patch_and_replays_it(tmp_path, bug):
    trace = _record(tmp_path, bug)
    before = _build_and_sources()
    proc = subprocess.run([cli(), "fix", "--check", str(trace)], capture_output=True, text=True,
                          cwd=REPO, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with this patch: backward ran (2 passes), 0 violations" in proc.stdout, proc.stdout
    assert _build_and_sources() == before, "neither the sources nor the build are written"


@needs_sample
def test_check_refuses_a_program_outside_a_cmake_build(tmp_path):
    program = tmp_path / "lora_step"
    shutil.copy(LORA_STEP, program)
    trace = tmp_path / "copy.trr"
    record(trace, [program, "--device", "cpu", "--steps", "2", "--bug", "inplace_activation"],
           flags=["--quiet"])
    before = (SAMPLES / "lora_model.cc").read_bytes()
    for flag in ("--check", "--apply"):
        proc = fix(flag, trace)
        assert proc.returncode == 11, proc.stdout + proc.stderr
        assert proc.stderr == (f"torchrr: cannot re-run the recorded command: {program} is not "
                               "in a CMake build directory (none of the directories above it "
                               "holds a CMakeCache.txt)\n"), proc.stderr
        assert "act = act.mul(gate);" in proc.stdout, "the patch is still printed"
    assert (SAMPLES / "lora_model.cc").read_bytes() == before
    assert not (SAMPLES / "lora_model.cc.orig").exists()


@needs_sample
@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed")
def test_a_program_without_debug_info_is_told_how_to_get_its_line(tmp_path):
    program = tmp_path / "lora_step"
    subprocess.run(["strip", "--strip-debug", "-o", program, LORA_STEP], check=True)
    trace = tmp_path / "nodebug.trr"
    proc = record(trace, [program, "--device", "cpu", "--steps", "1", "--bug",
                          "inplace_activation"])
    note = ("note: the culprit's C++ function has no file and line: the program was built "
            "without debug info; build it with -g (CMake: -DCMAKE_BUILD_TYPE=RelWithDebInfo) and "
            "record again to have its line named and a patch for it")
    assert "culprit: <unknown file> in " in proc.stderr, proc.stderr
    assert note in proc.stderr.splitlines(), proc.stderr
    replay = subprocess.run([cli(), "replay", str(trace)], capture_output=True, text=True,
                            timeout=60)
    assert replay.stdout.splitlines()[-1] == note, replay.stdout
