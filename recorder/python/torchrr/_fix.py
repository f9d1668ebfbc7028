"""``torchrr fix TRACE``: a patch for each culprit line of a replay, as a unified diff against the
recorded source (``--json``: the edits as data), for culprit lines of Python and of C++
(_fix_cpp.py); ``--check`` proves it by re-running the recorded
command on patched copies (_fix_check.py), ``--apply`` then writes it.

The ``torchrr fix`` verb (replayer/cli/fix_command.cc) runs this module with ``python3 -m
torchrr._fix``, because the rewrites need Python's own parser; the verb passes the CLI's path
(TORCHRR_CLI), its exit codes (TORCHRR_FIX_EXIT_CODES, from exit_codes.h) and its options
(TORCHRR_FIX_OPTIONS, as JSON: the verb's table declares them). It reads the
trace only through that CLI (``replay --json``, ``dump --json``, ``info --json``). Standard
library only: importing it imports no torch.
"""
from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from dataclasses import asdict
from typing import Optional

from . import _fix_backward as fb
from . import _fix_cpp as cpp
from . import _fix_made as made
from . import _fix_other_lines as ol
from . import _fix_rewrite as rw
from . import _fix_stash as st

# exit_codes.h's, passed by the verb; these defaults are the same numbers.
_DEFAULT_CODES = {"ok": 0, "violations": 1, "usage": 2, "other": 7, "no_fix": 1,
                  "not_rerun": 11}


def exit_codes() -> dict:
    codes = dict(_DEFAULT_CODES)
    for item in os.environ.get("TORCHRR_FIX_EXIT_CODES", "").split(","):
        name, _, value = item.partition("=")
        if name in codes and value.isdigit():
            codes[name] = int(value)
    return codes


def cli_path() -> str:
    env = os.environ.get("TORCHRR_CLI")
    if env:
        return env
    from . import _native
    return str(_native.cli_path())


class TraceUnreadable(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([cli_path(), *args], capture_output=True, text=True)


def replay_json(trace: str) -> tuple:
    """(the replay JSON document, replay's exit code); raises TraceUnreadable with its code and
    last error line when replay wrote no report."""
    proc = run_cli("replay", "--json", trace)
    try:
        document = json.loads(proc.stdout)
    except json.JSONDecodeError:
        document = None
    if not isinstance(document, dict) or "violations" not in document:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise TraceUnreadable(proc.returncode or 7,
                              lines[-1] if lines else f"{trace}: no report")
    return document, proc.returncode


class RecordedSources:
    """The source lines a trace carries (format 1.4), by file and line number."""

    def __init__(self, trace: str):
        self.trace = trace
        self._ops = None
        strings, self.lines = {}, {}
        proc = run_cli("dump", "--json", trace)
        for text in proc.stdout.splitlines():
            if '"kind":"string"' not in text and '"kind":"source_lines"' not in text:
                continue
            record = json.loads(text)
            if record["kind"] == "string":
                strings[record["id"]] = record["text"]
            elif record["kind"] == "source_lines":
                lines = self.lines.setdefault(record["file"], {})
                for number, line in enumerate(record["text"], record["first_line"]):
                    lines[number] = line
        self.lines = {strings.get(k, ""): v for k, v in self.lines.items()}

    def ops(self) -> "made.TraceOps":
        """The trace's op records, read again when a rule first needs them."""
        if self._ops is None:
            self._ops = made.TraceOps(run_cli("dump", "--json", self.trace).stdout)
        return self._ops


class Workspace:
    """The text each patch is made against: the local file when the lines the trace carries read
    there as recorded; else the local file, trusted only at lines that read as the trace recorded
    them; else the recorded lines alone. Notes say which."""

    def __init__(self, recorded: RecordedSources):
        self.recorded = recorded
        self.sources: dict = {}
        self.notes: list = []
        self.changed: set = set()

    def source(self, path: str):
        """The rw.Source (a cpp.CppSource for a C++ file) of `path`, or None."""
        if path in self.sources:
            return self.sources[path]
        source = None
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            data = None
        kind = cpp.CppSource if cpp.is_cpp(path) else rw.Source
        if data is not None:
            source = kind(path, data.decode("utf-8", "replace"))
            # Whether the file was edited since the recording, as far as the lines the trace
            # carries (those around its frames, the ones a patch touches) tell; the trace's
            # XXH64 of the whole file would need a hash the standard library lacks.
            kept = self.recorded.lines.get(path, {})
            local = [text.rstrip("\r\n") for text in source.lines]
            if any(n > len(local) or local[n - 1] != text for n, text in kept.items()):
                self.changed.add(path)
                self.notes.append(f"{path} changed since it was recorded: the patch is against "
                                  "the file as it is now, where its lines read as recorded")
        elif path in self.recorded.lines:
            kept = self.recorded.lines[path]
            text = "".join(kept.get(n, "") + "\n" for n in range(1, max(kept) + 1))
            source = kind(path, text)
            self.notes.append(f"{path} is not on this machine: the patch is against the lines "
                              "the trace recorded")
        self.sources[path] = source
        return source

    def locate(self, path: str, line: int) -> Optional[int]:
        """Where the recorded `line` of `path` is in the local file: `line` itself when the file
        is the recorded one or that line reads as recorded, else the one local line that reads
        as it did (lines added or removed above it); None when no line or several do."""
        if path not in self.changed:
            return line
        recorded = self.recorded.lines.get(path, {}).get(line)
        if recorded is None:
            return None
        local = [text.rstrip("\r\n") for text in self.sources[path].lines]
        if line <= len(local) and local[line - 1] == recorded:
            return line
        matches = [n for n, text in enumerate(local, 1) if text == recorded]
        if len(matches) != 1:
            return None
        note = f"{path}:{line} as recorded is line {matches[0]} now"
        if note not in self.notes:
            self.notes.append(note)
        return matches[0]


def _base_op(op: Optional[str]) -> str:
    return (op or "").split("::")[-1].split(".")[0]


def _python_user_frame(op: dict) -> Optional[dict]:
    frame = op.get("user_frame")
    if not frame or not frame.get("file") or not frame.get("line"):
        return None
    for entry in op.get("stack") or []:
        if entry.get("file") == frame["file"] and entry.get("line") == frame["line"]:
            return frame if entry.get("python") else None
    return frame if frame["file"].endswith(".py") else None


def _uncertain(path: str, line: int, source: Optional[rw.Source], why: str,
               choices: list) -> rw.Rewrite:
    old = source.old(line, line) if source and 0 < line <= len(source.lines) else ""
    return rw.Rewrite(path, line, line, old, None, False, why, choices)


def _user_files(document: dict) -> list:
    files = []
    for v in document.get("violations", []):
        for role in ("culprit", "victim", "changed_source"):
            for frame in (v.get(role) or {}).get("stack") or []:
                if frame.get("python") and not frame.get("framework") and frame.get("file") \
                        and frame["file"] not in files:
                    files.append(frame["file"])
    return files


def _beside(files: list, wanted) -> list:
    """`files` and the files beside them (the first 500 of each directory) whose name is
    `wanted`, each once."""
    out = list(files)
    for directory in sorted({os.path.dirname(f) for f in files}):
        try:
            names = sorted(os.listdir(directory))[:500]
        except OSError:
            continue
        out += [os.path.join(directory, n) for n in names
                if wanted(n) and os.path.join(directory, n) not in out]
    return out


def _module_fix(space: Workspace, document: dict, culprit: dict, op: str) -> Optional[rw.Rewrite]:
    """The construction of the nn.Module whose forward wrote in place (nn.ReLU(inplace=True)),
    found in the user's files and those beside them."""
    stack = culprit.get("stack") or []
    # The module's own forward wrote (torch's code is innermost), not a line of the user's.
    if not stack or "/torch/nn/" not in (stack[0].get("file") or ""):
        return None
    classes = ol.module_classes(culprit.get("module"), op)
    if not classes:
        return None
    found = []
    for path in _beside(_user_files(document), lambda name: name.endswith(".py")):
        source = space.source(path)
        if source is not None:
            found += [(source, *match) for match in ol.module_constructions(source, classes)]
    path = culprit.get("module") or ""
    attr = path.split(" ")[0].split(".")[-1] if path else None
    named = [f for f in found if attr and f[2] == attr]
    if len(found) == 1 or len(named) == 1:
        source, node, _, flag = named[0] if len(named) == 1 else found[0]
        return ol.construction_rewrite(source, node, flag, True)
    if not found:
        return None
    choices = [f"{s.path}:{n.lineno}: {s.segment(n)} -> inplace=False" for s, n, _, _ in found]
    source, node, _, flag = found[0]
    return ol.construction_rewrite(source, node, flag, False, choices)


def fix_for(space: Workspace, document: dict, v: dict) -> rw.Rewrite:
    """The rewrite for violation `v` (a replay JSON violation)."""
    culprit = v.get("changed_source") or v.get("culprit")
    kind = v.get("kind")
    if culprit is None or culprit.get("hook"):
        frame = (culprit or v.get("victim") or {}).get("user_frame") or {}
        hook = kind == "unpack_hook" or (culprit or {}).get("hook") or \
            v.get("evidence") == "unpack_hook"
        choices = ["make the unpack hook return a tensor of the saved one's shape, dtype and "
                   "device (cast back what the pack hook converted)"] if hook else \
            ["find what writes into the saved tensor's memory outside autograd (numpy, DLPack, "
             "an extension) and write into a .clone() instead"]
        rewrite = ol.fix_hooks(space, v) if hook else ol.clone_output_at_victim(space, v)
        if rewrite is not None:
            return rewrite
        return _uncertain(frame.get("file") or "", frame.get("line") or 0, None,
                          f"no in-place op to rewrite ({kind})", choices)
    # A tensor a Function kept on its ctx: the Function's forward keeps a clone.
    stash = st.stash_fix(space, v)
    if stash is not None:
        return stash
    frame = _python_user_frame(culprit)
    if frame is None:
        frame = culprit.get("user_frame") or {}
        if not cpp.is_cpp(frame.get("file") or "") or not frame.get("line"):
            return _uncertain(frame.get("file") or "", frame.get("line") or 0, None,
                              "the culprit's line is neither Python nor C++: no rewrite",
                              ["make the op out of place, or .clone() the tensor before it"])
    path = frame["file"]
    source = space.source(path)
    line = space.locate(path, frame["line"]) if source is not None else None
    is_cpp = cpp.is_cpp(path)
    if source is None or source.tree is None and not is_cpp or line is None:
        return _uncertain(path, frame["line"], source,
                          "the source of this line is not here as recorded",
                          ["make the op out of place, or .clone() the tensor before it"])
    if kind == "freed":
        flag = "true" if is_cpp else "True"
        return (None if is_cpp else fb.retain_graph(source, line)) or \
            _uncertain(path, line, source, "backward ran twice through a freed graph",
                       [f"pass retain_graph={flag} to the first backward()",
                        "run the forward again before the second backward()"])
    op = _base_op(culprit.get("op"))
    leaf = bool((v.get("tensor") or {}).get("is_leaf"))
    if is_cpp:
        return _cpp_fix(space, document, v, culprit, source, line, op, leaf)
    rewriter = rw.Rewriter(source, line, op)
    optimizer = any("/torch/optim/" in (f.get("file") or "") for f in culprit.get("stack") or [])
    text = source.old(rewriter.stmt.lineno, rewriter.stmt.end_lineno) if rewriter.stmt else ""
    # A leaf that requires grad can only be written under no_grad or through .data (PyTorch
    # refuses the rest); a leaf that does not (an input) may be rebound.
    rewriter.parameter = leaf and (".data" in text or rewriter.under_no_grad())
    # Only a parameter's write moves after backward(): an activation written under no_grad is
    # one the forward meant to change (a clamp, a scale), and a later write would change what
    # the loss computed.
    # A write that cannot move (a parameter rescaled inside forward) may still be undone by a
    # clone at the victim's line; the move's choices are kept for when nothing is certain.
    moved = None
    if v.get("changed_source") or optimizer or rewriter.parameter:
        moved = fb.after_backward(rewriter)
        if moved is not None and moved.certain:
            return moved
    if rewriter.under_no_grad():
        # Made out of place under no_grad, the tensor would lose its history and backward through
        # it would fail: the write stays, into a clone made where the saved tensor is.
        return ol.clone_output_at_victim(space, v) or \
            ol.clone_named_input_at_victim(space, v, rewriter.written_name()) or moved or \
            _uncertain(path, line, source, _NO_GRAD_WHY, _NO_GRAD_CHOICES)
    rewrite = rewriter.statement()
    if rewrite is None or not rewrite.certain:
        rewrite = _module_fix(space, document, culprit, op) or rewrite
    if rewrite is None or not rewrite.certain:
        rewrite = ol.clone_output_at_victim(space, v) or \
            ol.clone_passed_at_victim(space, v, culprit) or \
            made.clone_where_made(space, v, space.recorded.ops()) or moved or rewrite
    return rewrite or _uncertain(path, line, source, f"no known rewrite of this line for {op}",
                                 [f"make {op} out of place", ".clone() the tensor before it is "
                                  "modified"])


# An activation written under no_grad: out of place it would lose its autograd history, and
# moving the write would change what the loss computed.
_NO_GRAD_WHY = "the write runs under no_grad: made out of place, the tensor would lose its " \
               "autograd history"
_NO_GRAD_CHOICES = ["clone the tensor where it is made, before autograd saves it, so that the "
                    "write leaves the saved one alone",
                    "move the write after backward() if the loss should not see it"]


def _cpp_fix(space: Workspace, document: dict, v: dict, culprit: dict,
             source: "cpp.CppSource", line: int, op: str, leaf: bool) -> rw.Rewrite:
    """The rewrite for violation `v` whose culprit's `line` is C++ (`op` the in-place op's base
    name, `leaf` whether the tensor written is a leaf): the rules of fix_for, in _fix_cpp's
    terms."""
    path = source.path
    rewriter = cpp.CppRewriter(source, line, op)
    optimizer = any((f.get("function") or "").startswith("torch::optim::")
                    for f in culprit.get("stack") or [])
    text = source.code_lines[line - 1] if line <= len(source.code_lines) else ""
    no_grad = rewriter.under_no_grad() is not None
    # As for Python: a leaf that requires grad is written only under a no-grad guard or
    # through .data(); one that does not (an input) may be rebound.
    rewriter.parameter = leaf and (".data()" in text or no_grad)
    if v.get("changed_source") or optimizer or rewriter.parameter:
        moved = rewriter.after_backward()
        if moved is not None:
            return moved
    if no_grad:
        return _uncertain(path, line, source, _NO_GRAD_WHY, _NO_GRAD_CHOICES)
    rewrite = rewriter.statement()
    if rewrite is None or not rewrite.certain:
        rewrite = _cpp_module_fix(space, document, culprit) or rewrite
    if rewrite is None or not rewrite.certain:
        rewrite = ol.cpp_clone_at_victim(space, v, culprit) or \
            made.clone_where_made(space, v, space.recorded.ops()) or rewrite
    return rewrite or _uncertain(path, line, source, f"no known rewrite of this line for {op}",
                                 [f"make {op} out of place", ".clone() the tensor before it is "
                                  "modified"])


def _cpp_module_fix(space: Workspace, document: dict, culprit: dict) -> Optional[rw.Rewrite]:
    """The `.inplace(true)` in the options of the torch::nn module whose forward wrote in place,
    found in the user's C++ files and those beside them."""
    name = cpp.module_class(culprit.get("stack"))
    if name is None:
        return None
    files = []
    for v in document.get("violations", []):
        for role in ("culprit", "victim", "changed_source"):
            for f in (v.get(role) or {}).get("stack") or []:
                if not f.get("framework") and cpp.is_cpp(f.get("file") or "") and \
                        f["file"] not in files:
                    files.append(f["file"])
    found = []
    for path in _beside(files, cpp.is_cpp):
        source = space.source(path)
        if source is not None:
            found += [(source, *match) for match in cpp.module_constructions(source, name)]
    if not found:
        return None
    if len(found) == 1:
        return cpp.construction_rewrite(*found[0], True)
    choices = [f"{s.path}:{line}: {s.lines[line - 1].strip()} -> inplace(false)"
               for s, line, _ in found]
    return cpp.construction_rewrite(*found[0], False, choices)


def plan(space: Workspace, document: dict) -> list:
    """One fix per distinct culprit line: [{"rewrite": Rewrite, "violations": [indices]}], in the
    order of their files and lines."""
    fixes: dict = {}
    for index, v in enumerate(document.get("violations", [])):
        rewrite = fix_for(space, document, v)
        key = (rewrite.file, rewrite.first_line, rewrite.last_line, rewrite.new)
        fixes.setdefault(key, {"rewrite": rewrite, "violations": []})["violations"].append(index)
    return sorted(fixes.values(), key=lambda f: (f["rewrite"].file, f["rewrite"].first_line))


def patched_texts(space: Workspace, fixes: list) -> dict:
    """{path: the file's text with every certain edit applied}; overlapping edits keep the
    first."""
    by_file: dict = {}
    for fix in fixes:
        r = fix["rewrite"]
        if r.certain:
            by_file.setdefault(r.file, []).append(r)
    texts = {}
    for path, rewrites in by_file.items():
        lines = list(space.sources[path].lines)
        taken: list = []
        for r in sorted(rewrites, key=lambda r: r.first_line):
            if any(r.first_line <= last and first <= r.last_line for first, last in taken):
                continue
            taken.append((r.first_line, r.last_line))
        for first, last in sorted(taken, reverse=True):
            r = next(r for r in rewrites if (r.first_line, r.last_line) == (first, last))
            lines[first - 1:last] = r.new.splitlines(keepends=True)
        texts[path] = "".join(lines)
    return texts


def _diff_name(path: str) -> str:
    """`path` as `patch -p1` finds it from the working directory."""
    here = os.getcwd()
    if os.path.commonpath([here, path]) == here:
        return os.path.relpath(path, here)
    return path.lstrip("/")


def unified_diff(space: Workspace, texts: dict) -> str:
    out = []
    for path, text in texts.items():
        name = _diff_name(path)
        out += difflib.unified_diff(space.sources[path].lines, text.splitlines(keepends=True),
                                    f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
                   for line in out)


def describe(fixes: list) -> list:
    """One block of text per fix: which violations, where, why, and the choices when it is not
    certain."""
    lines = []
    for fix in fixes:
        r = fix["rewrite"]
        which = ", ".join(str(i) for i in fix["violations"])
        label = "violation" if len(fix["violations"]) == 1 else "violations"
        where = f"{os.path.normpath(r.file)}:{r.first_line}" if r.file else "(no line)"
        if r.certain:
            lines.append(f"{label} {which}: {where}: {r.why}")
        else:
            lines.append(f"{label} {which}: {where}: not certain: {r.why}; choose:")
            lines += [f"  - {choice}" for choice in r.choices]
    return lines


def as_json(fixes: list, notes: list, diff: str) -> dict:
    """`fix --json`'s document: {"edits": [...], "notes": [...], "diff": "..."}. Each edit is one
    culprit line's fix: `file`, `first_line` and `last_line` (1-based, inclusive: the lines it
    replaces), `old` (their text), `new` (what replaces them; null when not certain), `certain`,
    `why` (one line), `choices` (what the user must pick from when not certain) and `violations`
    (indices into the replay JSON's "violations"). `notes` say where the source differs from the
    recorded one; `diff` is the unified diff of the certain edits. With --check, "check" holds
    its exit code and the lines the text output would print."""
    edits = []
    for fix in fixes:
        edit = asdict(fix["rewrite"])
        edit["violations"] = fix["violations"]
        edits.append(edit)
    return {"edits": edits, "notes": notes, "diff": diff}


def options(argv: list) -> argparse.Namespace:
    """The trace (the one argument) and the verb's options (TORCHRR_FIX_OPTIONS, JSON: json,
    check, apply, timeout, steps), which fix_command.cc declares and checks."""
    if len(argv) != 1 or "TORCHRR_FIX_OPTIONS" not in os.environ:
        raise SystemExit("torchrr._fix is run by `torchrr fix TRACE`")
    return argparse.Namespace(trace=argv[0], **json.loads(os.environ["TORCHRR_FIX_OPTIONS"]))


def unpatched_verdicts(document: dict) -> list:
    """What the replay found that fix has no rewrite for: the first NaN or Inf, one line with its
    place and help; [] when there is none."""
    n = document.get("non_finite")
    if not n:
        return []
    op = n.get("op") or {}
    forward = n.get("forward") if n.get("backward") else None
    name = op.get("op", "?") + (f" (the backward of {forward.get('op')})" if forward else "")
    frame = (forward or op).get("user_frame") or {}
    where = f" at {frame.get('file')}:{frame.get('line')}" if frame.get("file") else ""
    what = "a NaN" if n.get("nan") else "an Inf"
    return [f"torchrr: {what} reached {n.get('reached')}, first made by {name}{where} "
            f"({n.get('cause')}): no certain patch; {n.get('help')}"]


def main(argv: Optional[list] = None) -> int:
    codes = exit_codes()
    args = options(sys.argv[1:] if argv is None else argv)
    try:
        document, _ = replay_json(args.trace)
    except TraceUnreadable as error:
        message = str(error)  # replay's own line when it wrote one ("torchrr: error: ...").
        sys.stderr.write((message if message.startswith("torchrr:") else
                          f"torchrr: error: {message}") + "\n")
        return error.code
    space = Workspace(RecordedSources(args.trace))
    fixes = plan(space, document)
    texts = patched_texts(space, fixes)
    diff = unified_diff(space, texts)
    # A verdict fix has no rewrite for is no clean bill: it is said, and the exit is no_fix.
    unpatched = [] if fixes else unpatched_verdicts(document)
    all_certain = all(f["rewrite"].certain for f in fixes) and not unpatched
    if not args.json:
        for note in space.notes:
            print(f"note: {note}")
        for line in unpatched:
            print(line)
        if not fixes and not unpatched:
            print(f"torchrr: no violation in {args.trace}: nothing to fix")
        for line in describe(fixes):
            print(line)
        sys.stdout.write(diff)
    code = codes["ok"] if all_certain else codes["no_fix"]
    checked: list = []
    if args.check or args.apply:
        from ._fix_check import check
        sys.stdout.flush()
        code = check(args, document, space, texts, codes, all_certain,
                     checked.append if args.json else print)
        if unpatched and code == codes["ok"]:
            code = codes["no_fix"]
    if args.json:
        document = as_json(fixes, space.notes + unpatched, diff)
        if args.check or args.apply:
            document["check"] = {"exit_code": code, "lines": checked}
        print(json.dumps(document, indent=2))
    return code


def _main_to_a_pipe() -> int:
    """main(), for a reader that may stop early (`torchrr fix run.trr | head`): what it read is
    all it wanted, so no traceback, and the status a C++ verb has when SIGPIPE ends it."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit: it goes nowhere now, instead of failing again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13


if __name__ == "__main__":
    sys.exit(_main_to_a_pipe())
