"""`torchrr fix` for a tensor that a Python autograd.Function's forward kept in its ctx's attributes
(`ctx.tensors = (None, B)`, `ctx.state = quant_state`) and that the program wrote before the
Function's backward read it: PyTorch checks nothing there. The patch is in the Function's forward,
where the attribute is set: it keeps a .clone() of the tensor (of the object, a shallow copy with
the tensor cloned), so that the program's write still happens and backward reads what forward
saw. A clone changes no value, so the patch is safe; `--check` says whether it suffices. Standard
library only: no torch.
"""
from __future__ import annotations

import ast
import re
from typing import Optional

from ._fix_rewrite import Rewrite

# "ctx.tensors", "ctx.state.absmax": the attribute path the recorder names a stash by.
_PATH = re.compile(r"ctx((?:\.[A-Za-z_]\w*){1,2})$")


def _forward(source, function: str) -> Optional[ast.FunctionDef]:
    """The `forward` of class `function` in `source`, or None."""
    for node in ast.walk(source.tree) if source.tree else ():
        if isinstance(node, ast.ClassDef) and node.name == function:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "forward":
                    return item
    return None


def _assignments(forward: ast.FunctionDef, attribute: str) -> list:
    """The statements `<ctx>.<attribute> = ...` in `forward`, whose first argument is the ctx."""
    if not forward.args.args:
        return []
    ctx = forward.args.args[0].arg
    found = []
    for node in ast.walk(forward):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Attribute) and target.attr == attribute and \
                    isinstance(target.value, ast.Name) and target.value.id == ctx:
                found.append(node)
    return found


def _cloned(source, expr: ast.AST) -> str:
    text = source.segment(expr)
    simple = isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript))
    return f"{text}.clone()" if simple else f"({text}).clone()"


def _files(v: dict) -> list:
    """Where the Function may be defined: the files of the victim's stack, then the culprit's."""
    files = []
    for op in (v.get("victim"), v.get("culprit")):
        for frame in (op or {}).get("stack") or []:
            if frame.get("python") and frame.get("file") and frame["file"] not in files:
                files.append(frame["file"])
    return files


def stash_fix(space, v: dict) -> Optional[Rewrite]:
    """The clone where the Function's forward stashes the tensor of violation `v`, or None when
    `v` is no stash's or the assignment is not found once."""
    tensor = v.get("tensor") or {}
    match = _PATH.match(tensor.get("name") or "")
    function = (v.get("victim") or {}).get("op")
    if match is None or not function:
        return None
    path = match.group(1)[1:].split(".")
    index = tensor.get("list_index")
    for file in _files(v):
        source = space.source(file)
        forward = _forward(source, function) if source is not None and \
            getattr(source, "tree", None) is not None else None
        stmts = _assignments(forward, path[0]) if forward is not None else []
        if len(stmts) != 1:
            continue
        stmt = stmts[0]
        return _rewrite(source, stmt, path, index, function)
    return None


def _rewrite(source, stmt: ast.Assign, path: list, index, function: str) -> Optional[Rewrite]:
    target = source.segment(stmt.targets[0])
    value = stmt.value
    indent = source.indent(stmt.lineno)
    why = f"{function}.forward keeps `{target}` on its ctx, which PyTorch does not check, and " \
          "the program writes into it before backward reads it: keep a clone"
    if len(path) == 1 and index is None:
        new = f"{indent}{target} = {_cloned(source, value)}\n"
    elif len(path) == 1 and isinstance(value, (ast.Tuple, ast.List)) and \
            index is not None and index < len(value.elts):
        spans = [(e, _cloned(source, e) if i == index else source.segment(e))
                 for i, e in enumerate(value.elts)]
        items = ", ".join(text for _, text in spans)
        if isinstance(value, ast.Tuple):
            items = f"({items}{',' if len(spans) == 1 else ''})"
        else:
            items = f"[{items}]"
        new = f"{indent}{target} = {items}\n"
    elif len(path) == 2 and index is None:
        # A plain object (a quantization state): a shallow copy whose tensor is a clone, so that
        # the program's object, and its later writes, are not what backward reads.
        new = (f"{indent}{target} = copy.copy({source.segment(value)})\n"
               f"{indent}{target}.{path[1]} = {target}.{path[1]}.clone()\n")
        if "copy" not in source.imported:
            new = f"{indent}import copy\n" + new
    else:
        return None
    if stmt.lineno != stmt.end_lineno:
        return None
    old = source.old(stmt.lineno, stmt.end_lineno)
    comment = old.rstrip("\n")[len(source.segment(stmt)) + len(indent):]
    if comment.strip():  # On the assignment's line, after the import a copy may need.
        lines = new.splitlines(keepends=True)
        at = 1 if lines[0].strip() == "import copy" else 0
        lines[at] = lines[at].rstrip("\n") + comment + "\n"
        new = "".join(lines)
    return Rewrite(source.path, stmt.lineno, stmt.end_lineno, old, new, True, why)
