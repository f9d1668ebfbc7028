"""torchrr fix's clone where the victim's function takes the saved tensor (torchrr._fix_made): the
chain of ops that made it, read from dump records, and the line that gets the clone. Standard
library only: no torch, no trace."""
import json
import textwrap

import pytest

from conftest import OneFile
from torchrr import _fix_cpp as cpp
from torchrr import _fix_made as made
from torchrr import _fix_rewrite as rw

CPP = "/src/model.cc"
PY = "/src/model.py"

FORWARD = """
torch::Tensor Rope::forward(const torch::Tensor& x) {
  auto tables = Tables(x.size(-2));
  auto cos = tables[0];
  return x * cos;
}
"""


def dump(strings, records):
    """A `dump --json` text: the strings, then the records."""
    lines = [{"kind": "string", "id": i, "text": t} for i, t in strings.items()]
    return "\n".join(json.dumps(r, separators=(",", ":")) for r in lines + records) + "\n"


def op(op_id, stack, inputs, outputs, parent=0):
    return {"kind": "op", "op": op_id, "name": 9, "parent": parent, "stack": stack,
            "inputs": [{"tensor": t, "version_before": v, "version_after": v} for t, v in inputs],
            "outputs": [{"tensor": t, "version_before": v, "version_after": v}
                        for t, v in outputs]}


def tensor(tensor_id, storage):
    return {"kind": "tensor", "tensor": tensor_id, "storage": storage}


# The cache (tensor 1, storage 7) made in the constructor; Tables' narrow (op 11, whose slice 12
# has no stack of its own) made tensor 2, a view of it, called from forward's line 2; the select
# (op 13) on line 3 made tensor 3, the saved one, which line 4 saves.
STRINGS = {1: CPP, 2: "Rope::forward(at::Tensor const&)", 3: "Rope::Tables(long)",
           4: "Rope::Rope()"}
RECORDS = [
    {"kind": "frame", "id": 1, "file": 1, "function": 4, "line": 20},
    {"kind": "frame", "id": 2, "file": 1, "function": 3, "line": 30},
    {"kind": "frame", "id": 3, "file": 1, "function": 2, "line": 2},
    {"kind": "frame", "id": 4, "file": 1, "function": 2, "line": 3},
    {"kind": "stack", "id": 1, "frames": [1]},
    {"kind": "stack", "id": 2, "frames": [2, 3]},
    {"kind": "stack", "id": 3, "frames": [4]},
    tensor(1, 7), tensor(2, 7), tensor(3, 7), tensor(4, 8),
    op(10, 1, [], [(1, 0)]),
    op(11, 2, [(1, 3)], []),
    op(12, 0, [(1, 3), (4, 0)], [(2, 3)], parent=11),
    op(13, 3, [(2, 3)], [(3, 3)]),
]


def violation(saved_version=3):
    return {"tensor": {"id": 3, "is_output": False}, "saved_version": saved_version,
            "victim": {"user_frame": {"file": CPP, "function": STRINGS[2], "line": 4}}}


def test_the_chain_follows_views_back_through_ops_without_a_stack():
    ops = made.TraceOps(dump(STRINGS, RECORDS))
    steps = ops.chain(3)
    assert [version for _, version in steps] == [3, 3, 0]
    assert [frames[-1][2] for frames, _ in steps] == [3, 2, 20]
    assert steps[1][0] == [(CPP, STRINGS[3], 30), (CPP, STRINGS[2], 2)]


def test_the_earliest_line_of_the_victims_function_gets_the_clone():
    space = OneFile(cpp.CppSource(CPP, textwrap.dedent(FORWARD).lstrip("\n")))
    rewrite = made.clone_where_made(space, violation(), made.TraceOps(dump(STRINGS, RECORDS)))
    assert rewrite.certain and (rewrite.first_line, rewrite.new) == (
        2, "  auto tables = Tables(x.size(-2)).clone();\n")
    # Written between the view and the save: a clone there would hold other values.
    assert made.clone_where_made(space, violation(saved_version=4),
                                 made.TraceOps(dump(STRINGS, RECORDS))) is None


@pytest.mark.parametrize("body, line, new", [
    ("  auto t = Tables(n);\n  return x * t;\n", 2, "  auto t = Tables(n).clone();\n"),
    ("  torch::Tensor t = a + b;  // sum\n  y = x * t;\n", 2,
     "  torch::Tensor t = (a + b).clone();  // sum\n"),
    ("  t = cache_.narrow(1, 0, n);\n  y = x * t;\n", 2,
     "  t = cache_.narrow(1, 0, n).clone();\n"),
    # The next line does not read it: the tensor is not what the line assigns.
    ("  auto t = Tables(n);\n  y = x * u;\n", 2, None),
    # The function writes through the name afterwards: that write must reach what it views.
    ("  auto t = Tables(n);\n  t.mul_(2);\n", 2, None),
    ("  auto t = Tables(n);\n  t[0] = 1;\n", 2, None),
    ("  auto t = Tables(n);\n  t += 1;\n", 2, None),
    ("  f(Tables(n));\n  y = x * t;\n", 2, None),  # Not an assignment.
    # Handed out: what receives it may write into what it views.
    ("  auto t = Tables(n);\n  return t;\n", 2, None),
    ("  auto t = Tables(n);\n  return t[0];\n", 2, None),
    ("  auto t = Tables(n);\n  return std::make_tuple(x * t, t);\n", 2, None),
    ("  auto t = Tables(n);\n  last_ = t;\n", 2, None),
    ("  auto t = Tables(n);\n  state->tables = t[0];\n", 2, None),
])
def test_the_cpp_line_that_takes_the_view(body, line, new):
    src = cpp.CppSource(CPP, "void F(int n) {\n" + body + "}\n")
    rewrite = made._clone_assigned(src, line, line + 1)
    assert (rewrite.new if rewrite else None) == new


@pytest.mark.parametrize("body, new", [
    ("    t = rope.tables(n)\n    return x * t[0]\n", "    t = rope.tables(n).clone()\n"),
    ("    t = rope.tables(n)\n    return x * u\n", None),  # Not read there.
    ("    t = rope.tables(n)\n    t.mul_(2)\n", None),
    ("    t = rope.tables(n)\n    t[0] = 1\n", None),
    ("    t, u = rope.tables(n)\n    return x * t\n", None),
    ("    t = rope.tables(n)\n    return x * t[0], t\n", None),
    ("    t = rope.tables(n)\n    self.last = t\n", None),
    ("    t = rope.tables(n)\n    return t[0].t()\n", None),
    ("    t = rope.tables(n)\n    return torch.cat([t]) * x\n", "    t = rope.tables(n).clone()\n"),
])
def test_the_python_line_that_takes_the_view(body, new):
    src = rw.Source(PY, "def f(x, rope, n):\n" + body)
    rewrite = made._clone_assigned(src, 2, 3)
    assert (rewrite.new if rewrite else None) == new


def test_no_clone_where_the_view_is_made_and_used_within_one_statement():
    # `loss = model(x).loss`: every op of the forward runs from that line, and `loss` holds
    # none of the tensors they make.
    steps = [([(PY, "<module>", 4)], 0), ([(PY, "<module>", 4)], 0)]
    ops = made.TraceOps("")
    ops.chain = lambda tensor: steps
    src = rw.Source(PY, "import torch\nmodel = M()\nx = torch.ones(2)\nloss = model(x).loss\n")
    v = {"tensor": {"id": 5, "is_output": False}, "saved_version": 0,
         "victim": {"user_frame": {"file": PY, "function": "<module>", "line": 4}}}
    assert made.clone_where_made(OneFile(src), v, ops) is None
