"""The rewrites behind ``torchrr fix`` for a culprit line of C++ (a libtorch program): the
statement made out of place where the line holds one statement of a shape whose rewrite is
certain, else the choices. There is no C++ parser here: the text is read with comments and
literals blanked (_fix_cpp_source.py), and only these shapes, each alone on its line, are rewritten:

    x.mul_(g);                    ->  x = x.mul(g);
    x += y;  (-=, *=, /=)         ->  x = x + y;
    torch::relu_(x);              ->  x = torch::relu(x);
    F::relu(x, F::ReLUFuncOptions().inplace(true));  ->  x = F::relu(x, ...inplace(false));

and ``.inplace(true)`` at a module's construction, a write between the forward and
``backward()`` moved after it, and, where the culprit's line cannot be undone (a function's
argument written in place, a helper's raw write), ``.clone()`` where the saved tensor is read.
Anything else (a statement over several lines, a macro, two statements on a line, a receiver
that is an expression, a result that is used, a tensor that other code may hold) gets no patch:
the Rewrite is not certain and lists the choices. Every edit replaces spans of the original
line, so its comments and formatting survive. Standard library only: no torch.
"""
from __future__ import annotations

import re
from typing import Optional

# CppSource and is_cpp are _fix.py's too, through this module.
from ._fix_cpp_source import (IDENT, PATH, CppSource, closing, is_cpp, loose, split_args,
                              statement_at, top_level)
from ._fix_rewrite import Rewrite, keep_comment_column

_AUG_OPS = {"+": "add_", "-": "sub_", "*": "mul_", "/": "div_"}
# In-place methods whose out-of-place twin is not the name without "_" ({r}: the receiver,
# {a}: the arguments); None: no single twin.
_NO_TWIN = {"zero_": "torch::zeros_like({r})", "fill_": "torch::full_like({r}, {a})",
            "copy_": None, "set_": None, "resize_": None, "resize_as_": None, "uniform_": None,
            "normal_": None, "random_": None, "bernoulli_": None, "exponential_": None,
            "geometric_": None, "cauchy_": None, "log_normal_": None}
# Calls whose result shares its input's memory: writing into it writes into that input.
_VIEWS = {"view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "select",
          "narrow", "slice", "expand", "expand_as", "squeeze", "unsqueeze", "flatten",
          "unflatten", "diagonal", "as_strided", "detach", "split", "chunk", "unbind", "movedim",
          "swapaxes", "swapdims", "real", "imag", "view_as_real", "view_as_complex", "unfold",
          "indices", "values", "contiguous", "to", "type_as", "index", "alias", "from_blob",
          "mT", "mH", "T", "H", "data", "variable_data", "tensor_data"}
# torch::nn modules whose options take inplace, by the class's C++ name.
_INPLACE_MODULES = ("ReLU", "ReLU6", "SELU", "SiLU", "Mish", "Hardswish", "Hardsigmoid",
                    "LeakyReLU", "ELU", "CELU", "Dropout", "Dropout2d", "Dropout3d",
                    "AlphaDropout", "FeatureAlphaDropout", "Threshold", "Hardtanh", "RReLU")
# Indexed writes: the op the trace names is the copy or fill they run, not the method.
_INDEXED = {"index_put_": ("copy_", "fill_", "_index_put_impl_"),
            "index_fill_": ("fill_",), "index_copy_": ("copy_",),
            "masked_fill_": ("fill_",), "masked_scatter_": ("copy_",)}
_NO_GRAD_GUARDS = re.compile(r"\b(?:NoGradGuard|InferenceMode|AutoGradMode\s*\w*\s*[({]\s*false)")



class CppRewriter:
    """Finds the rewrite of one culprit line of C++: `op` is the in-place op's base name (`mul_`
    of `aten::mul_`); `parameter` whether the tensor written is a leaf that requires grad (a
    parameter): rebinding its name would cut it from the model and the optimizer."""

    def __init__(self, src: CppSource, line: int, op: str, parameter: bool = False):
        self.src = src
        self.line = line
        self.op = op
        self.parameter = parameter
        self.stmt, self.no_statement = statement_at(src, line)

    def _rewrite(self, new: Optional[str], why: str, certain: bool = True, choices=(),
                 first: Optional[int] = None, last: Optional[int] = None) -> Rewrite:
        first = first or self.line
        last = last or self.line
        return Rewrite(self.src.path, first, last, self.src.old(first, last),
                       new if certain else None, certain, why, list(choices))

    def _edit(self, spans: list) -> str:
        """The statement's line with each (start, end, text) span (offsets in the statement's
        code) replaced, a comment after it kept in its column."""
        old = text = self.src.lines[self.line - 1]
        base = self.stmt.start - self.src.starts[self.line - 1]
        for start, end, new in sorted(spans, reverse=True):
            text = text[:base + start] + new + text[base + end:]
        code_end = self.stmt.end + 1 - self.src.starts[self.line - 1]
        return keep_comment_column(old, text, code_end, "//")

    def _edited(self, spans: list) -> str:
        """The statement alone (no comment after it) with `spans` replaced: a choice's text."""
        text = self.src.text[self.stmt.start:self.stmt.end + 1]
        for start, end, new in sorted(spans, reverse=True):
            text = text[:start] + new + text[end:]
        return text

    def statement(self) -> Optional[Rewrite]:
        """The out-of-place rewrite of the statement, an uncertain Rewrite that says why there
        is none, or None when the line does not hold the op at all."""
        mentions = re.search(rf"\b{re.escape(self.op)}\s*\(", self.src.code_lines[self.line - 1]) \
            if self.op and 0 < self.line <= len(self.src.code_lines) else None
        aug = self.op in _AUG_OPS.values()
        inplace = 0 < self.line <= len(self.src.code_lines) and re.search(
            r"\.\s*inplace\s*\(\s*true\s*\)", self.src.code_lines[self.line - 1])
        if self.stmt is None:
            if mentions or inplace or aug and re.search(
                    r"[-+*/]=", self.src.code_lines[self.line - 1] if 0 < self.line <= len(
                        self.src.code_lines) else ""):
                return self._rewrite(None, f"{self.no_statement}: no rewrite is certain", False,
                                     [f"make {self.op} out of place on this line",
                                      ".clone() the tensor before it is modified"])
            return None
        for rule in (self._inplace_options, self._aug_assign, self._method, self._function):
            rewrite = rule()
            if rewrite is not None:
                return rewrite
        if mentions:
            return self._used_result()
        return None

    # -- The rules ---------------------------------------------------------------------------

    def _method(self) -> Optional[Rewrite]:
        """`x.mul_(g);` -> `x = x.mul(g);`."""
        code = self.stmt.code
        match = re.match(rf"(?P<recv>{PATH})\s*\.\s*(?P<op>{IDENT}_)\s*\(", code)
        if match is None or closing(code, match.end() - 1) != len(code) - 1 or \
                match.group("op") != self.op and self.op not in _INDEXED.get(match.group("op"),
                                                                             ()):
            return None
        op = match.group("op")
        recv = re.sub(r"\s+", "", match.group("recv"))
        why = f"`{op}` writes in place into a tensor autograd saved"
        args = code[match.end():-1]
        if op in _NO_TWIN:
            form = _NO_TWIN[op]
            if form is None:
                return self._rewrite(None, why + " and has no out-of-place twin", False,
                                     [f"{recv} = {recv}.clone(); before the write",
                                      "write into a new tensor and use it from here on"])
            spans = [(0, len(code), f"{recv} = " + form.format(r=recv, a=args.strip()))]
        else:
            spans = [(0, 0, f"{recv} = "), (match.start("op"), match.end("op"), op[:-1])]
        return self._assign(recv, spans, why)

    def _function(self) -> Optional[Rewrite]:
        """`torch::relu_(x);` -> `x = torch::relu(x);` (torch:: or at::)."""
        code = self.stmt.code
        match = re.match(rf"(?:::\s*)?(?:torch|at)\s*::\s*(?P<op>{re.escape(self.op)})\s*\(",
                         code)
        if match is None or closing(code, match.end() - 1) != len(code) - 1 or \
                self.op in _NO_TWIN:
            return None
        args = split_args(code[match.end():-1])
        first = args[0][1].strip()
        why = f"`{self.op}` writes in place into a tensor autograd saved"
        if not re.fullmatch(PATH, first):
            return self._rewrite(None, why + f" ({first} is an expression)", False, [
                self._edited([(match.start("op"), match.end("op"), self.op[:-1])])
                + "  (then use the result where the tensor was used)",
                ".clone() the tensor before this line"])
        name = re.sub(r"\s+", "", first)
        return self._assign(name, [(0, 0, f"{name} = "),
                                   (match.start("op"), match.end("op"), self.op[:-1])], why)

    def _aug_assign(self) -> Optional[Rewrite]:
        """`x += y;` -> `x = x + y;` (+, -, *, /)."""
        code = self.stmt.code
        top = top_level(code)
        match = re.search(r"(?<![-+*/%<>=!&|^])([-+*/])=(?!=)", top)
        if match is None or _AUG_OPS[match.group(1)] != self.op:
            return None
        lhs = code[:match.start()].strip()
        rhs = code[match.end():]
        symbol = match.group(1)
        why = f"`{lhs} {symbol}=` writes in place: assign the out-of-place result"
        if "," in top_level(rhs):
            return self._rewrite(None, why + " (a comma operator on the line)", False,
                                 [f"{lhs} = {lhs} {symbol} (...);  (the value you meant)"])
        if not re.fullmatch(PATH, lhs):
            return self._rewrite(None, f"`{symbol}=` writes in place into an expression, which "
                                 "autograd saved", False, [
                                     "clone the tensor before the write",
                                     "write into a new tensor and use it from here on"])
        name = re.sub(r"\s+", "", lhs)
        value = rhs.strip()
        offset = match.end() + len(rhs) - len(rhs.lstrip())
        wrap = loose(value)
        spans = [(len(code[:match.start()].rstrip()), offset,
                  f" = {name} {symbol} " + "(" * wrap)]
        if wrap:
            spans.append((len(code), len(code), ")"))
        return self._assign(name, spans, why)

    def _inplace_options(self) -> Optional[Rewrite]:
        """`F::relu(x, F::ReLUFuncOptions().inplace(true));` -> the result assigned to `x`,
        `inplace(false)`."""
        code = self.stmt.code
        flags = list(re.finditer(r"\.\s*inplace\s*\(\s*(true)\s*\)", code))
        if not flags:
            return None
        why = "inplace(true) writes into the input autograd saved"
        spans = [(flag.start(1), flag.end(1), "false") for flag in flags]
        match = re.match(rf"(?:(?P<lhs>{PATH})\s*=\s*)?(?P<callee>(?:::\s*)?{IDENT}"
                         rf"(?:\s*::\s*{IDENT})*)\s*\(", code)
        args = split_args(code[match.end():-1]) if match and \
            closing(code, match.end() - 1) == len(code) - 1 else []
        options = re.search(r"Options\b", match.group("callee")) if match else None
        if len(flags) != 1 or len(args) < 2 or options or "Options" not in args[-1][1] or \
                not re.fullmatch(PATH, args[0][1].strip()):
            return self._rewrite(None, why, False, [
                self._edited(spans) + "  (then use the result where the input was used)",
                ".clone() the tensor before it is passed"])
        name = re.sub(r"\s+", "", args[0][1].strip())
        lhs = re.sub(r"\s+", "", match.group("lhs") or "")
        if lhs and lhs != name:
            return self._rewrite(None, why + " (and the call's result is assigned to another "
                                 "name)", False, [
                                     self._edited(spans) + f"  (then use {lhs} where "
                                     f"{name} was used)",
                                     f"{name} = {name}.clone(); before this line"])
        return self._assign(name, spans + ([] if lhs else [(0, 0, f"{name} = ")]), why)

    def _used_result(self) -> Rewrite:
        """The op is on the line but not as a whole statement of a known shape: its result is
        used, or its receiver is an expression."""
        code = self.stmt.code
        why = f"`{self.op}` writes in place into a tensor autograd saved"
        match = re.search(rf"\.\s*{re.escape(self.op)}\s*\(", code)
        recv = code[:match.start()].strip() if match else ""
        used = re.match(rf"(?:return\b|.*[^=!<>]=[^=])", code) is not None
        if used:
            why += ", and its result is used"
        elif recv and not re.fullmatch(PATH, recv):
            root = _view_root(recv)
            if root is not None:
                return self._clone_before(root)
            why += f" through an expression ({recv})"
        return self._rewrite(None, why, False, [
            f"make {self.op} out of place"
            + ("" if self.op in _NO_TWIN else f" ({self.op[:-1]})")
            + " and use its result where the tensor was used",
            ".clone() the tensor before it is modified"])

    def _clone_before(self, name: str) -> Rewrite:
        """The write goes through a view of `name` (`name.select(...).zero_()`): `name` cloned on
        a line of its own before the statement, certain when `name` is a local variable that
        nothing else holds. The view, and the write, are then the clone's; the tensor autograd
        saved keeps its values, and the code after sees the write as before."""
        why = (f"`{self.op}` writes in place through a view of `{name}`, which autograd saved: "
               "clone it first")
        shared = None if self.parameter else self.shared(name)
        if self.parameter or shared:
            return self._rewrite(None, why + (f" ({name} {shared})" if shared else ""), False, [
                f"{name} = {name}.clone(); before this line",
                "move the write after backward() (the tensor is a leaf: a parameter)"
                if self.parameter else "write into a new tensor and use it from here on"])
        line = self.src.lines[self.line - 1]
        indent = line[:len(line) - len(line.lstrip())]
        return self._rewrite(f"{indent}{name} = {name}.clone();\n{line}", why)

    def _assign(self, name: str, spans: list, why: str) -> Rewrite:
        """The statement with `spans` applied (it assigns the out-of-place result to `name`):
        certain only when `name` is a local variable that nothing else holds."""
        new = self._edit(spans)
        if self.parameter:
            return self._rewrite(None, why, False, [
                "move the write after backward() (the tensor is a leaf: a parameter)",
                f"leave {name} as it is until backward() has run"])
        shared = self.shared(name)
        if shared:
            return self._rewrite(None, why + f" ({name} {shared})", False, [
                f"{self._edited(spans)}  (if nothing else needs to see the write)",
                ".clone() the tensor where autograd saves it (the victim's line)"])
        return self._rewrite(new, why)

    # -- Who else holds the tensor ------------------------------------------------------------

    def shared(self, name: str) -> Optional[str]:
        """Why assigning to `name` would hide the write from other code that holds the tensor
        (a member or a global, a parameter, a reference, a loop's variable, another name bound
        to it, a view), or None when `name` is a local variable of the function around the line
        that only it holds, as the source shows."""
        if not re.fullmatch(IDENT, name):
            return "is a member, which other code may hold too"
        function = self.src.function(self.stmt.start)
        if function is None:
            return "is in no function this file shows whole"
        fname, params, body = function
        for _, param in split_args(params):
            if re.search(rf"\b{name}$", re.sub(r"=.*", "", param, flags=re.S).strip()):
                return f"is an argument of {fname}(), whose caller holds it too"
        code, here = self.src.code, self.stmt.start
        scopes = self.src.enclosing(here)
        declaration = binding = None  # (offset, type), (offset, value): the last before here.
        for match in re.finditer(rf"\b{name}\b", code[body[0] + 1:body[1]]):
            at = body[0] + 1 + match.start()
            if self.stmt.start <= at <= self.stmt.end:
                continue
            stop, head, tail = self._around(at, len(name))
            line = self.src.line_of(at)
            if re.search(r"\bfor\s*\($", code[:stop + 1]) and re.match(r"\s*:", tail):
                return f"is a loop's variable (line {line}), which other code may hold too"
            if re.fullmatch(rf"(?:[\w:<>\s&*]+\s)?{IDENT}\s*=", head) and \
                    re.fullmatch(r"\s*;", tail) or \
                    not head and re.fullmatch(rf"\s*=\s*{PATH}\s*;", tail):
                return f"is bound to another name too (line {line})"
            if at > here:
                continue
            value = re.match(r"\s*(?:=(?!=)|\(|\{)(.*);$", tail, re.S)
            if head and _is_type(head):
                blocks = self.src.enclosing(at)
                if not blocks or blocks[0] in scopes:
                    declaration = (at, head)
                    binding = (at, value.group(1)) if value else None
            elif not head and value and tail.lstrip().startswith("="):
                binding = (at, value.group(1))
        if declaration is None:
            return "is not declared in this function (a member or a global), so other code " \
                   "may hold it too"
        at, kind = declaration
        if "&" in kind or "*" in kind:
            return f"is a reference (line {self.src.line_of(at)}), whose tensor other code " \
                   "holds too"
        constant = re.search(r"\b(const|static|constexpr)\b", kind)
        if constant:
            return f"is declared {constant.group(1)} (line {self.src.line_of(at)})"
        if binding is not None and re.fullmatch(PATH, binding[1].strip()):
            return f"is bound to another name too (line {self.src.line_of(binding[0])})"
        if binding is not None and _is_view(binding[1].strip()):
            return f"is a view of another tensor (line {self.src.line_of(binding[0])}), which " \
                   "the write changes too"
        return None

    def _around(self, at: int, width: int) -> tuple:
        """(the offset of the bracket or ";" before the statement that the name at `at` is in,
        that statement's code before the name, its code after the name up to its ";")."""
        code = self.src.code
        k, depth = at - 1, 0
        while k >= 0:
            c = code[k]
            if c in ")]}":
                depth += 1
            elif c in "([{":
                if depth == 0:
                    break
                depth -= 1
            elif c == ";" and depth == 0:
                break
            k -= 1
        end = code.find(";", at)
        return k, code[k + 1:at].strip(), code[at + width:end + 1 if end >= 0 else len(code)]

    # -- Moving a write after backward() ------------------------------------------------------

    def under_no_grad(self) -> Optional[list]:
        """The innermost block around the statement that declares a NoGradGuard (or
        InferenceMode, AutoGradMode false) before it, or None."""
        if self.stmt is None:
            return None
        for block in self.src.enclosing(self.stmt.start):
            if _NO_GRAD_GUARDS.search(self.src.code[block[0]:self.stmt.start]):
                return block
        return None

    def after_backward(self) -> Optional[Rewrite]:
        """The statement (or the bare `{ torch::NoGradGuard g; ... }` block around it) moved
        after the next statement of the same block that runs backward(); None when the line
        holds no statement."""
        why = "the parameter is written between the forward and backward() that uses it: " \
              "write it after backward()"
        if self.stmt is None:
            return None
        start, end = self.stmt.start, self.stmt.end
        guard = self.under_no_grad()
        if guard is not None:
            if self.src.header(guard):
                return self._rewrite(None, why, False, [
                    "move the write after backward(), with its no-grad guard"])
            start, end = guard
        first, last = self.src.line_of(start), self.src.line_of(end)
        if self.src.code[self.src.starts[first - 1]:start].strip() or \
                self.src.code_lines[last - 1][end - self.src.starts[last - 1] + 1:].strip():
            return self._rewrite(None, why, False, ["move this statement after backward()"],
                                 first, last)
        outer = self.src.enclosing(start)
        limit = outer[0][1] if outer else len(self.src.code)
        k = end + 1
        while k < limit:
            top = top_level(self.src.code[k:limit])
            stop = min((i for i in (top.find(";"), top.find("{")) if i >= 0), default=-1)
            if stop < 0:
                break
            stop += k
            if self.src.code[stop] == "{":
                stop = closing(self.src.code, stop)
                if stop < 0:
                    break
                while re.match(r"\s*(?:else|catch)\b", self.src.code[stop + 1:]):
                    opening = self.src.code.find("{", stop + 1)
                    stop = closing(self.src.code, opening) if opening >= 0 else -1
                    if stop < 0:
                        break
                if stop < 0:
                    break
            statement = self.src.code[k:stop + 1]
            if re.search(r"\.\s*backward\s*\(|\bautograd\s*::\s*(?:backward|grad)\s*\(",
                         statement):
                back = self.src.line_of(stop)
                if self.src.code_lines[back - 1][stop - self.src.starts[back - 1] + 1:].strip():
                    break
                moved = self.src.old(first, last)
                between = self.src.old(last + 1, back)
                return self._rewrite(between + moved, why, first=first, last=back)
            k = stop + 1
        return self._rewrite(None, why, False, ["move this line after the backward() call "
                                                "that runs the graph it changes"], first, last)


# Methods whose result is a view of their receiver, whatever their arguments.
_VIEW_METHODS = {"select", "narrow", "slice", "view", "view_as", "t", "transpose", "permute",
                 "diagonal", "unsqueeze", "squeeze", "expand", "expand_as", "as_strided",
                 "unfold", "real", "imag", "alias", "unflatten", "movedim", "swapaxes"}


def _view_root(recv: str) -> Optional[str]:
    """`name` when `recv` is `name` followed by one or more calls of view methods
    (`log_probs.select(-1, pad)`), else None."""
    root = re.match(rf"\s*({IDENT})", recv)
    if root is None:
        return None
    pos = root.end()
    call = re.compile(r"\s*\.\s*(\w+)\s*\(")
    while pos < len(recv.rstrip()):
        method = call.match(recv, pos)
        if method is None or method.group(1) not in _VIEW_METHODS:
            return None
        end = closing(recv, method.end() - 1)
        if end < 0:
            return None
        pos = end + 1
    return root.group(1) if pos > root.end() else None


def _is_type(head: str) -> bool:
    """Whether `head`, the code before a name in its statement, declares it (`auto`,
    `torch::Tensor`, `const auto&`)."""
    if re.match(r"(?:return|co_return|if|case|else|delete|new|throw|goto|sizeof)\b", head):
        return False
    return bool(re.fullmatch(r"[\w:<>,\s&*]*[\w>&*]", head)) and \
        (not head.endswith(">") or "<" in head)


def _is_view(value: str) -> bool:
    """Whether the expression `value` may share its memory with another tensor: another
    tensor's name, an indexing, or a chain whose last call is a view."""
    if loose(value) or not value:
        return False
    if re.fullmatch(PATH, value) or value.endswith("]"):
        return True
    if not value.endswith(")"):
        return False
    depth, k = 0, len(value) - 1
    while k >= 0:
        depth += {")": 1, "(": -1}.get(value[k], 0)
        if depth == 0:
            break
        k -= 1
    callee = re.search(rf"({IDENT})\s*(?:<[^<>]*>)?\s*$", value[:k])
    return bool(callee) and callee.group(1) in _VIEWS


# -- The module construction ------------------------------------------------------------------

def module_class(stack: list) -> Optional[str]:
    """The torch::nn module whose forward wrote in place (`ReLU` of
    torch::nn::ReLUImpl::forward), from the library frames before the user's; None when the
    write was not a module's."""
    for frame in stack or []:
        if not frame.get("framework"):
            return None
        match = re.search(r"torch::nn::(\w+)Impl::forward\b", frame.get("function") or "")
        if match and match.group(1) in _INPLACE_MODULES:
            return match.group(1)
    return None


def module_constructions(src: CppSource, name: str) -> list:
    """(line, offset of `true`) of each `.inplace(true)` on `NAMEOptions(...)` in `src` (the
    module's options, not the functional's NAMEFuncOptions)."""
    found = []
    for match in re.finditer(rf"\b{name}Options\s*(?:<[^<>;]*>)?\s*\(", src.code):
        k = closing(src.code, match.end() - 1)
        while k >= 0:
            call = re.match(rf"\s*\.\s*({IDENT})\s*\(", src.code[k + 1:])
            if call is None:
                break
            opening = k + call.end()
            k = closing(src.code, opening)
            if call.group(1) == "inplace" and k >= 0:
                flag = re.fullmatch(r"\s*true\s*", src.code[opening + 1:k])
                if flag:
                    at = opening + 1 + src.code[opening + 1:k].index("true")
                    found.append((src.line_of(at), at))
    return found


def construction_rewrite(src: CppSource, line: int, at: int, certain: bool,
                         choices=()) -> Rewrite:
    """The line with the `true` at offset `at` made `false`."""
    text = src.lines[line - 1]
    column = at - src.starts[line - 1]
    new = text[:column] + "false" + text[column + 4:]
    return Rewrite(src.path, line, line, text, new if certain else None, certain,
                   "inplace(true) makes the module write into its input, which autograd saved",
                   list(choices))


# -- A clone where the saved tensor is read (fix's victim-line rule, for C++) ----------------

def written_name(src: CppSource, line: int) -> str:
    """The variable the statement alone on `line` writes through (`x` of `x.mul_(g);`,
    `return x.mul_(w);`, `x += y;`), "" when there is none."""
    stmt, _ = statement_at(src, line)
    match = re.match(rf"\s*(?:return\s+)?({IDENT})\s*(?:\.\s*{IDENT}_\s*\(|[-+*/]=)",
                     stmt.code) if stmt else None
    return match.group(1) if match else ""


def passed_names(src: CppSource, line: int) -> list:
    """The variables that the calls of the statement alone on `line` are passed whole."""
    stmt, _ = statement_at(src, line)
    return re.findall(rf"[(,]\s*({IDENT})\s*(?=[,)])", stmt.code) if stmt else []


def clone_read_at(src: CppSource, line: int, name: str) -> Optional[Rewrite]:
    """`name` followed by `.clone()` where the statement alone on `line` reads it (a call's
    argument, an operand, a method's receiver): the op there saves a copy of the same values and
    passes the gradient back to `name`, and a later write into `name` leaves the copy alone. None
    unless `name` is there once, read: not declared, assigned, called or a member's name."""
    stmt, _ = statement_at(src, line)
    if stmt is None or not name:
        return None
    uses = list(re.finditer(rf"\b{re.escape(name)}\b", stmt.code))
    if len(uses) != 1:
        return None
    before, after = stmt.code[:uses[0].start()].rstrip(), stmt.code[uses[0].end():]
    if re.match(r"\s*(?:\(|\{|::|[-+*/%&|^]?=(?!=))", after) or \
            not re.search(r"(?:[-(,=+*/<>!?:&|{\[]|\breturn)$", before) or \
            before.endswith(("->", "::")):
        return None
    rewriter = CppRewriter(src, line, "")
    return Rewrite(src.path, line, line, src.old(line, line),
                   rewriter._edit([(uses[0].end(), uses[0].end(), ".clone()")]), True,
                   f"`{name}` is saved here and written in place afterwards where no rewrite of "
                   "that line can undo it: give the op a clone, so that what autograd saved is "
                   "not what is written")
