"""The rewrites behind ``torchrr fix`` on lines other than the culprit's statement: the
construction of the ``nn.Module`` whose forward wrote in place (``nn.ReLU(inplace=True)``), a
clone at the victim's line, where autograd saved the tensor, for a write that the culprit's line
cannot undo, and the ``saved_tensors_hooks`` around the victim's line when the unpack hook hands
backward another tensor. Standard library only: no torch.
"""
from __future__ import annotations

import ast
from typing import Optional

from . import _fix_cpp as cpp
from ._fix_rewrite import (Rewrite, Rewriter, Source, _calls, _end, _is_true, _keyword, _start,
                           dotted)

# nn modules that take inplace=, and the position of inplace among their positional arguments.
_INPLACE_MODULES = {"ReLU": 0, "ReLU6": 0, "SELU": 0, "Hardswish": 0, "Hardsigmoid": 0,
                    "SiLU": 0, "Mish": 0, "LeakyReLU": 1, "ELU": 1, "CELU": 1, "Dropout": 1,
                    "Dropout1d": 1, "Dropout2d": 1, "Dropout3d": 1, "AlphaDropout": 1,
                    "FeatureAlphaDropout": 1, "Threshold": 2, "Hardtanh": 2, "RReLU": 2}
# The module classes whose forward runs each in-place op (when the trace names no module).
_OP_MODULES = {"relu_": ["ReLU"], "leaky_relu_": ["LeakyReLU"], "hardtanh_": ["Hardtanh", "ReLU6"],
               "elu_": ["ELU", "CELU", "SELU"], "celu_": ["CELU"], "selu_": ["SELU"],
               "silu_": ["SiLU"], "mish_": ["Mish"], "hardswish_": ["Hardswish"],
               "hardsigmoid_": ["Hardsigmoid"], "threshold_": ["Threshold"], "rrelu_": ["RReLU"],
               "rrelu_with_noise_": ["RReLU"], "dropout_": ["Dropout"],
               "feature_dropout_": ["Dropout1d", "Dropout2d", "Dropout3d"],
               "alpha_dropout_": ["AlphaDropout"], "feature_alpha_dropout_":
               ["FeatureAlphaDropout"], "bernoulli_": ["Dropout", "Dropout1d", "Dropout2d",
                                                       "Dropout3d"]}


def module_constructions(source: Source, classes: list) -> list:
    """(Call node, the name it is assigned to or None, the inplace argument node) of every
    construction in `source` of a class in `classes` with inplace=True."""
    found = []
    for node in ast.walk(source.tree) if source.tree else ():
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in classes:
            continue
        keyword = _keyword(node, "inplace")
        position = _INPLACE_MODULES.get(name, -1)
        flag = keyword.value if keyword is not None else (
            node.args[position] if 0 <= position < len(node.args) else None)
        if not _is_true(flag):
            continue
        parent = source.parents.get(node)
        target = None
        if isinstance(parent, (ast.Assign, ast.AnnAssign)):
            targets = parent.targets if isinstance(parent, ast.Assign) else [parent.target]
            names = [t.attr if isinstance(t, ast.Attribute) else getattr(t, "id", None)
                     for t in targets]
            target = names[0] if len(names) == 1 else None
        elif isinstance(parent, ast.keyword):
            target = parent.arg
        found.append((node, target, flag))
    return found


def module_classes(module: Optional[str], op: str) -> list:
    """The classes that ran the culprit: the one the trace names ("layers.1.act (ReLU)"), else
    those whose forward runs `op` in place."""
    if module and module.endswith(")") and "(" in module:
        name = module[module.rindex("(") + 1:-1]
        if name in _INPLACE_MODULES:
            return [name]
        return []
    return _OP_MODULES.get(op, [])


def construction_rewrite(source: Source, node: ast.Call, flag: ast.AST, certain: bool,
                         choices=()) -> Rewrite:
    """The construction with its inplace argument False."""
    stmt = node
    while stmt in source.parents and not isinstance(stmt, ast.stmt):
        stmt = source.parents[stmt]
    first, last = stmt.lineno, stmt.end_lineno
    new = source.edit(first, last, [(flag.lineno, flag.col_offset, flag.end_lineno,
                                     flag.end_col_offset, "False")])
    name = source.segment(node.func)
    return Rewrite(source.path, first, last, source.old(first, last), new if certain else None,
                   certain, f"{name}(inplace=True) writes into its input, which autograd saved",
                   list(choices))


def clone_argument_at_victim(source: Source, line: int, name: str) -> Optional[Rewrite]:
    """`h = f(x, w)` (or `h = a * x`) at the victim's line, which saved its input `x` ->
    `h = f(x.clone(), w)`: the call saves a copy of the same values and passes the gradient back
    to `x`, and a later write into `x` leaves the copy alone. `name` may be an attribute
    (`self.w`). None unless `name` is read once in the statement, as an argument of a call or an
    operand of a binary operator."""
    stmt = source.statement_at(line)
    if stmt is None or not name:
        return None
    uses = [n for n in ast.walk(stmt) if isinstance(n, (ast.Name, ast.Attribute)) and
            isinstance(n.ctx, ast.Load) and dotted(n) == name]
    if len(uses) != 1:
        return None
    arguments = {id(a) for call in _calls(stmt) for a in
                 [*call.args, *(k.value for k in call.keywords)]}
    arguments |= {id(o) for b in ast.walk(stmt) if isinstance(b, ast.BinOp)
                  for o in (b.left, b.right)}
    if id(uses[0]) not in arguments:
        return None
    first, last = stmt.lineno, stmt.end_lineno
    return Rewrite(source.path, first, last, source.old(first, last),
                   source.edit(first, last, [_end(uses[0], ".clone()")]), True,
                   f"`{name}` is saved by this call and changed afterwards where no "
                   "rewrite of that line can undo it: pass the call a clone, so that what "
                   "autograd saved is not what is written")


def clone_at_victim(source: Source, line: int) -> Optional[Rewrite]:
    """`y = f(x)` at the victim's line -> `y = f(x).clone()`, so that what autograd saved is not
    the tensor written later; None when the line is not one such assignment."""
    stmt = source.statement_at(line)
    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and
            isinstance(stmt.targets[0], ast.Name)):
        return None
    value = stmt.value
    loose = not isinstance(value, (ast.Call, ast.Name, ast.Attribute, ast.Subscript))
    spans = [_end(value, ")" * loose + ".clone()")]
    if loose:
        spans.append(_start(value, "("))
    first, last = stmt.lineno, stmt.end_lineno
    return Rewrite(source.path, first, last, source.old(first, last),
                   source.edit(first, last, spans), True,
                   f"`{stmt.targets[0].id}` is written in place where no rewrite of that line "
                   "can undo it (library code, a helper's argument, a hook, a write under "
                   "no_grad): clone it where it is made, so that what autograd saved is not what "
                   "is written")


def fix_hooks(space, v: dict) -> Optional[Rewrite]:
    """`with saved_tensors_hooks(pack, unpack):` around the victim's line, when the unpack hook
    gave backward another tensor than the one autograd saved:
    - the values in another dtype (a pack that keeps float16, an unpack that forgets to cast
      back): each packed tensor carries its device and dtype, and what the unpack hook returns
      goes back to them; both hooks still run on floating-point tensors, and the others skip
      them.
    - another shape, where the pack hook is `lambda t: t` and the unpack hook a lambda that calls
      nothing: the unpack hook is given the saved tensor itself, which is what it must return.
    None for anything else (no cast gives back what a hook dropped)."""
    unpacked = v.get("unpacked") or {}
    source, line = victim_line(space, v)
    node = source.statement_at(line) if source is not None else None
    call = None
    while node is not None and call is None:  # The innermost `with` that sets the hooks.
        node = source.parents.get(node)
        call = next((i.context_expr for i in getattr(node, "items", [])
                     if isinstance(i.context_expr, ast.Call) and
                     dotted(i.context_expr.func).endswith("saved_tensors_hooks")), None)
    if call is None or len(call.args) != 2 or call.keywords:
        return None
    pack, unpack = call.args
    if unpacked.get("shape") != unpacked.get("saved_shape"):
        if not (_is_identity(pack) and isinstance(unpack, ast.Lambda) and not _calls(unpack)):
            return None
        span = (unpack.lineno, unpack.col_offset, unpack.end_lineno, unpack.end_col_offset,
                "lambda packed: packed")
        why = f"the unpack hook gives backward shape {unpacked.get('shape')} where autograd " \
              f"saved {unpacked.get('saved_shape')}, and its pack hook kept the saved tensor " \
              "itself: return that"
    elif unpacked.get("dtype") and unpacked.get("dtype") != unpacked.get("saved_dtype"):
        if {n.id for a in call.args for n in ast.walk(a) if isinstance(n, ast.Name)} & \
                {"saved", "packed"}:
            return None
        pack_text, unpack_text = (source.segment(a) if isinstance(a, (ast.Name, ast.Attribute))
                                  else f"({source.segment(a)})" for a in call.args)
        # A tensor that is not floating point (the labels a loss saved) skips both hooks: a
        # pack that rounds it (int64 to bfloat16) loses what no cast back restores.
        indent = "\n" + source.indent(node.lineno) + " " * 8
        text = (f"{indent}lambda saved: (saved.device, saved.dtype,"
                f"{indent}{' ' * 15}{pack_text}(saved) if saved.is_floating_point() else saved),"
                f"{indent}lambda packed: ({unpack_text}(packed[2]) if packed[1].is_floating_point"
                f"{indent}{' ' * 16}else packed[2]).to(packed[0], packed[1])")
        span = (pack.lineno, pack.col_offset, unpack.end_lineno, unpack.end_col_offset, text)
        why = f"the unpack hook gives backward {unpacked['dtype']} where autograd saved " \
              f"{unpacked['saved_dtype']}: cast what it returns back to the saved tensor's " \
              "dtype and device"
    else:
        return None
    first, last = node.lineno, call.end_lineno
    return Rewrite(source.path, first, last, source.old(first, last),
                   source.edit(first, last, [span]), True, why)


def _is_identity(node: ast.AST) -> bool:
    """`lambda t: t`."""
    return isinstance(node, ast.Lambda) and len(node.args.args) == 1 and \
        isinstance(node.body, ast.Name) and node.body.id == node.args.args[0].arg


# -- Where the victim's line is, and which name to clone there -----------------------------
# `space` is _fix.Workspace (the sources as recorded and here), `v` a replay JSON violation.

def _frame_in(stack: list, of: dict, python: bool) -> Optional[dict]:
    """The first frame of `stack` (Python's or native ones, by `python`) in the function of the
    frame `of`: the same file and function name."""
    if not of.get("function"):
        return None
    return next((f for f in stack or [] if bool(f.get("python")) == python and
                 f.get("file") == of.get("file") and f.get("function") == of["function"]), None)


def victim_line(space, v: dict) -> tuple:
    """(the victim's source, its line there), or (None, None) when the source is not here."""
    frame = (v.get("victim") or {}).get("user_frame") or {}
    if not frame.get("file"):
        return None, None
    source = space.source(frame["file"])
    line = space.locate(frame["file"], frame["line"]) if source is not None else None
    if source is None or source.tree is None or line is None:
        return None, None
    return source, line


def clone_output_at_victim(space, v: dict) -> Optional[Rewrite]:
    """A clone of the saved output at the victim's line, for a write the culprit's line cannot
    undo (library code, a helper's argument): a clone changes no value and no gradient, so the
    rewrite is safe even where it does not suffice (--check says)."""
    if not (v.get("tensor") or {}).get("is_output"):
        return None
    source, line = victim_line(space, v)
    return clone_at_victim(source, line) if source is not None else None


def clone_named_input_at_victim(space, v: dict, name: str) -> Optional[Rewrite]:
    """A clone of the saved input `name` where the victim's line passes it, as safe as
    clone_output_at_victim's."""
    if (v.get("tensor") or {}).get("is_output", True):
        return None
    source, line = victim_line(space, v)
    return clone_argument_at_victim(source, line, name) if source is not None else None


def clone_passed_at_victim(space, v: dict, culprit: dict) -> Optional[Rewrite]:
    """A clone of the saved input at the victim's line, under the name the culprit's code gives
    it in the victim's function: the name its line writes, when that line is in the function, or
    the one name passed by the call it makes from there (a helper that writes through an alias of
    what it is given). As safe as clone_output_at_victim's; None unless the victim's line reads
    that name once, as an argument or an operand."""
    if (v.get("tensor") or {}).get("is_output", True):
        return None
    source, line = victim_line(space, v)
    if source is None:
        return None
    frame = _frame_in(culprit.get("stack"), (v.get("victim") or {}).get("user_frame") or {}, True)
    here = space.locate(frame["file"], frame["line"]) if frame else None
    stmt = source.statement_at(here) if here else None
    if stmt is None:
        return None
    if frame.get("line") == (culprit.get("user_frame") or {}).get("line"):
        written = Rewriter(source, here, "").written_name()
        names = [written, *bound_to(source, written, here, line)]
    else:
        names = [a.id for call in ast.walk(stmt) if isinstance(call, ast.Call)
                 for a in call.args if isinstance(a, ast.Name)]
    found = [r for r in (clone_argument_at_victim(source, line, n) for n in set(names)) if r]
    return found[0] if len(found) == 1 else None


def bound_to(source: Source, name: str, line: int, at: int) -> list:
    """[other] when the last assignment to `name` before `line` is `name = other`, made before
    the victim's line `at` with `other` not assigned again in between: there both names
    hold the same tensor (`residual = hidden_states`). [] otherwise."""
    if not name or source.tree is None:
        return []
    assigns = sorted((n for n in ast.walk(source.tree) if isinstance(n, ast.Assign) and
                      n.lineno < line and len(n.targets) == 1 and
                      isinstance(n.targets[0], ast.Name)), key=lambda n: n.lineno)
    last = next((n for n in reversed(assigns) if n.targets[0].id == name), None)
    if last is None or not isinstance(last.value, ast.Name) or last.lineno >= at:
        return []
    other = last.value.id
    if any(n.targets[0].id == other and last.lineno < n.lineno < at for n in assigns):
        return []
    return [other]


def cpp_clone_at_victim(space, v: dict, culprit: dict) -> Optional[Rewrite]:
    """clone_passed_at_victim's rule for C++ lines (_fix_cpp.clone_read_at), and one more: where
    the victim's op runs in a function that the culprit's function calls, the clone goes where
    that call passes the name the culprit's line writes (`input_norm_->forward(x)` before
    `x += attn_out;`)."""
    if (v.get("tensor") or {}).get("is_output", True):
        return None
    mine = culprit.get("user_frame") or {}
    victim = (v.get("victim") or {}).get("user_frame") or {}

    def line_in(frame: dict) -> tuple:
        source = space.source(frame.get("file") or "")
        line = space.locate(frame["file"], frame["line"]) if source is not None else None
        return (source, line) if isinstance(source, cpp.CppSource) and line else (None, None)

    frame = _frame_in(culprit.get("stack"), victim, False)
    if frame is not None:  # The victim's line is in a function the culprit's code runs in.
        source, here = line_in(frame)
        target, at = line_in(victim)
        if source is None or target is None:
            return None
        names = [cpp.written_name(source, here)] if frame.get("line") == mine.get("line") \
            else cpp.passed_names(source, here)
    else:  # The victim's op runs below a call the culprit's function makes.
        frame = _frame_in((v.get("victim") or {}).get("stack"), mine, False)
        source, here = line_in(mine)
        target, at = line_in(frame) if frame else (None, None)
        if source is None or target is None:
            return None
        names = [cpp.written_name(source, here)]
    found = [r for r in (cpp.clone_read_at(target, at, n) for n in set(names) if n) if r]
    return found[0] if len(found) == 1 else None
