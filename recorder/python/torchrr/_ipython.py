"""The ``%%torchrr`` cell magic (``%load_ext torchrr``): records a notebook cell and shows the
verdict below it.

    %load_ext torchrr

    %%torchrr                      # the trace: torchrr-cell-N.trr for the cell In[N]
    loss = model(batch).sum()
    loss.backward()

    %%torchrr step.trr --verify-saved --keep-last 2

The cell runs in the notebook's namespace, as without the magic, inside torchrr.record(); then
the trace's Report is displayed (the report page inline in a notebook, the text report in a
terminal), and an exception the cell raised is raised again, its traceback kept. Line numbers in
the verdict are the cell's own, counting the ``%%torchrr`` line as 1. This module is the only one
that imports IPython, and only when the extension is loaded.
"""
from __future__ import annotations

import ast
import linecache
import os
import sys
import tempfile

from . import _recording, _report

_USAGE = """%%torchrr [PATH] [--verify-saved] [--all-ops] [--native-stacks] [--keep-last N]
          [--steps A:B] [--force] [--quiet]

Records the cell's tensor ops into PATH (default torchrr-cell-N.trr in the working directory for
the cell In[N]), runs the cell, then shows torchrr's verdict below it. The options
are torchrr.record()'s keywords (docs/recorder.md): --verify-saved, --all-ops, --native-stacks
(switches), --keep-last N, --steps A:B (0-based, inclusive; A: to the end), --force (replace a
file at PATH that is not a trace). --quiet shows the verdict only when it is not clean."""


def _parse(line: str, default_path: str):
    """The magic's line as (path, record() keywords, quiet). Raises UsageError for a bad one."""
    import argparse
    import shlex

    from IPython.core.error import UsageError

    class Parser(argparse.ArgumentParser):
        def error(self, message):
            raise UsageError(f"%%torchrr: {message}\n\n{_USAGE}")

    parser = Parser(prog="%%torchrr", add_help=False)
    parser.add_argument("path", nargs="?", default=default_path)
    for switch in ("--verify-saved", "--all-ops", "--native-stacks", "--force", "--quiet"):
        parser.add_argument(switch, action="store_true")
    parser.add_argument("--keep-last", type=int)
    parser.add_argument("--steps")
    args = parser.parse_args(shlex.split(line))
    options = {"verify_saved": args.verify_saved or None, "all_ops": args.all_ops or None,
               "native_stacks": args.native_stacks or None, "force": args.force or None,
               "keep_last": args.keep_last}
    if args.steps is not None:
        first, colon, last = args.steps.partition(":")
        try:
            options["steps"] = (int(first) if first else None, int(last) if last else None)
        except ValueError:
            colon = ""
        if not colon:
            raise UsageError(f"%%torchrr: --steps {args.steps}: expected A:B, A: or :B")
    return args.path, {k: v for k, v in options.items() if v is not None}, args.quiet


def _cell_number(shell) -> int:
    """The running cell's number, N of In[N]. IPython stores the cell in its history before it
    runs it (In[0] is empty); its execution_count is already the next cell's in IPython 9."""
    history = getattr(shell, "history_manager", None)
    inputs = getattr(history, "input_hist_raw", None)
    return len(inputs) - 1 if inputs else shell.execution_count


def _compile_cell(shell, cell: str, directory: str):
    """The cell as code objects: (its statements, its last expression or None). Their file is
    cellN.py in `directory`, N the cell's number, which holds the cell's code while it is
    recorded: the recorder quotes the lines of a file it can read, not those only in Python's
    linecache (where the traceback finds them)."""
    source = "\n" + shell.transform_cell(cell)  # Line 1 is the %%torchrr line.
    filename = os.path.join(directory, f"cell{_cell_number(shell)}.py")
    with open(filename, "w", encoding="utf-8") as file:
        file.write(source)
    # No modification time: linecache.checkcache keeps it after the file is gone, as IPython's
    # own cells.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    return (compile(tree, filename, "exec"),
            compile(last, filename, "eval") if last is not None else None)


def torchrr_cell(line: str, cell: str):
    """The %%torchrr magic: see this module's docstring. Returns the value of the cell's last
    expression, which IPython then shows as the cell's result."""
    from IPython import get_ipython
    from IPython.display import display

    shell = get_ipython()
    path, options, quiet = _parse(line, f"torchrr-cell-{_cell_number(shell)}.trr")
    failure = None
    value = None
    started = False
    # The cell's file is gone once the recording stopped: the trace carries the lines it quotes.
    with tempfile.TemporaryDirectory(prefix="torchrr-") as directory:
        statements, last = _compile_cell(shell, cell, directory)  # A SyntaxError records nothing.
        try:
            with _recording.record(path, **options) as recording:
                started = recording.recording
                if not started:
                    sys.stderr.write(f"torchrr: not recording the cell into {path} (see the "
                                     "warning above); running it as it is\n")
                exec(statements, shell.user_ns)
                if last is not None:
                    value = eval(last, shell.user_ns)
        except BaseException as error:  # Raised again below, after the verdict.
            failure = error
    if started:
        try:
            report = _report.replay(path)
        except (OSError, _report.ReplayError) as error:
            sys.stderr.write(f"torchrr: no verdict for {path}: {error}\n")
        else:
            if not (quiet and report.exit_code == 0):
                display(report)
    if failure is not None:
        raise failure
    return value


def load_ipython_extension(ipython) -> None:
    """Registers the %%torchrr cell magic with `ipython` (the InteractiveShell)."""
    torchrr_cell.__doc__ = _USAGE
    ipython.register_magic_function(torchrr_cell, magic_kind="cell", magic_name="torchrr")
