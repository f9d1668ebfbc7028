"""Reading C++ text for ``torchrr fix`` (_fix_cpp.py) without a C++ parser: the text with
comments and literals blanked so that offsets in it address the text, its brackets and brace
blocks, the function around an offset, and the one statement alone on a line. Standard library
only.
"""
from __future__ import annotations

import re
from typing import Optional

CPP_EXTENSIONS = (".cc", ".cpp", ".cxx", ".c++", ".cu", ".h", ".hh", ".hpp", ".hxx", ".cuh")
# What str.splitlines() breaks lines at: kept by the blanking so that lines stay aligned.
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
IDENT = r"[A-Za-z_]\w*"
# A tensor named by a variable or a member path (`x`, `a.b`, `this->w_`): no call, no index.
PATH = rf"{IDENT}(?:\s*(?:\.|->)\s*{IDENT})*"
_CONTROL = ("if", "for", "while", "switch", "catch")


def is_cpp(path: str) -> bool:
    return path.lower().endswith(CPP_EXTENSIONS)


def _blank(text: str) -> str:
    """`text` with every comment and the inside of every string and character literal replaced
    by spaces (line breaks kept), so that offsets in it address `text`."""
    out = list(text)
    i, n = 0, len(text)

    def clear(start: int, end: int) -> None:
        for k in range(start, min(end, n)):
            if text[k] not in _LINE_BREAKS:
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = i
            while end < n and text[end] not in "\r\n":
                end += 2 if text.startswith("\\\n", end) else 1
            clear(i, end)
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            clear(i, end)
            i = end
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not text[i - 1].isalnum()):
            match = re.match(r'R"([^()\\\s]{0,16})\(', text[i:])
            if match is None:
                i += 1
                continue
            close = text.find(")" + match.group(1) + '"', i + match.end())
            end = n if close < 0 else close + len(match.group(1)) + 2
            clear(i + 2, end - 1)
            i = end
        elif c == '"' or c == "'" and not (i and text[i - 1].isalnum() and i + 1 < n and
                                          text[i + 1].isalnum()):  # Not a digit separator.
            end = i + 1
            while end < n and text[end] != c and text[end] != "\n":
                end += 2 if text[end] == "\\" else 1
            clear(i + 1, end)
            i = end + 1
        else:
            i += 1
    return "".join(out)


def closing(code: str, start: int) -> int:
    """The offset of the bracket that closes the one at `start` in `code`, or -1."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = []
    for k in range(start, len(code)):
        c = code[k]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if not stack or stack.pop() != c:
                return -1
            if not stack:
                return k
    return -1


def top_level(code: str) -> str:
    """`code` with everything inside brackets replaced by spaces."""
    out, depth = [], 0
    for c in code:
        if c in ")]}":
            depth -= 1
        out.append(c if depth <= 0 else " ")
        if c in "([{":
            depth += 1
    return "".join(out)


def split_args(code: str) -> list:
    """The top-level comma-separated parts of `code` (an argument list), as (start, text)."""
    parts, start = [], 0
    top = top_level(code)
    for k, c in enumerate(top + ","):
        if c == ",":
            parts.append((start, code[start:k]))
            start = k + 1
    return parts


def loose(code: str) -> bool:
    """Whether an expression needs parentheses as an operand of a binary operator: it has an
    operator outside brackets (`a + b`, `-a`, `c ? a : b`; `a.b`, `a->b`, `a::b` are not)."""
    top = top_level(code).replace("->", "  ").replace("::", "  ")
    return bool(re.search(r"[-+*/%<>=&|^?!~,]", top))


class CppSource:
    """A C++ file's text, the same text with comments and literals blanked (`code`), its lines,
    and its brace blocks, so that a line's statement and the function around it can be found."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.lines = text.splitlines(keepends=True)
        self.code = _blank(text)
        self.code_lines = self.code.splitlines(keepends=True)
        self.tree = None  # No Python parse: the Python rules never apply.
        self.starts = []  # Offset of each line's first character.
        offset = 0
        for line in self.lines:
            self.starts.append(offset)
            offset += len(line)
        self.blocks = []  # (offset of "{", offset of its "}"), in order of the "{".
        stack = []
        for k, c in enumerate(self.code):
            if c == "{":
                stack.append(len(self.blocks))
                self.blocks.append([k, len(self.code)])
            elif c == "}" and stack:
                self.blocks[stack.pop()][1] = k

    def old(self, first: int, last: int) -> str:
        return "".join(self.lines[first - 1:last])

    def line_of(self, offset: int) -> int:
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1

    def enclosing(self, offset: int) -> list:
        """The blocks around `offset`, innermost first."""
        return sorted((b for b in self.blocks if b[0] < offset <= b[1]), key=lambda b: -b[0])

    def header(self, block: list) -> str:
        """The code before a block's "{" back to the end of the statement before it
        (`void f(int x) const`, `if (c)`, `[&](auto t)`), stripped."""
        start = block[0]
        k = start - 1
        depth = 0
        while k >= 0:
            c = self.code[k]
            if c in ")]":
                depth += 1
            elif c in "([":
                depth -= 1
            elif depth == 0 and c in ";{}":
                break
            k -= 1
        return self.code[k + 1:start].strip()

    def function(self, offset: int) -> Optional[tuple]:
        """(the function's or lambda's name, its parameter list's code, its body block) of the
        innermost function around `offset`, or None."""
        for block in self.enclosing(offset):
            head = self.header(block)
            head = re.sub(r"(?:\s*(?:\b(?:const|override|final|noexcept|mutable)\b|&&|&))*$", "",
                          head)
            head = re.sub(r"\s*->\s*[\w:<>\s,*&]+$", "", head)
            if not head.endswith(")"):
                continue
            end = len(head) - 1
            depth, k = 0, end
            while k >= 0:
                depth += {")": 1, "(": -1}.get(head[k], 0)
                if depth == 0:
                    break
                k -= 1
            before = head[:k].rstrip()
            name = re.search(r"(~?[\w:]+|\])\s*$", before)
            name = name.group(1) if name else ""
            if name.split("::")[-1] in _CONTROL:
                continue
            return ("a lambda" if name == "]" else name), head[k + 1:end], block
        return None


class Statement:
    """The one statement alone on a line: its code and text, and where it starts and ends."""

    def __init__(self, src: CppSource, line: int, start: int, end: int):
        self.src = src
        self.line = line
        self.start = start  # Offset in the file of its first character.
        self.end = end  # Offset of its ";".
        self.code = src.code[start:end]


def statement_at(src: CppSource, line: int) -> tuple:
    """(the Statement alone on `line`, None) or (None, why there is none that a rewrite may
    touch: a macro, a statement over several lines, several statements)."""
    if not 0 < line <= len(src.code_lines):
        return None, "the line is not in the file"
    code = src.code_lines[line - 1]
    if line > 1 and src.lines[line - 2].rstrip("\r\n").endswith("\\") or \
            code.lstrip().startswith("#"):
        return None, "the line is part of a macro"
    body = code.rstrip()
    stripped = body.strip()
    top = top_level(stripped)
    if not stripped.endswith(";") or "{" in top or "}" in top or \
            re.match(r"(?:if|for|while|do|else|switch|case)\b", stripped):
        return None, "the line holds no statement alone (several lines, a block, a condition)"
    if top.count(";") > 1:
        return None, "the line holds several statements"
    # The statement starts on this line when the line before ends another (or opens a block).
    k = line - 1
    while k > 0 and not src.code_lines[k - 1].strip():
        k -= 1
    before = src.code_lines[k - 1].strip() if k > 0 else ""
    if before and not (before[-1] in ";{}" or before.startswith("#") or
                       re.fullmatch(rf"(?:case\b.*|default|public|private|protected|{IDENT})"
                                    r"\s*:", before) or
                       re.match(r"(?:\}\s*)?(?:else\s+)?(?:if|for|while)\b", before) and
                       before.endswith(")") or re.fullmatch(r"(?:\}\s*)?else", before)):
        return None, "the statement spreads over several lines"
    if re.search(r"\b[A-Z][A-Z0-9_]{2,}\s*\(", stripped):
        return None, "the statement is a macro's (an upper-case call)"
    start = src.starts[line - 1] + len(code) - len(code.lstrip())
    return Statement(src, line, start, src.starts[line - 1] + len(body) - 1), ""
