"""The rewrites behind `torchrr fix` on source text alone (no torch, no trace): each rule's patch,
and the places where no rewrite is certain."""
import textwrap

import pytest

from conftest import OneFile
from torchrr import _fix_backward as fb
from torchrr import _fix_check as fc
from torchrr import _fix_other_lines as ol
from torchrr import _fix_rewrite as rw
from torchrr._fix_stash import stash_fix


def source(text):
    return rw.Source("/src/train.py", textwrap.dedent(text).lstrip("\n"))


def test_a_comment_keeps_its_column_or_two_spaces():
    keep = rw.keep_comment_column
    assert keep("a;        // c\n", "b = a;        // c\n", 2, "//") == "b = a;    // c\n"
    assert keep("a;      // c\n", "b = a;      // c\n", 2, "//") == "b = a;  // c\n"
    assert keep("a;  // c\n", "b = a;  // c\n", 2, "//") == "b = a;  // c\n"
    assert keep("a; // c\n", "b = a; // c\n", 2, "//") == "b = a; // c\n"  # Not aligned.
    assert keep("a;\n", "b = a;\n", 2, "//") == "b = a;\n"
    assert keep("a;      # c", "b = a;   # d", 2, "#") == "b = a;   # d"  # Another comment.


def rewrite_at(text, line, op, parameter=False):
    return rw.Rewriter(source(text), line, op, parameter).statement()


@pytest.mark.parametrize("text, op, new", [
    ("y.mul_(2)  # keep\n", "mul_", "y = y.mul(2)  # keep\n"),
    ("h += a if c else b\n", "add_", "h = h + (a if c else b)\n"),
    ("out = y.add_(1)\n", "add_", "out = y = y.add(1)\n"),
    ("y = torch.relu_(y)\n", "relu_", "y = torch.relu(y)\n"),
    ("F.relu(h, inplace=True)\n", "relu_", "h = F.relu(h, inplace=False)\n"),
    ("y.data.mul_(2)\n", "mul_", "y = y.mul(2)\n"),
    ("y.zero_()\n", "zero_", "y = torch.zeros_like(y)\n"),
    ("y[0] = 1\n", "fill_", "y = y.clone()\ny[0] = 1\n"),
    ("y.data[0] = 1\n", "fill_", "y = y.clone()\ny[0] = 1\n"),
    # A write through a view of a local: the local is cloned first, and the write goes into the
    # clone (the view methods return the tensor's own memory, so a rebinding would drop it).
    ("y.select(-1, 0).zero_()  # pad\n", "zero_", "y = y.clone()\ny.select(-1, 0).zero_()  # pad\n"),
    ("y[0].t().mul_(2)\n", "mul_", "y = y.clone()\ny[0].t().mul_(2)\n"),
    ("y.transpose(0, 1)[0] = 1\n", "fill_", "y = y.clone()\ny.transpose(0, 1)[0] = 1\n"),
    ("y.mT.add_(1)\n", "add_", "y = y.clone()\ny.mT.add_(1)\n"),
    ("p = p.masked_fill_(m,\n                    0.0)\n", "masked_fill_",
     "p = p.masked_fill(m,\n                    0.0)\n"),
    # A comment aligned with its neighbours' stays in its column while the code fits before it.
    ("y.mul_(2)           # keep\n", "mul_", "y = y.mul(2)        # keep\n"),
    ("y.mul_(2)   # keep\n", "mul_", "y = y.mul(2)  # keep\n"),
    ("p = p.masked_fill_(m,\n                    0.0)    # keep\n", "masked_fill_",
     "p = p.masked_fill(m,\n                    0.0)    # keep\n"),
])
def test_the_statement_made_out_of_place(text, op, new):
    rewrite = rewrite_at(text, 1, op)
    assert rewrite.certain, rewrite
    assert rewrite.new == new


@pytest.mark.parametrize("text, line, op, why", [
    ("def f(t):\n    t.mul_(2)\n", 2, "mul_", "argument of f()"),
    ("a = b\na.mul_(2)\n", 2, "mul_", "another name"),
    ("def f(t):\n    r = t\n    r += 1\n", 3, "add_", "another name"),
    ("def f(t):\n    t[0] = 1\n", 2, "fill_", "argument of f()"),
    ("h = y[0]\nh.mul_(2)\n", 2, "mul_", "view of another tensor (line 1)"),
    ("a = torch.from_dlpack(t.detach())\na.mul_(2)\n", 2, "mul_", "view of another tensor"),
    ("for p in ps:\n    p.mul_(2)\n", 2, "mul_", "loop's"),
    ("z = torch.cos(y.mul_(2))\n", 1, "mul_", "then use the result"),
    ("self.h.mul_(2)\n", 1, "mul_", "then use the result"),
    ("y.copy_(z)\n", 1, "copy_", "no out-of-place twin"),
    ("def f(t):\n    t.select(0, 1).zero_()\n", 2, "zero_", "argument of f()"),
    ("h = y[0]\nh.select(0, 1).mul_(2)\n", 2, "mul_", "view of another tensor (line 1)"),
    # Not a view method: the receiver may be a copy, the name is not what is written.
    ("y.float().mul_(2)\n", 1, "mul_", "then use the result"),
])
def test_no_certain_rewrite_where_rebinding_would_change_the_program(text, line, op, why):
    rewrite = rewrite_at(text, line, op)
    assert not rewrite.certain and rewrite.new is None
    assert any(why in choice for choice in rewrite.choices) or why in rewrite.why, rewrite


_FUNCTION = '''
class Shift(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits):
        {mark}logits -= logits.max()
        return logits.exp()
'''


def test_an_input_of_a_functions_forward_is_rebound_unless_marked_dirty():
    # Autograd's contract: a forward's write into an input it does not mark dirty is not the
    # caller's to see, so the name is rebound.
    rewrite = rewrite_at(_FUNCTION.format(mark=""), 4, "sub_")
    assert rewrite.certain and rewrite.new == "        logits = logits - logits.max()\n"
    # Marked dirty, the write is the Function's output: the caller sees it.
    marked = _FUNCTION.format(mark="ctx.mark_dirty(logits)\n        ")
    rewrite = rewrite_at(marked, 5, "sub_")
    assert not rewrite.certain and "argument of forward()" in rewrite.choices[0], rewrite
    # A forward of a class that is no autograd.Function: its caller holds the argument.
    plain = _FUNCTION.format(mark="").replace("torch.autograd.Function", "torch.nn.Module")
    assert not rewrite_at(plain, 4, "sub_").certain


def test_a_parameter_is_never_rebound():
    rewrite = rewrite_at("p.data.mul_(2)\n", 1, "mul_", parameter=True)
    assert not rewrite.certain and "after backward()" in rewrite.choices[0]


def test_a_write_through_a_shared_view_offers_only_valid_statements():
    rewrite = rewrite_at("def f(t):\n    t.select(0, 1).zero_()\n", 2, "zero_")
    assert rewrite.choices[0] == "t = t.clone() before the write"
    # A receiver that is a call (maybe a copy) is not a statement's target.
    rewrite = rewrite_at("y.float().mul_(2)\n", 1, "mul_")
    assert not any("y.float() =" in choice for choice in rewrite.choices), rewrite.choices


def test_a_library_call_named_like_the_op_is_not_a_tensor_method():
    assert rewrite_at("import mylib\nmylib.mul_(y)\n", 2, "mul_") is None


def test_a_parameter_write_under_no_grad_moves_after_backward():
    src = source("""
        loss = model(x).sum()
        with torch.no_grad():
            w.clamp_(-1, 1)  # constrain
        loss.backward()
        print(loss)
        """)
    rewrite = fb.after_backward(rw.Rewriter(src, 3, "clamp_", False))
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (2, 4)
    assert rewrite.new == ("loss.backward()\nwith torch.no_grad():\n"
                           "    w.clamp_(-1, 1)  # constrain\n")


def test_a_step_in_an_if_moves_after_backward_under_its_condition():
    src = source("""
        if bug == "early":
            opt.step()  # too early
        else:
            opt.zero_grad()
        loss.backward()
        print(loss)
        """)
    rewrite = fb.after_backward(rw.Rewriter(src, 2, "add_", False))
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (1, 5)
    assert rewrite.new == ('if bug == "early":\n    pass\nelse:\n    opt.zero_grad()\n'
                           'loss.backward()\nif bug == "early":\n    opt.step()  # too early\n')
    # In the else branch: the whole branch moves (zero_grad() after the step, as it was), under
    # the negated test.
    src = source("""
        if (i + 1) % accum:
            pass
        else:
            opt.step()
            opt.zero_grad()
        loss.backward()
        """)
    rewrite = fb.after_backward(rw.Rewriter(src, 4, "add_", False))
    assert rewrite.certain and rewrite.new == (
        "if (i + 1) % accum:\n    pass\nelse:\n    pass\nloss.backward()\n"
        "if not ((i + 1) % accum):\n    opt.step()\n    opt.zero_grad()\n")
    # What is assigned before the backward() is neither read by the test nor by the branch.
    src = source("if bug:\n    opt.step()\nseen = 1\nloss.backward()\n")
    assert fb.after_backward(rw.Rewriter(src, 2, "add_", False)).certain
    # Gradient accumulation without an else: the clip, the step and zero_grad() move together,
    # so that the micro-batch's gradient is clipped, stepped on, then cleared.
    src = source("""
        if (i + 1) % accum == 0:
            clip(params, 1.0)
            opt.step()  # update
            opt.zero_grad()
        loss.backward()
        """)
    rewrite = fb.after_backward(rw.Rewriter(src, 3, "add_", False))
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (1, 5)
    assert rewrite.new == ("loss.backward()\nif (i + 1) % accum == 0:\n    clip(params, 1.0)\n"
                           "    opt.step()  # update\n    opt.zero_grad()\n")


@pytest.mark.parametrize("text", [
    # The test could be another after backward(): it calls, or what it reads is assigned.
    "if ready():\n    opt.step()\nloss.backward()\n",
    "if bug:\n    opt.step()\nbug = False\nloss.backward()\n",
    "if bug:\n    opt.step()\n    bug = False\nloss.backward()\n",
    "if not stepped:\n    opt.step()\nfor stepped in range(2):\n    loss.backward()\n",
    # The branch assigns what the backward() reads, or reads what is assigned before it.
    "if bug:\n    opt.step()\n    scale = 2\n(loss * scale).backward()\n",
    "if bug:\n    opt.step(lr)\nlr = 0.1\nloss.backward()\n",
])
def test_no_certain_move_when_the_condition_may_change(text):
    rewrite = fb.after_backward(rw.Rewriter(source(text), 2, "add_", False))
    assert not rewrite.certain and rewrite.new is None
    assert "under its condition" in rewrite.choices[0]


@pytest.mark.parametrize("call, new", [
    ("loss.backward()", "loss.backward(retain_graph=True)"),
    ("loss.backward(g)", "loss.backward(g, retain_graph=True)"),
    ("loss.backward(retain_graph=False)", "loss.backward(retain_graph=True)"),
    ("self.loss.backward(inputs=[w])", "self.loss.backward(inputs=[w], retain_graph=True)"),
    ("accelerator.backward(loss)", "accelerator.backward(loss, retain_graph=True)"),
])
def test_the_first_of_two_backwards_on_one_loss_keeps_the_graph(call, new):
    src = source(f"loss = f(x)\n{call}  # first\nprint(1)\n{call}\n")
    rewrite = fb.retain_graph(src, 2)
    assert rewrite.certain and rewrite.new == f"{new}  # first\n"


@pytest.mark.parametrize("text", [
    "a.backward()\nb.backward()\n",  # Two losses: they may share a graph on purpose.
    "loss.backward()\nloss = f(x)\nloss.backward()\n",  # The forward ran again.
    "loss.backward()\nprint(loss)\n",  # No second backward in the block.
    "loss.backward(g, True)\nloss.backward()\n",  # retain_graph passed by position.
    "accelerator.backward(d_loss)\naccelerator.backward(g_loss)\n",  # Two losses again.
    "accelerator.backward(loss)\nloss = f(x)\naccelerator.backward(loss)\n",
])
def test_no_retain_graph_unless_one_loss_is_run_twice(text):
    assert fb.retain_graph(source(text), 1) is None


def test_a_data_swap_of_an_attribute_is_cloned_where_the_victim_reads_it():
    src = source("""
        def forward(self, x):
            self.weight.data = self.weight.data / 2
            return x @ self.weight
        """)
    assert rw.Rewriter(src, 2, "").written_name() == "self.weight"
    rewrite = ol.clone_argument_at_victim(src, 3, "self.weight")
    assert rewrite.certain and rewrite.new == "    return x @ self.weight.clone()\n"
    # Read twice (a receiver, then an operand): no certain place for the clone.
    src = source("y = self.w.t() @ self.w\n")
    assert ol.clone_argument_at_victim(src, 1, "self.w") is None


def test_no_move_without_a_backward_after_the_block():
    src = source("""
        loss.backward()
        if bug:
            opt.step()
        """)
    rewrite = fb.after_backward(rw.Rewriter(src, 3, "add_", False))
    assert not rewrite.certain and rewrite.new is None


def test_the_module_construction_the_path_names():
    src = source("""
        self.act1 = nn.ReLU(inplace=True)
        self.act2 = nn.ReLU(True)
        self.drop = nn.Dropout(0.1, inplace=True)
        """)
    found = ol.module_constructions(src, ol.module_classes("layers.1.act2 (ReLU)", "relu_"))
    assert [(node.lineno, target) for node, target, _ in found] == [(1, "act1"), (2, "act2")]
    node, _, flag = found[1]
    assert ol.construction_rewrite(src, node, flag, True).new == "self.act2 = nn.ReLU(False)\n"
    assert ol.module_classes(None, "bernoulli_")[0] == "Dropout"


def test_a_clone_at_the_victim_keeps_precedence():
    src = source("y = a * b  # saved\nz = torch.exp(x)\n")
    assert ol.clone_at_victim(src, 1).new == "y = (a * b).clone()  # saved\n"
    assert ol.clone_at_victim(src, 2).new == "z = torch.exp(x).clone()\n"
    assert ol.clone_at_victim(source("y, z = f(x)\n"), 1) is None


@pytest.mark.parametrize("text, name, new", [
    ("h = f(x, w)\n", "x", "h = f(x.clone(), w)\n"),
    ("hidden = act * up  # saved\n", "up", "hidden = act * up.clone()  # saved\n"),
    # Read once and assigned: the call gets the clone, the name its result.
    ("x = norm(x)\n", "x", "x = norm(x.clone())\n"),
    ("h = x + f(x)\n", "x", None),   # Read twice: which use was saved is not known.
    ("h = f(g=x.t())\n", "x", None),  # Not an argument itself.
])
def test_a_clone_of_a_saved_input_where_the_victim_line_passes_it(text, name, new):
    rewrite = ol.clone_argument_at_victim(source(text), 1, name)
    assert (rewrite.new if rewrite else None) == new


def test_a_name_bound_to_the_tensor_the_victim_line_reads():
    src = source("""
        def layer(hidden):
            residual = hidden
            hidden = norm(hidden)
            residual += attn(hidden)
        """)
    assert ol.bound_to(src, "residual", 4, 3) == ["hidden"]
    # Bound after the victim's line, or the other name assigned again before it: not the same.
    assert ol.bound_to(src, "residual", 4, 2) == []
    src = source("r = h\nh = g(h)\ny = norm(h)\nr += 1\n")
    assert ol.bound_to(src, "r", 4, 3) == []


def hooks_fix(text, victim_line, unpacked):
    src = source(text)
    v = {"victim": {"user_frame": {"file": src.path, "line": victim_line}}, "unpacked": unpacked}
    return ol.fix_hooks(OneFile(src), v)


HALF = {"dtype": "float16", "saved_dtype": "float32", "shape": [8], "saved_shape": [8]}
HALVED = {"dtype": "float32", "saved_dtype": "float32", "shape": [4], "saved_shape": [8]}


def test_an_unpack_hook_that_forgets_the_dtype_is_cast_back():
    rewrite = hooks_fix("with hooks.saved_tensors_hooks(pack, lambda p: p):\n    y = f(x)\n",
                        2, HALF)
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (1, 1)
    assert rewrite.new == (
        "with hooks.saved_tensors_hooks(\n"
        "        lambda saved: (saved.device, saved.dtype,\n"
        "                       pack(saved) if saved.is_floating_point() else saved),\n"
        "        lambda packed: ((lambda p: p)(packed[2]) if packed[1].is_floating_point\n"
        "                        else packed[2]).to(packed[0], packed[1])):\n")


def test_the_hooks_are_found_past_another_with_around_the_victim():
    text = ("with saved_tensors_hooks(pack, unpack):\n    with torch.autocast('cpu'):\n"
            "        y = f(x)\n")
    rewrite = hooks_fix(text, 3, HALF)
    assert rewrite.certain and (rewrite.first_line, rewrite.last_line) == (1, 1)


def test_an_unpack_hook_that_drops_part_of_what_an_identity_pack_kept_returns_it_whole():
    text = "with saved_tensors_hooks(lambda t: t, lambda t: t[:4]):\n    y = f(x)\n"
    rewrite = hooks_fix(text, 2, HALVED)
    assert rewrite.certain
    assert rewrite.new == "with saved_tensors_hooks(lambda t: t, lambda packed: packed):\n"


@pytest.mark.parametrize("text, unpacked", [
    # The pack hook keeps something else: what the unpack hook must return is not at hand.
    ("with saved_tensors_hooks(lambda t: t[::2], lambda t: t[:4]):\n    y = f(x)\n", HALVED),
    # The unpack hook calls something (a side effect the patch would drop).
    ("with saved_tensors_hooks(lambda t: t, lambda t: log(t)[:4]):\n    y = f(x)\n", HALVED),
    # Keyword hooks, or no hooks around the victim's line.
    ("with saved_tensors_hooks(pack_hook=p, unpack_hook=u):\n    y = f(x)\n", HALF),
    ("with torch.no_grad():\n    y = f(x)\n", HALF),
    # A name the wrapper would shadow.
    ("with saved_tensors_hooks(lambda saved: saved.half(), u):\n    y = f(x)\n", HALF),
])
def test_no_hook_patch_where_it_could_change_more_than_the_returned_tensor(text, unpacked):
    assert hooks_fix(text, 2, unpacked) is None


def test_what_remains_names_a_hook_and_a_freed_graph_without_an_op():
    frame = {"user_frame": {"file": "/tmp/copy/train.py", "line": 7}}
    lines = fc._where([{"kind": "silent", "culprit": {"hook": True, **frame}},
                       {"kind": "freed", "culprit": frame},
                       {"kind": "version", "culprit": {"op": "aten::mul_", **frame}}],
                      {"/tmp/copy": "/home/me"})
    assert lines == ["  silent: the unpack hook at /home/me/train.py:7",
                     "  freed: backward() at /home/me/train.py:7",
                     "  version: aten::mul_ at /home/me/train.py:7"]



_STASH = '''
{imports}class _Matmul4bit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, state):
        ctx.tensors = (None, packed)  # keep
        ctx.weight = packed
        ctx.state = state
        return x @ packed.t()
'''


class _OneSource:
    """The Workspace surface stash_fix uses, over one file."""

    def __init__(self, text):
        self.src = source(text)

    def source(self, path):
        return self.src if path == self.src.path else None


def _stash_violation(name, index=None):
    frame = {"file": "/src/train.py", "line": 9, "python": True}
    return {"tensor": {"name": name, "list_index": index},
            "victim": {"op": "_Matmul4bit", "stack": [frame]}}


@pytest.mark.parametrize("name, index, new", [
    ("ctx.tensors", 1, "        ctx.tensors = (None, packed.clone())  # keep\n"),
    ("ctx.weight", None, "        ctx.weight = packed.clone()\n"),
    ("ctx.state.absmax", None, "        import copy\n        ctx.state = copy.copy(state)\n"
                               "        ctx.state.absmax = ctx.state.absmax.clone()\n"),
])
def test_a_ctx_stash_is_cloned_where_forward_keeps_it(name, index, new):
    space = _OneSource(_STASH.format(imports=""))
    rewrite = stash_fix(space, _stash_violation(name, index))
    assert rewrite.certain and rewrite.new == new, rewrite


def test_a_ctx_stash_fix_uses_the_modules_copy_import_and_needs_one_assignment():
    space = _OneSource(_STASH.format(imports="import copy\n"))
    rewrite = stash_fix(space, _stash_violation("ctx.state.absmax"))
    assert rewrite.new.startswith("        ctx.state = copy.copy(state)\n"), rewrite
    twice = _STASH.format(imports="").replace("ctx.weight = packed",
                                              "ctx.weight = packed\n        ctx.weight = x")
    assert stash_fix(_OneSource(twice), _stash_violation("ctx.weight")) is None
    # Not a stash's violation: a saved tensor's name.
    assert stash_fix(space, _stash_violation("saved_tensors", 0)) is None
