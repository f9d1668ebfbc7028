"""The rewrites behind ``torchrr fix`` that place statements around ``backward()``: a parameter
write (an optimizer step, a constraint under no_grad) between the forward and backward() moved
after it, and the first of two backward() calls on one loss told to keep its graph. Standard
library only: no torch.
"""
from __future__ import annotations

import ast
from typing import Optional

from ._fix_rewrite import Rewrite, Rewriter, Source, _calls, _is_no_grad, _keyword, _own_lines, \
    dotted


def _block_of(src: Source, node: ast.stmt) -> Optional[list]:
    """The statement list `node` is in (a body, an else, a finally), or None."""
    parent = src.parents.get(node)
    return next((b for b in (getattr(parent, f, None) for f in ("body", "orelse", "finalbody"))
                 if isinstance(b, list) and node in b), None)


def after_backward(rw: Rewriter) -> Optional[Rewrite]:
    """The statement (or the `with torch.no_grad():` block around it) moved after the next
    backward() of the same block, or None when it is not in a block with one."""
    if rw.stmt is None:
        return None
    unit = rw.stmt
    node = unit
    while node in rw.src.parents and not isinstance(node, (ast.FunctionDef, ast.Module)):
        node = rw.src.parents[node]
        if isinstance(node, ast.With) and any(_is_no_grad(i.context_expr)
                                              for i in node.items):
            unit = node
    parent = rw.src.parents.get(unit)
    body = _block_of(rw.src, unit)
    why = "the parameter is written between the forward and backward() that uses it: " \
          "write it after backward()"
    if body is None:
        return None
    backward = next((s for s in body[body.index(unit) + 1:] if _calls_backward(s)), None)
    if backward is None and isinstance(parent, ast.If):
        guarded = _guarded_after_backward(rw, unit, parent, why)
        if guarded is not None:
            return guarded
    if backward is None:
        return rw._rewrite(None, why, False, ["move this line after the backward() call "
                                              "that runs the graph it changes"])
    first, last = unit.lineno, unit.end_lineno
    if rw.src.old(first, last).strip() != rw.src.segment(unit).strip() and \
            not _own_lines(rw.src, unit):
        return rw._rewrite(None, why, False, ["move this statement after backward()"])
    moved = rw.src.old(first, last)
    between = rw.src.old(last + 1, backward.end_lineno)
    return rw._rewrite(between + moved, why, first=first, last=backward.end_lineno)


def _guarded_after_backward(rw: Rewriter, unit: ast.stmt, branch: ast.If,
                            why: str) -> Optional[Rewrite]:
    """The branch of `branch` that holds `unit` (`if accumulated: opt.step(); opt.zero_grad()`)
    moved whole after the next backward() of the block around the `if`, under the same condition
    (negated for the `else` branch), which keeps `pass`; an `if` without `else` moves as it is.
    The whole branch, because its statements are one sequence: a clip before the step, a
    zero_grad() after it, moved apart from it, would drop or clip the micro-batch's gradient.
    Certain when the condition calls nothing, nothing from the `if` to that backward() assigns a
    name it or the branch reads, and nothing there reads a name the branch assigns; None when no
    backward() follows the `if`."""
    body = _block_of(rw.src, branch)
    if body is None:
        return None
    rest = body[body.index(branch) + 1:]
    backward = next((s for s in rest if _calls_backward(s)), None)
    if backward is None:
        return None
    test = branch.test
    moving = branch.body if unit in branch.body else branch.orelse
    between = rest[:rest.index(backward) + 1]

    def names(statements: list, contexts: tuple) -> set:
        return {n.id for s in statements for n in ast.walk(s)
                if isinstance(n, ast.Name) and isinstance(n.ctx, contexts)}

    read = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    impure = any(isinstance(n, (ast.Call, ast.NamedExpr, ast.Await, ast.Lambda))
                 for n in ast.walk(test))
    assigned_between = names(between, (ast.Store, ast.Del))
    if impure or read & (names([branch], (ast.Store, ast.Del)) | assigned_between) or \
            names(moving, (ast.Store, ast.Del)) & names(between, (ast.Load,)) or \
            names(moving, (ast.Load,)) & assigned_between or \
            not all(_own_lines(rw.src, s) for s in moving) or \
            test.lineno != test.end_lineno:
        return rw._rewrite(None, why, False, [
            "move this statement, with the rest of its branch and under its condition, after "
            "the backward() call that runs the graph it changes"])
    first, last = branch.lineno, backward.end_lineno
    if not branch.orelse:
        moved = rw.src.old(branch.lineno, branch.end_lineno)
        return rw._rewrite(rw.src.old(branch.end_lineno + 1, last) + moved, why, first=first,
                           last=last)
    top, bottom = moving[0].lineno, moving[-1].end_lineno
    kept = [rw.src.old(n, n) for n in range(first, last + 1) if not top <= n <= bottom]
    kept.insert(top - first, rw.src.indent(top) + "pass\n")
    condition = rw.src.segment(test)
    if moving is branch.orelse:
        condition = f"not ({condition})"
    head = rw.src.indent(branch.lineno) + f"if {condition}:\n"
    return rw._rewrite("".join(kept) + head + rw.src.old(top, bottom), why, first=first,
                       last=last)


def retain_graph(source: Source, line: int) -> Optional[Rewrite]:
    """`loss.backward()` at `line`, followed in its block by another `loss.backward(...)` with
    `loss` not assigned in between -> `loss.backward(retain_graph=True)`: the program asks twice
    for the gradient of one graph, which the first pass frees unless told to keep it. None for
    anything else (two losses that share part of a graph, a loss made again in between: keeping
    the graph or running the forward again is the program's intent)."""
    stmt = source.statement_at(line)
    call = _backward_call(stmt)
    body = _block_of(source, stmt) if call is not None else None
    if body is None or len(call.args) > 1:
        return None
    later = next((s for s in body[body.index(stmt) + 1:] if _calls_backward(s)), None)
    again = _backward_call(later) if later is not None else None
    loss = dotted(call.func.value)
    # The same receiver with the same positional arguments: `accelerator.backward(loss)` names
    # its loss as an argument.
    if again is None or not loss or dotted(again.func.value) != loss or \
            [ast.dump(a) for a in call.args] != [ast.dump(a) for a in again.args]:
        return None
    named = {n for part in [call.func.value, *call.args] for n in _dotted_prefixes(part)}
    between = body[body.index(stmt) + 1:body.index(later)]
    if any(isinstance(n, (ast.Name, ast.Attribute)) and isinstance(n.ctx, (ast.Store, ast.Del))
           and dotted(n) in named for s in between for n in ast.walk(s)):
        return None
    keyword = _keyword(call, "retain_graph")
    given = [*call.args, *call.keywords]
    if keyword is not None:
        span = (keyword.value.lineno, keyword.value.col_offset, keyword.value.end_lineno,
                keyword.value.end_col_offset, "True")
    elif given:
        last_given = max(given, key=lambda n: (n.end_lineno, n.end_col_offset))
        span = (last_given.end_lineno, last_given.end_col_offset, last_given.end_lineno,
                last_given.end_col_offset, ", retain_graph=True")
    else:
        span = (call.end_lineno, call.end_col_offset - 1, call.end_lineno,
                call.end_col_offset - 1, "retain_graph=True")
    first, last = stmt.lineno, stmt.end_lineno
    return Rewrite(source.path, first, last, source.old(first, last),
                   source.edit(first, last, [span]), True,
                   f"`{loss}.backward()` runs twice: the first frees the graph the second needs "
                   "unless it keeps it")


def _dotted_prefixes(node: ast.AST) -> set:
    """`a`, `a.b` and `a.b.c` for each `a.b.c` read in `node`: what assigning would change it."""
    out = set()
    for n in ast.walk(node):
        parts = dotted(n).split(".") if isinstance(n, (ast.Name, ast.Attribute)) else []
        out |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if parts[0]}
    return out


def _backward_call(stmt: Optional[ast.stmt]) -> Optional[ast.Call]:
    """The call of `X.backward(...)` that `stmt` is, or None."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) and \
            isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr == "backward":
        return stmt.value
    return None


def _calls_backward(stmt: ast.stmt) -> bool:
    for call in _calls(stmt):
        func = call.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name == "backward" or name == "grad" and "autograd" in ast.unparse(func):
            return True
    return False
