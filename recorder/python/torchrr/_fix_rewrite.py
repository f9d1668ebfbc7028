"""The rewrites behind ``torchrr fix``: a culprit's Python statement made out of place, found and
edited with Python's own ``ast`` so that the rest of the line (formatting, comments) survives.

Each rule returns a Rewrite: the lines it replaces and their new text, ``certain`` when the new
program computes what the old one meant without the in-place write, else the ``choices`` the user
must pick from (then no patch is proposed). Every edit is a set of spans replaced in the original
text, so nothing outside the spans changes. Standard library only: no torch.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Optional

# In-place methods whose out-of-place twin is not the name without "_", and how to write it
# (None: no single twin, the rewrite is the user's choice).
_NO_TWIN = {"zero_": "torch.zeros_like({r})", "fill_": "torch.full_like({r}, {a})",
            "copy_": None, "set_": None, "resize_": None, "resize_as_": None, "uniform_": None,
            "normal_": None, "random_": None, "bernoulli_": None, "exponential_": None,
            "geometric_": None, "cauchy_": None, "log_normal_": None}
_AUG_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
            ast.Mod: "%", ast.Pow: "**", ast.MatMult: "@", ast.BitAnd: "&", ast.BitOr: "|",
            ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>"}
# Expressions that need parentheses as the right operand of a binary operator.
_LOOSE = (ast.BinOp, ast.BoolOp, ast.Compare, ast.IfExp, ast.Lambda, ast.NamedExpr, ast.UnaryOp)


@dataclass
class Rewrite:
    """An edit of lines first_line..last_line (1-based, inclusive) of a file: ``old`` is their
    text, ``new`` what replaces it (None when not certain). ``why`` says the rule in one line."""
    file: str
    first_line: int
    last_line: int
    old: str
    new: Optional[str]
    certain: bool
    why: str
    choices: list = field(default_factory=list)


class Source:
    """A Python file's text, its parse (None when it does not parse) and each line's bytes, so
    that ast's UTF-8 column offsets address the text."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.lines = text.splitlines(keepends=True)
        try:
            self.tree: Optional[ast.Module] = ast.parse(text)
        except (SyntaxError, ValueError):
            self.tree = None
        self.parents: dict = {}
        self.imported: set = set()  # The names imports bind: modules, not tensors.
        if self.tree is not None:
            for node in ast.walk(self.tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    self.imported |= {(a.asname or a.name).split(".")[0] for a in node.names}
                for child in ast.iter_child_nodes(node):
                    self.parents[child] = node

    def segment(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text, node) or ""

    def statement_at(self, line: int) -> Optional[ast.stmt]:
        """The innermost statement spanning `line`, or None."""
        best = None
        for node in ast.walk(self.tree) if self.tree else ():
            if isinstance(node, ast.stmt) and node.lineno <= line <= (node.end_lineno or 0):
                if best is None or node.lineno >= best.lineno and self._depth(node) >= \
                        self._depth(best):
                    best = node
        return best

    def _depth(self, node: ast.AST) -> int:
        depth = 0
        while node in self.parents:
            node, depth = self.parents[node], depth + 1
        return depth

    def indent(self, line: int) -> str:
        text = self.lines[line - 1]
        return text[:len(text) - len(text.lstrip())]

    def edit(self, first: int, last: int, spans: list, before: str = "", after: str = "") -> str:
        """Lines first..last with each (line, col, end_line, end_col, text) span replaced (ast's
        byte columns), `before` prepended and `after` appended."""
        raw = [line.encode() for line in self.lines[first - 1:last]]
        for line, col, end_line, end_col, text in sorted(spans, reverse=True,
                                                         key=lambda s: (s[0], s[1])):
            head = raw[line - first][:col]
            tail = raw[end_line - first][end_col:]
            raw[line - first:end_line - first + 1] = [head + text.encode() + tail]
        return before + b"".join(raw).decode() + after

    def old(self, first: int, last: int) -> str:
        return "".join(self.lines[first - 1:last])


def keep_comment_column(old: str, new: str, code_end: int, marker: str) -> str:
    """`new`, the rewrite of line `old` whose code ends at column `code_end`: where a comment
    (from `marker` on) follows that code after two or more spaces, aligned with its neighbours'
    perhaps, the spaces before it are set to keep it in its column, two at the least. Otherwise
    `new` as it is."""
    tail = old[code_end:]
    spaced = tail.lstrip(" ")
    comment = spaced.rstrip("\n")
    body = new.rstrip("\n")
    if not spaced.startswith(marker) or len(tail) - len(spaced) < 2 or not body.endswith(comment):
        return new
    column = code_end + len(tail) - len(spaced)
    code = body[:len(body) - len(comment)].rstrip(" ")
    return code + " " * max(2, column - len(code)) + comment + new[len(body):]


def _start(node: ast.AST, text: str) -> tuple:
    return (node.lineno, node.col_offset, node.lineno, node.col_offset, text)


def _end(node: ast.AST, text: str) -> tuple:
    return (node.end_lineno, node.end_col_offset, node.end_lineno, node.end_col_offset, text)


def _attr_name_span(func: ast.Attribute, text: str) -> tuple:
    """Replaces the attribute name at the end of `func` (`mul_` of `y.mul_`)."""
    width = len(func.attr.encode())
    return (func.end_lineno, func.end_col_offset - width, func.end_lineno, func.end_col_offset,
            text)


def _keyword(call: ast.Call, name: str) -> Optional[ast.keyword]:
    return next((k for k in call.keywords if k.arg == name), None)


def _is_true(node: Optional[ast.AST]) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _calls(node: ast.AST) -> list:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def dotted(node: ast.AST) -> str:
    """`x` or `self.w`: a name, or attributes of one; "" for anything else."""
    if isinstance(node, ast.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return node.id if isinstance(node, ast.Name) else ""


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def enclosing_function(parents: dict, node: ast.AST) -> ast.AST:
    """The function or lambda `node` is in, or the outermost node above it (the module)."""
    while node in parents and not isinstance(node, _SCOPES):
        node = parents[node]
    return node


def written_through(node: ast.AST, in_place_only: bool = True) -> Optional[ast.AST]:
    """What `node` writes through: the receiver of `t.mul_()` (of any method's call when not
    `in_place_only`), the target of `t += 1`, the indexed `t` of `t[0] = 0`, the `t.data` of
    `t.data = ...`; None when it writes through nothing."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        attr = node.func.attr
        in_place = attr.endswith("_") and not attr.endswith("__")
        return node.func.value if in_place or not in_place_only else None
    if isinstance(node, ast.AugAssign):
        return node.target
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Subscript):
            return target.value
        if isinstance(target, ast.Attribute) and target.attr == "data":
            return target
    return None


def _strip_data(node: ast.AST) -> tuple:
    """(the tensor written, whether it was written through .data)."""
    if isinstance(node, ast.Attribute) and node.attr == "data":
        return node.value, True
    return node, False


class Rewriter:
    """Finds the rewrite of one culprit line: `op` is the in-place op's base name (`mul_` of
    `aten::mul_`), `parameter` whether the tensor written is a parameter (a leaf written under
    no_grad or through .data): rebinding its name would cut it from the model and the
    optimizer, so no statement rewrite is certain for it."""

    def __init__(self, source: Source, line: int, op: str, parameter: bool = False):
        self.src = source
        self.line = line
        self.op = op
        self.parameter = parameter
        self.stmt = source.statement_at(line)

    def _rewrite(self, new: Optional[str], why: str, certain: bool = True, choices=(),
                 first: Optional[int] = None, last: Optional[int] = None) -> Rewrite:
        first = first or self.stmt.lineno
        last = last or self.stmt.end_lineno
        return Rewrite(self.src.path, first, last, self.src.old(first, last),
                       new if certain else None, certain, why, list(choices))

    def _stmt_edit(self, spans: list, before: str = "") -> str:
        """The statement's lines with `spans` replaced, `before` before them, and a comment after
        the statement kept in its column."""
        new = self.src.edit(self.stmt.lineno, self.stmt.end_lineno, spans, before)
        old = self.src.lines[self.stmt.end_lineno - 1]
        code_end = len(old.encode()[:self.stmt.end_col_offset].decode(errors="replace"))
        head, _, last = new.rstrip("\n").rpartition("\n")
        last = keep_comment_column(old, last + new[len(new.rstrip("\n")):], code_end, "#")
        return head + "\n" + last if head else last

    def statement(self) -> Optional[Rewrite]:
        """The out-of-place rewrite of the statement itself, or None when no rule matches."""
        if self.stmt is None:
            return None
        for rule in (self._aug_assign, self._subscript_assign, self._data_assign,
                     self._inplace_keyword, self._method):
            rewrite = rule()
            if rewrite is not None:
                return rewrite
        return None

    def _aug_assign(self) -> Optional[Rewrite]:
        s = self.stmt
        if not isinstance(s, ast.AugAssign) or type(s.op) not in _AUG_OPS:
            return None
        if isinstance(s.target, ast.Subscript):
            return self._clone_before(s.target.value, "an indexed write")
        target = self.src.segment(s.target)
        loose = isinstance(s.value, _LOOSE)
        spans = [(s.target.end_lineno, s.target.end_col_offset, s.value.lineno,
                  s.value.col_offset, f" = {target} {_AUG_OPS[type(s.op)]} " + "(" * loose)]
        if loose:
            spans.append(_end(s.value, ")"))
        why = f"`{target} {_AUG_OPS[type(s.op)]}=` writes in place: assign the out-of-place result"
        new = self._stmt_edit(spans)
        shared = self._shared(s.target)
        if shared or not isinstance(s.target, ast.Name):
            return self._rewrite(None, why, False, [
                f"{new.strip()}, if nothing else needs to see the write"
                + (f" ({target} {shared})" if shared else ""),
                ".clone() the tensor where autograd saves it (the victim's line)"])
        return self._rewrite(new, why)

    def _clone_before(self, base: ast.AST, what: str, spans=()) -> Rewrite:
        """`name = name.clone()` on a line of its own before the statement, for a write into
        `base` (`name`, `name.data`, or a view of `name`): the write then goes into the clone,
        the tensor autograd saved keeps its values and the code after sees the write as before.
        Certain when `name` is a local that nothing else holds."""
        root = view_root(base)
        if root is not None:
            base = root
        tensor, through_data = _strip_data(base)
        name = self.src.segment(tensor)
        why = f"{what} into `{name}`, which autograd saved: clone it first"
        shared = self._shared(tensor)
        if not isinstance(tensor, ast.Name) or self.parameter or shared:
            return self._rewrite(None, why + (f" ({name} {shared})" if shared else ""), False, [
                _clone_choice(tensor, name, "the write"),
                "move the write after backward()" if self.parameter else
                "write into a new tensor and use it from here on"])
        if through_data:
            spans = [*spans, (tensor.end_lineno, tensor.end_col_offset, base.end_lineno,
                              base.end_col_offset, "")]
        before = f"{self.src.indent(self.stmt.lineno)}{name} = {name}.clone()\n"
        return self._rewrite(self._stmt_edit(list(spans), before), why)

    def _subscript_assign(self) -> Optional[Rewrite]:
        s = self.stmt
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and \
                isinstance(s.targets[0], ast.Subscript):
            return self._clone_before(s.targets[0].value, "an indexed write")
        return None

    def _data_assign(self) -> Optional[Rewrite]:
        s = self.stmt
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and
                isinstance(s.targets[0], ast.Attribute) and s.targets[0].attr == "data"):
            return None
        name = self.src.segment(s.targets[0].value)
        return self._rewrite(None, f"`{name}.data = ...` swaps the storage autograd saved",
                             False, [f"assign {name}.data after backward()",
                                     f"with torch.no_grad(): {name}.copy_(...)",
                                     f"{name} = ... (a new tensor) instead of writing .data"])

    def _inplace_keyword(self) -> Optional[Rewrite]:
        """`F.relu(x, inplace=True)` -> inplace=False, the result assigned when it was not."""
        for call in _calls(self.stmt):
            keyword = _keyword(call, "inplace")
            if keyword is None or not _is_true(keyword.value):
                continue
            spans = [(keyword.value.lineno, keyword.value.col_offset, keyword.value.end_lineno,
                      keyword.value.end_col_offset, "False")]
            why = "inplace=True writes into the input autograd saved"
            return self._assign_result(call, call.args[0] if call.args else None, spans, why)
        return None

    def _assign_result(self, call: ast.Call, tensor: Optional[ast.AST], spans: list,
                       why: str) -> Rewrite:
        """The statement with `spans` applied, its call's result assigned to `tensor` (what the
        in-place call wrote) where the program goes on to use `tensor`."""
        s = self.stmt
        written = tensor
        tensor, through_data = _strip_data(tensor) if tensor is not None else (None, False)
        name = self.src.segment(tensor) if tensor is not None else "the tensor"
        if through_data:
            spans = [*spans, (tensor.end_lineno, tensor.end_col_offset, written.end_lineno,
                              written.end_col_offset, "")]
        if self.parameter:
            return self._rewrite(None, why, False, [
                "move the write after backward() (the tensor is a leaf: a parameter)",
                f"leave {name} as it is until backward() has run"])
        whole = isinstance(s, ast.Expr) and s.value is call
        assigned = isinstance(s, ast.Assign) and s.value is call
        shared = self._shared(tensor)
        if shared:
            return self._rewrite(None, why, False, [
                f"{name} {shared}, so the in-place write is seen there: .clone() the tensor "
                "where autograd saves it (the victim's line)",
                f"return the out-of-place result and use it in place of {name} there"])
        if isinstance(tensor, ast.Name) and whole:
            return self._rewrite(self._stmt_edit([*spans, _start(call, f"{name} = ")]), why)
        if isinstance(tensor, ast.Name) and assigned:
            names = [self.src.segment(t) for t in s.targets]
            extra = [] if name in names else [_start(call, f"{name} = ")]
            return self._rewrite(self._stmt_edit([*spans, *extra]), why)
        new = self._stmt_edit(spans)
        return self._rewrite(None, why, False, [new.strip() + f"  (then use the result where "
                                                f"{name} was used)",
                                                _clone_choice(tensor, name, "this line")])

    def _shared(self, tensor: Optional[ast.AST]) -> Optional[str]:
        """Why rebinding the name `tensor` would hide the write from other code that holds the
        tensor (a parameter of the function it is in, a global, another name bound to it), or
        None when the name is the only holder that the source shows."""
        if not isinstance(tensor, ast.Name):
            return None
        scope = enclosing_function(self.src.parents, self.stmt)
        name = tensor.id
        if isinstance(scope, _SCOPES):
            args = scope.args
            params = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
            params += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
            if name in params and not self._function_forward_input(scope, name):
                return f"is an argument of {getattr(scope, 'name', 'a lambda')}(), whose " \
                       "caller holds it too"
        binding = None  # The last assignment to the name before this statement.
        for node in ast.walk(scope):
            if isinstance(node, (ast.Global, ast.Nonlocal)) and name in node.names:
                return "is global"
            if isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension, ast.withitem)):
                target = getattr(node, "target", None) or getattr(node, "optional_vars", None)
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(target)) \
                        if target is not None else False:
                    return "is a loop's or a with's variable, which other code may hold too"
            if not isinstance(node, ast.Assign):
                continue
            assigned = any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
            if isinstance(node.value, ast.Name) and (node.value.id == name or assigned):
                return f"is bound to another name too (line {node.lineno})"
            if assigned and node.lineno < self.stmt.lineno and \
                    (binding is None or node.lineno > binding.lineno):
                binding = node
        if binding is not None and _is_view(binding.value):
            return f"is a view of another tensor (line {binding.lineno}), which the write " \
                   "changes too"
        return None

    def _function_forward_input(self, scope: ast.AST, name: str) -> bool:
        """Whether `name` is an input of a torch.autograd.Function's forward that the forward
        does not mark dirty (ctx.mark_dirty): autograd's contract is then that the caller does
        not see a write into it, so rebinding the name hides nothing the caller may rely on."""
        owner = self.src.parents.get(scope)
        if not isinstance(scope, ast.FunctionDef) or scope.name != "forward" or \
                not isinstance(owner, ast.ClassDef):
            return False
        if not any((base.attr if isinstance(base, ast.Attribute) else
                    getattr(base, "id", "")) == "Function" for base in owner.bases):
            return False
        for node in ast.walk(scope):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr == "mark_dirty":
                if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node)):
                    return False
        return True

    def _method(self) -> Optional[Rewrite]:
        """`y.mul_(g)` -> `y = y.mul(g)`; `torch.relu_(x)` -> `x = torch.relu(x)`."""
        for call in _calls(self.stmt):
            func = call.func
            if not (isinstance(func, ast.Attribute) and func.attr == self.op):
                continue
            why = f"`{self.op}` writes in place into a tensor autograd saved"
            module_call = isinstance(func.value, ast.Name) and func.value.id in (
                "torch", "F", "functional", "nn") or isinstance(func.value, ast.Attribute) and \
                func.value.attr == "functional"
            if not module_call and isinstance(func.value, ast.Name) and \
                    func.value.id in self.src.imported:
                continue  # A library's function named like the op (`mylib.mul_(t)`).
            tensor = (call.args[0] if call.args else None) if module_call else func.value
            root = view_root(tensor) if tensor is not None else None
            if root is not None:
                return self._clone_before(root, f"`{self.op}` writes in place through a view")
            if self.op in _NO_TWIN:
                return self._no_twin(call, tensor, module_call, why)
            return self._assign_result(call, tensor, [_attr_name_span(func, self.op[:-1])], why)
        return None

    def _no_twin(self, call: ast.Call, tensor, module_call: bool, why: str) -> Rewrite:
        form = _NO_TWIN[self.op]
        name = self.src.segment(_strip_data(tensor)[0]) if tensor is not None else "the tensor"
        choices = [_clone_choice(_strip_data(tensor)[0] if tensor is not None else None, name,
                                 "the write")]
        if form and not module_call and isinstance(self.stmt, ast.Expr) and \
                self.stmt.value is call and isinstance(_strip_data(tensor)[0], ast.Name) and \
                not self.parameter:
            args = ", ".join(self.src.segment(a) for a in call.args)
            new = self.src.edit(self.stmt.lineno, self.stmt.end_lineno, [
                (call.lineno, call.col_offset, call.end_lineno, call.end_col_offset,
                 f"{name} = " + form.format(r=name, a=args))])
            return self._rewrite(new, why)
        return self._rewrite(None, why + " and has no out-of-place twin", False, choices)

    # -- What the statement writes, and under which mode -----------------------------------

    def written_name(self) -> str:
        """The name the statement writes through (`x` of `x.mul_(2)`, `x.data.mul_(2)`,
        `x += y`, `x[0] = 0`), or the attribute (`self.w` of `self.w.data = ...`); "" when it
        writes through neither."""
        s = self.stmt
        target = written_through(s.value if isinstance(s, ast.Expr) else s, in_place_only=False)
        if target is None:
            return ""
        return dotted(_strip_data(target)[0])

    def under_no_grad(self) -> bool:
        """Whether the statement runs inside `with torch.no_grad():` (or inference_mode)."""
        node = self.stmt
        while node is not None:
            if isinstance(node, ast.With) and any(_is_no_grad(i.context_expr)
                                                  for i in node.items):
                return True
            node = self.src.parents.get(node)
        return False


# Methods and functions whose result shares the memory of their input: a write into it is a write
# into that input, which rebinding the name would drop.
_VIEWS = {"view", "view_as", "reshape", "reshape_as", "t", "transpose", "permute", "select",
          "narrow", "expand", "expand_as", "squeeze", "unsqueeze", "flatten", "unflatten",
          "diagonal", "as_strided", "detach", "from_dlpack", "from_numpy", "split", "chunk",
          "unbind", "movedim", "moveaxis", "swapaxes", "swapdims", "real", "imag",
          "view_as_real", "view_as_complex", "unfold", "indices", "values", "contiguous",
          "to", "type_as", "float", "half", "double", "bfloat16", "cpu", "cuda", "data", "T",
          "mT", "H", "mH", "numpy", "as_tensor", "asarray"}


# The methods and attributes whose result is always a view of the tensor they are called on
# (never a copy): a write through them is a write into that tensor.
_VIEW_METHODS = {"view", "view_as", "t", "transpose", "permute", "select", "narrow", "expand",
                 "expand_as", "squeeze", "unsqueeze", "diagonal", "as_strided", "detach",
                 "movedim", "moveaxis", "swapaxes", "swapdims", "unfold", "unflatten", "real",
                 "imag", "T", "mT", "H", "mH"}


def view_root(node: ast.AST) -> Optional[ast.Name]:
    """The name `node` is a view of, when `node` is that name followed by one or more view
    methods, view attributes or indexings (`y.select(0, 1)`, `y[0].t()`), else None."""
    steps = 0
    while True:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr in _VIEW_METHODS and not node.keywords:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in _VIEW_METHODS:
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            break
        steps += 1
    return node if steps > 0 and isinstance(node, ast.Name) else None


def _clone_choice(tensor: Optional[ast.AST], name: str, before: str) -> str:
    """The choice of cloning the tensor written before `before`: `name = name.clone()` where
    `name` can be assigned to (a name, an attribute, an indexing without calls), else the clone
    where autograd saves it."""
    node = tensor
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    if isinstance(node, ast.Name):
        return f"{name} = {name}.clone() before {before}"
    return ".clone() the tensor where autograd saves it (the victim's line)"


def _is_view(value: ast.AST) -> bool:
    """Whether `value` may share its memory with another tensor (a view, an alias, an indexing,
    a conversion that returns its input when nothing changes)."""
    if isinstance(value, ast.Subscript):
        return True
    if isinstance(value, ast.Attribute):
        return value.attr in _VIEWS
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in _VIEWS
    return False


def _own_lines(src: Source, node: ast.stmt) -> bool:
    """Whether `node` alone fills its lines (nothing before it on its first line, nothing but a
    comment after it on its last)."""
    head = src.lines[node.lineno - 1].encode()[:node.col_offset]
    tail = src.lines[node.end_lineno - 1].encode()[node.end_col_offset:].strip()
    return not head.strip() and (not tail or tail.startswith(b"#"))


def _is_no_grad(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in ("no_grad", "inference_mode")
