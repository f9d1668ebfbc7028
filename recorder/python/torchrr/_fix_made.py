"""Where a saved tensor was made, for ``torchrr fix``'s rule that clones it there: the op whose
output it is, then the op that made the tensor it is a view of, and so on, each with the stack of
the op that ran it (its own, or that of the nearest op around it that has one), read from
``torchrr dump --json``. A tensor shared by reference (a cache a module keeps, `cache_.narrow()`)
and written by a later call is then cloned where the victim's function takes it: what autograd
saves is a copy of the same values, and the program's own write still happens. Standard library
only: no torch.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import re
from typing import Optional

from . import _fix_cpp as cpp
from ._fix_cpp_source import IDENT, loose, statement_at
from ._fix_rewrite import Rewrite, enclosing_function, written_through

# At most this many views back from the saved tensor.
_MAX_STEPS = 16


class TraceOps:
    """The op, tensor, stack and frame records of a trace's `dump --json`, found when asked."""

    # Each line's fixed prefix names its kind and id: lines are indexed by them in one pass and
    # parsed only when asked for (a whole run's dump holds millions).
    _KEYED = re.compile(r'\{"kind":"(op|tensor|stack|frame|string)","(?:op|tensor|id)":(\d+),')

    def __init__(self, dump_text: str):
        self.lines = dump_text.splitlines()
        self._first = {}
        for index, line in enumerate(self.lines):
            match = self._KEYED.match(line)
            if match:
                self._first.setdefault((match.group(1), int(match.group(2))), index)
        self.strings = {key[1]: json.loads(self.lines[index])["text"]
                        for key, index in self._first.items() if key[0] == "string"}

    def _find(self, kind: str, record_id: int) -> Optional[dict]:
        """The first record of `kind` with `record_id` (a tensor's first definition)."""
        index = self._first.get((kind, record_id))
        return json.loads(self.lines[index]) if index is not None else None

    def maker(self, tensor: int) -> Optional[dict]:
        """The first op with `tensor` among its outputs (ids are never reused, so the op that
        made it; an in-place op lists its input as an output, but later)."""
        needle = f'"tensor":{tensor},'
        for line in self.lines:
            if line.startswith('{"kind":"op"') and needle in line:
                record = json.loads(line)
                if any(o["tensor"] == tensor for o in record.get("outputs", [])):
                    return record
        return None

    def storage(self, tensor: int) -> Optional[int]:
        record = self._find("tensor", tensor)
        return record.get("storage") if record else None

    def frames(self, op: dict) -> list:
        """[(file, function, line)] of the stack of `op`, or of the nearest op around it with
        one, innermost first."""
        for _ in range(64):
            if op.get("stack"):
                break
            op = self._find("op", op["parent"]) if op.get("parent") else None
            if op is None:
                return []
        stack = self._find("stack", op["stack"])
        out = []
        for frame_id in (stack or {}).get("frames", []):
            frame = self._find("frame", frame_id) or {}
            out.append((self.strings.get(frame.get("file"), ""),
                        self.strings.get(frame.get("function"), ""), frame.get("line", 0)))
        return out

    def chain(self, tensor: int) -> list:
        """[(frames, version after the op)] of the op that made `tensor`, then of the op that made
        the tensor it is a view of (an input with its storage), and so on."""
        steps = []
        while tensor and len(steps) < _MAX_STEPS:
            op = self.maker(tensor)
            if op is None:
                break
            out = next(o for o in op["outputs"] if o["tensor"] == tensor)
            steps.append((self.frames(op), out.get("version_after")))
            storage = self.storage(tensor)
            tensor = next((i["tensor"] for i in op.get("inputs", [])
                           if storage is not None and self.storage(i["tensor"]) == storage), 0)
        return steps


def clone_where_made(space, v: dict, ops: TraceOps) -> Optional[Rewrite]:
    """The saved input cloned where the victim's function makes it, or the view it is of: the
    earliest op of the saved tensor's chain that ran from a line of the victim's function which
    assigns one variable (`auto tables = Tables(n);`, `t = cache[:n]`), with the tensor's version
    there still the one autograd saved (nothing wrote it between). As safe as the other clones
    at the victim: the values are the same, the gradient flows back through the clone. None
    when no such line is found, or the function writes through that variable after it."""
    tensor = v.get("tensor") or {}
    victim = (v.get("victim") or {}).get("user_frame") or {}
    if tensor.get("is_output", True) or not tensor.get("id") or not victim.get("function"):
        return None
    lines = []
    for frames, version in ops.chain(tensor["id"]):
        here = next((f for f in frames if f[0] == victim.get("file") and
                     f[1] == victim["function"]), None)
        if here is None or version != v.get("saved_version"):
            break
        lines.append(here[2])
    source = space.source(victim.get("file") or "")
    if source is None:
        return None
    # Where each tensor of the chain is used: the next line down the chain, the victim's last.
    used = [victim.get("line"), *lines]
    for made, user in reversed(list(zip(lines, used))):
        line, at = space.locate(source.path, made), space.locate(source.path, user)
        # The line's variable holds the tensor only when another line reads it: a tensor made
        # and used within one statement (inside `model(x)`) is not what that statement assigns.
        rewrite = _clone_assigned(source, line, at) if line and at and line != at else None
        if rewrite is not None:
            return rewrite
    return None


def _clone_assigned(source, line: int, user: int) -> Optional[Rewrite]:
    """`auto t = f(x);` (or `t = f(x);`, Python's `t = f(x)`) at `line` -> its value cloned,
    when the statement at `user` reads `t`, unless the lines after `line` in the function write
    through `t` or hand it out (return it, store it in a member): a write there is meant to
    reach what `t` views."""
    if not isinstance(source, cpp.CppSource):
        from ._fix_other_lines import clone_at_victim

        stmt = source.statement_at(line) if source.tree is not None else None
        reader = source.statement_at(user) if stmt is not None else None
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and
                isinstance(stmt.targets[0], ast.Name) and reader is not None and
                any(isinstance(n, ast.Name) and n.id == stmt.targets[0].id and
                    isinstance(n.ctx, ast.Load) for n in ast.walk(reader))):
            return None
        scope = enclosing_function(source.parents, stmt)
        name = stmt.targets[0].id
        later = [n for n in ast.walk(scope)
                 if getattr(n, "lineno", 0) > stmt.end_lineno]
        if any(_writes_python(n, name) or _hands_out(n, name) for n in later):
            return None
        return dataclasses.replace(clone_at_victim(source, line), why=_why(name))
    stmt, _ = statement_at(source, line)
    match = re.match(rf"\s*(?:(?:const\s+)?(?:auto|torch::Tensor|at::Tensor)\s+)?({IDENT})\s*=(?!=)"
                     rf"\s*(.+?)\s*$", stmt.code, re.S) if stmt else None
    function = source.function(stmt.start) if match else None
    reader, _ = statement_at(source, user) if function else (None, None)
    if reader is None or not re.search(rf"\b{match.group(1)}\b", reader.code):
        return None
    name, value = match.group(1), match.group(2)
    body = source.code[stmt.end:function[2][1]]
    written = rf"\b{name}\b\s*(?:\.\s*{IDENT}_\s*\(|\[[^;]*?\]\s*[-+*/]?=(?!=)|[-+*/]=)"
    # Returned or stored in a member whole, as an argument, or as a receiver or an indexing (a
    # view): not as the operand of an arithmetic operator, whose result is a new tensor.
    alias = rf"(?:\breturn|[({{,=])\s*{name}\s*[;,}})\[.]"
    handed = rf"(?:\breturn\b|(?:\b\w+_|\w+\s*(?:\.|->)\s*\w+)\s*=(?!=))[^;]*;"
    if re.search(written, body) or any(re.search(alias, m.group(0))
                                       for m in re.finditer(handed, body)):
        return None
    spans = [(match.end(2), match.end(2), ")" * loose(value) + ".clone()")]
    if loose(value):
        spans.append((match.start(2), match.start(2), "("))
    rewriter = cpp.CppRewriter(source, line, "")
    return Rewrite(source.path, line, line, source.old(line, line), rewriter._edit(spans), True,
                   _why(name))


def _why(name: str) -> str:
    return f"`{name}` shares its memory with a tensor that other code holds and writes after " \
           "autograd saved it: clone it where it is taken, so that what autograd saved is not " \
           "what is written"


def _hands_out(node: ast.AST, name: str) -> bool:
    """Whether `node` returns or yields `name`, or stores it in an attribute or an item: whole,
    in a tuple or a list, or a view of it (an indexing, a method's receiver); not the result of
    an operator or a call it is passed to."""
    if isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom)):
        value = node.value
    elif isinstance(node, (ast.Assign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        value = node.value if any(isinstance(t, (ast.Attribute, ast.Subscript))
                                  for t in targets) else None
    else:
        return False
    stack = [value] if value is not None else []
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Name) and item.id == name:
            return True
        if isinstance(item, (ast.Tuple, ast.List)):
            stack += item.elts
        elif isinstance(item, (ast.Starred, ast.Subscript, ast.Attribute)):
            stack.append(item.value)
        elif isinstance(item, ast.Call) and isinstance(item.func, ast.Attribute):
            stack.append(item.func.value)
    return False


def _writes_python(node: ast.AST, name: str) -> bool:
    """Whether `node` writes in place through `name` (`t.mul_()`, `t[0] = 0`, `t += 1`)."""
    base = written_through(node)
    while isinstance(base, (ast.Subscript, ast.Attribute)):
        base = base.value
    return isinstance(base, ast.Name) and base.id == name
