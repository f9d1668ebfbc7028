"""``torchrr fix --check``: re-runs the recorded command (``python script.py ...`` or
``python -m module ...``, or the torchrun launch a rank's trace came from, or a C++ program
built again from its CMake build, _fix_cpp_build) under ``torchrr record`` with the patch applied
to copies of the files (a temporary copy of the common root of the script, or for ``-m`` the
working directory the module was imported from, and the patched files; or of the patched C++
files; the user's files are never written), replays that trace and says what remains. The
command is read as CPython reads its own options (_python_target). ``--steps N`` stops the
re-run once its first N steps are recorded; without it, a Python program's re-run stops after
the step of its last violation (_violation_steps). A line on stderr says what is re-run.
When a violation was silent, the patched program also runs twice without the recorder
(_fix_grads/sitecustomize.py), as it is and with every saved tensor kept as saved, and the
gradients of its backward passes up to the violation's are compared
(compare_gradients). ``--apply`` then writes the checked patch to the user's files, each with a
``.orig`` backup.

The trace does not record the working directory: it is found from the script's argument and the
absolute path the trace's frames give the same script. A rank's trace does not record the
launcher's arguments either (its command line is the worker's, ``python -u script ...``, as
torchrun starts it): the launch is made again on this machine from the worker's command and the
trace's world size (_launch).
"""
from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Optional

from . import _fix
from . import _fix_cpp_build as _build

# Not copied with the script's directory: what a re-run never imports, and what is large.
_SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.trr", ".venv", "venv", "node_modules",
                               "*.pt", "*.pth", "*.ckpt", "*.safetensors")
_COPY_LIMIT = 256 << 20  # 256 MiB: a script's directory, not a data set.
# Set by an enclosing launch: the re-run's launcher sets its own for its workers.
_LAUNCH_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
               "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Set by the recording and by the fix verb around this run: never the re-run's.
_RECORDING_ENV = ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "TORCHRR_FIX_EXIT_CODES",
                  "TORCHRR_FIX_OPTIONS")
# How often a re-run bounded by --steps looks whether its traces are written: each look is a
# `torchrr info` per trace not yet written, a few milliseconds.
_POLL_S = 0.25
# Once the steps a re-run is bounded to are written, how long the program may take to end on its
# own (its last step was its end: a Python program's exit takes a moment) before it is stopped.
_END_GRACE_S = 2
# After SIGTERM, how long the re-run may take to end before SIGKILL: torchrun gives its workers
# 30 s after passing SIGTERM on before it kills them.
_STOP_GRACE_S = 40


class NotRerunnable(Exception):
    """The recorded command cannot be re-run here; the message says why, in one line."""


def _info(trace: str) -> dict:
    """`torchrr info --json TRACE`'s document, {} when it wrote none."""
    proc = _fix.run_cli("info", "--json", trace)
    try:
        info = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {}
    return info if isinstance(info, dict) else {}


def _command(info: dict) -> tuple:
    """(the recorded command, the `torchrr record` flags its recording needs again)."""
    command = (info.get("info") or {}).get("command_line")
    if not command or not isinstance(command, list):
        raise NotRerunnable("the trace does not record the command that ran")
    # Fingerprints are written only under --verify-saved: without it the re-run could not see
    # the silent writes the trace found, and would look clean.
    fingerprints = (info.get("records_per_kind") or {}).get("fingerprint", 0)
    return list(command), ["--verify-saved"] if fingerprints else []


def _found(tail: str, user_files: list) -> str:
    """The directory `tail` (a relative path) hangs from: that of the user's file the trace names
    that ends with it, else the working directory when it holds it; "" when neither."""
    tail = os.sep + os.path.normpath(tail)
    for path in map(os.path.normpath, user_files):
        if path.endswith(tail) and os.path.isfile(path):
            return path[:-len(tail)] or os.sep
    return os.getcwd() if os.path.isfile(os.getcwd() + tail) else ""


# CPython's own options that take a value (`python -W ignore`, `-Wignore`, `-X dev`), as its
# getopt reads them (Python/getopt.c); the long one that takes a value; the others take none.
_PYTHON_VALUE_OPTIONS = "WXcm"
_PYTHON_LONG_VALUE_OPTIONS = ("--check-hash-based-pycs",)


def _python_target(command: list) -> tuple:
    """What `command` (a Python interpreter and its arguments) runs, read as CPython reads its
    command line: ("script", index of the script), ("module", index of the argument that holds
    the module's name, the name) or ("c", index) for `-c`, ("stdin", index) for `-` or nothing
    after the options. Short options combine (`-uW ignore`, `-Wignore`), a value is the rest of
    its argument or the next one, and `--` ends the options."""
    index = 1
    while index < len(command):
        arg = command[index]
        if arg == "--":
            return ("script", index + 1) if index + 1 < len(command) else ("stdin", index)
        if arg == "-":
            return "stdin", index
        if arg in _PYTHON_LONG_VALUE_OPTIONS:
            index += 2
            continue
        if arg.startswith("--") or arg.startswith(tuple(f"{o}=" for o in
                                                        _PYTHON_LONG_VALUE_OPTIONS)):
            index += 1
            continue
        if not arg.startswith("-"):
            return "script", index
        taken = 1
        for at in range(1, len(arg)):
            option = arg[at]
            if option not in _PYTHON_VALUE_OPTIONS:
                continue
            attached = arg[at + 1:]
            if option in "cm":
                if attached:
                    return (option if option == "c" else "module"), index, attached
                if index + 1 >= len(command):
                    return "stdin", index
                return ("c" if option == "c" else "module"), index + 1, command[index + 1]
            taken = 1 if attached else 2
            break
        index += taken
    return "stdin", index


def _script(command: list, user_files: list) -> tuple:
    """(index in `command` of the Python script, or of the argument holding the module `-m`
    names; the absolute path of the file it runs; the directory to copy: the script's, or for
    `-m` the working directory it imported the module from; the working directory the command ran
    in; whether it is a module). The script is the one Python itself would run
    (_python_target)."""
    if "python" not in os.path.basename(command[0]):
        raise NotRerunnable(f"`{command[0]}` is not Python: only `python script.py ...` and "
                            "`python -m module ...` are re-run")
    target = _python_target(command)
    kind, index = target[0], target[1]
    if kind == "c":
        raise NotRerunnable(f"`{command[0]} -c` runs no file: only `python script.py ...` "
                            "and `python -m module ...` are re-run")
    if kind == "stdin":
        raise NotRerunnable("the recorded command names no script (Python read its program "
                            "from stdin)")
    if kind == "module":
        module = target[2]
        if not all(part.isidentifier() for part in module.split(".")):
            raise NotRerunnable(f"`-m {module}` names no module")
        path = module.replace(".", os.sep)
        for tail in (path + ".py", os.path.join(path, "__main__.py")):
            cwd = _found(tail, user_files)
            if cwd:
                return index, os.path.join(cwd, tail), cwd, cwd, True
        raise NotRerunnable(f"module {module} is not found in the working directory the "
                            "trace's lines show (an installed module is not copied)")
    arg = command[index]
    if os.path.isabs(arg):
        arg = os.path.normpath(arg)
        if not os.path.isfile(arg):
            raise NotRerunnable(f"{arg} is missing on this machine")
        return index, arg, os.path.dirname(arg), os.getcwd(), False
    cwd = _found(arg, user_files)
    if cwd:
        script = os.path.normpath(os.path.join(cwd, arg))
        return index, script, os.path.dirname(script), cwd, False
    raise NotRerunnable(f"{arg} is missing on this machine")


def _rank_trace(trace: str, rank: int) -> str:
    """Where the recording put rank `rank`'s trace beside `trace` (STEM.rankN.trr, as
    environment_options.cc names them); "" when `trace` is not so named."""
    stem, ext = os.path.splitext(trace)
    stem, dot, middle = stem.rpartition(".")
    if not dot or not middle.startswith("rank") or not middle[4:].isdigit():
        return ""
    return f"{stem}.rank{rank}{ext}"


def _launch(trace: str, info: dict, command: list, script_index: int) -> list:
    """For the trace of one torchrun worker (the trace's rank and world size set; its command
    torchrun's `python -u [-m] X ARGS`): the launcher part of a command that starts every rank
    on this machine, `python -m torch.distributed.run --standalone --nproc-per-node W`, to be
    followed by command[2:]. [] for a trace of a process that no launcher started.

    The worker's trace does not hold the launcher's own arguments; the world size, all on one
    machine, is what the program sees of them. Refuses ranks that ran on several machines (a
    rank's trace beside this one names another host) and workers of another launcher
    (torch.distributed.launch's and deepspeed's pass --local-rank on the command line)."""
    recorded = info.get("info") or {}
    rank, world = recorded.get("rank", -1), recorded.get("world_size", 0)
    if not isinstance(rank, int) or not isinstance(world, int) or rank < 0 or world < 1:
        return []
    if command[1:2] != ["-u"]:
        raise NotRerunnable(f"rank {rank} of {world} ran `{shlex.join(command[:3])} ...`, not "
                            "as torchrun starts a worker (`python -u ...`): its launcher is "
                            "not known")
    after = command[script_index + 1:script_index + 2]
    if after and after[0].startswith(("--local-rank=", "--local_rank=")):
        raise NotRerunnable(f"rank {rank} of {world} was given `{after[0]}`: a launcher other "
                            "than torchrun (torch.distributed.launch, deepspeed) is not re-run")
    host = recorded.get("host")
    for other in range(world):
        path = _rank_trace(trace, other)
        if other == rank or not path or not os.path.isfile(path):
            continue
        other_host = (_info(path).get("info") or {}).get("host")
        if other_host and host and other_host != host:
            raise NotRerunnable(f"the ranks ran on several machines ({host}, {other_host} in "
                                f"{path}): only a launch on one machine is re-run")
    return [command[0], "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", str(world)]


def _copy_size(root: str) -> int:
    total = 0
    for directory, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not _SKIP(directory, [d])]
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_size
            except OSError:
                pass
        if total > _COPY_LIMIT:
            break
    return total


@dataclass
class Rerun:
    """What one re-run under `torchrr record` left: its traces, the program's end, and how to
    name the user's files in what it found."""
    trace: str                    # The new trace to judge: the same rank's, under torchrun.
    returncode: int = 0
    stderr: str = ""
    paths: dict = field(default_factory=dict)   # Copied directory -> the user's.
    rank: Optional[int] = None    # Under torchrun: the rank `trace` is.
    ranks: dict = field(default_factory=dict)   # Under torchrun: rank -> its new trace.
    launch: str = ""              # Under torchrun: the launch that ran, as the user would type it.
    stopped: bool = False         # --steps: stopped once its first steps were written.
    command: list = field(default_factory=list)  # The patched program's command line,
    cwd: str = ""                                # run in this directory,
    env: dict = field(default_factory=dict)      # with this environment.
    built: bool = False           # A C++ program built again with the patch (_fix_cpp_build).


def _steps_written(traces: list, steps: int, done: set) -> bool:
    """Whether every trace in `traces` is closed with `steps` steps in it (--steps 0:N-1: the
    recorder closes it once step N-1 is over); `done` keeps those found so. A trace the program
    closed at its end with fewer steps is not: that program ends on its own."""
    for path in traces:
        if path in done or not os.path.isfile(path):
            continue
        info = _info(path)
        if info.get("closed_cleanly") and \
                (info.get("records_per_kind") or {}).get("step", 0) >= steps:
            done.add(path)
    return all(path in done for path in traces)


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM, which `torchrr record` passes to the program (torchrun to its workers); SIGKILL
    after _STOP_GRACE_S."""
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _record(argv: list, cwd: str, env: dict, timeout: float, workdir: str,
            bounded_traces: list, steps: Optional[int], shown: str) -> tuple:
    """Runs `argv` (a `torchrr record`), its output kept in `workdir`, after a line on stderr
    that says it re-runs `shown` (the user's command) and for how long. With `steps`, stops it
    once each of `bounded_traces` is written with that many steps. Returns (exit status, stderr,
    whether it was stopped so); raises TimeoutExpired after it was stopped at `timeout`
    seconds."""
    bound = f"its first {steps} step{'s' * (steps != 1)}, " if steps else ""
    sys.stderr.write(f"torchrr: re-running the patched program ({bound}at most {timeout:g} s): "
                     f"{shown}\n")
    sys.stderr.flush()
    with open(os.path.join(workdir, "stdout"), "wb") as out, \
            open(os.path.join(workdir, "stderr"), "wb") as err:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=err,
                                stdin=subprocess.DEVNULL)
    deadline, done, stopped = time.monotonic() + timeout, set(), False
    while proc.poll() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            _stop(proc)
            raise subprocess.TimeoutExpired(argv, timeout)
        try:
            proc.wait(timeout=min(left, _POLL_S) if steps else left)
        except subprocess.TimeoutExpired:
            if steps and _steps_written(bounded_traces, steps, done):
                try:  # A program whose last step was its end is not stopped: it ends itself.
                    proc.wait(timeout=min(_END_GRACE_S, max(deadline - time.monotonic(), 0)))
                except subprocess.TimeoutExpired:
                    _stop(proc)
                    stopped = True
    with open(os.path.join(workdir, "stderr"), "rb") as err:
        stderr = err.read().decode("utf-8", "replace")
    return proc.returncode, stderr, stopped


def rerun(trace: str, document: dict, texts: dict, timeout: float, workdir: str,
          steps: Optional[int] = None, default_steps: Optional[int] = None) -> Rerun:
    """Runs the recorded command under `torchrr record` on patched copies in `workdir` (a rank's
    trace: the whole torchrun launch); with `steps`, stops it once its first `steps` steps are
    recorded."""
    info = _info(trace)
    command, flags = _command(info)
    if any(_fix.cpp.is_cpp(path) for path in texts):
        if steps:
            flags = [*flags, "--steps", f"0:{steps - 1}"]
        return _rerun_cpp(command, flags, texts, timeout, workdir, steps)
    # The trace's paths as the program named them (`scripts/../src/pkg/mod.py`): one name each.
    texts = {os.path.normpath(os.path.abspath(path)): text for path, text in texts.items()}
    index, script, root, cwd, module = _script(command,
                                               list(texts) + _fix._user_files(document))
    launcher = _launch(trace, info, command, index)
    # Without --steps, a Python program stops once the steps its violations were in are recorded
    # (`default_steps`). Not a launch: another rank's violations may come later.
    if steps is None and not launcher:
        steps = default_steps
    if steps:
        flags = [*flags, "--steps", f"0:{steps - 1}"]
    # The copy holds the script and every patched file: their common root (`scripts/train.py`
    # beside `src/pkg/`: the repository).
    root = os.path.commonpath([root, *texts])
    if root == os.path.dirname(root):
        raise NotRerunnable(f"the script {script} and the patched files share no directory but "
                            f"{root}: only a tree that holds them all is copied")
    if _copy_size(root) > _COPY_LIMIT:
        raise NotRerunnable(f"{root} holds more than {_COPY_LIMIT >> 20} MiB to copy")
    copy = os.path.join(workdir, "src")
    shutil.copytree(root, copy, symlinks=True, ignore=_SKIP)
    for path, text in texts.items():
        with open(os.path.join(copy, os.path.relpath(path, root)), "w") as f:
            f.write(text)
    packages = _package_roots(texts, root, copy, os.path.dirname(script))
    recorded = list(command)
    # A relative interpreter (`.venv/bin/python`) names a file of the directory the program ran
    # in, not of the copy the re-run starts in.
    if os.sep in command[0] and not os.path.isabs(command[0]):
        found = [os.path.abspath(os.path.join(base, command[0])) for base in (cwd, os.getcwd())
                 if os.path.isfile(os.path.join(base, command[0]))]
        if not found:
            raise NotRerunnable(f"{command[0]} is not found from here: run fix in the directory "
                                "the program was recorded in")
        command[0] = found[0]
    if not module:  # A module is found from the (copied) working directory.
        command[index] = os.path.join(copy, os.path.relpath(script, root))
    inside = os.path.commonpath([root, cwd]) == root
    run_cwd = os.path.join(copy, os.path.relpath(cwd, root)) if inside else cwd
    new_trace = os.path.join(workdir, "check.trr")
    drop = set(_RECORDING_ENV)
    result = Rerun(new_trace, paths={os.path.realpath(copy): root})
    if launcher:
        command = launcher + command[2:]  # torchrun adds the -u itself.
        drop.update(_LAUNCH_ENV)
        result.rank = info["info"]["rank"]
        result.ranks = {r: os.path.join(workdir, f"check.rank{r}.trr")
                        for r in range(info["info"]["world_size"])}
        result.trace = result.ranks[result.rank]
        result.launch = shlex.join(["torchrun", *launcher[3:], *recorded[2:]])
    env = {k: v for k, v in os.environ.items() if k not in drop}
    if packages:
        # Ahead of site-packages, whose .pth or finder of an editable install names the user's.
        env["PYTHONPATH"] = os.pathsep.join([*packages, *filter(None, [env.get("PYTHONPATH")])])
    result.command, result.cwd, result.env = list(command), run_cwd, env
    result.returncode, result.stderr, result.stopped = _record(
        [_fix.cli_path(), "record", "-o", new_trace, *flags, "--", *command], run_cwd, env,
        timeout, workdir, list(result.ranks.values()) or [new_trace], steps,
        result.launch or shlex.join(recorded))
    return result


def _package_roots(texts: dict, root: str, copy: str, script_dir: str) -> list:
    """The directories of the copy that the patched program must import its patched packages
    from: for each patched file inside a package (a directory with __init__.py), the directory
    above its top package (`src` for `src/pkg/mod.py`), unless that is the script's own directory,
    which Python puts first itself. An editable install (`pip install -e .`) names the user's
    tree; these, first on PYTHONPATH, name the copy."""
    roots = []
    for path in texts:
        top = os.path.dirname(path)
        while top != root and os.path.isfile(os.path.join(top, "__init__.py")):
            top = os.path.dirname(top)
        if top == os.path.dirname(path) or top == script_dir:
            continue
        in_copy = os.path.join(copy, os.path.relpath(top, root))
        if in_copy not in roots:
            roots.append(in_copy)
    return roots


def _rerun_cpp(command: list, flags: list, texts: dict, timeout: float, workdir: str,
               steps: Optional[int]) -> Rerun:
    """The recorded C++ program built again from patched copies of its sources
    (_fix_cpp_build), run under `torchrr record` (with `flags`) in this directory with its
    recorded arguments."""
    if not all(_fix.cpp.is_cpp(path) for path in texts):
        raise NotRerunnable("the patch edits both C++ and Python files: only one program is "
                            "re-run")
    executable = command[0]
    if not os.path.isabs(executable):
        executable = shutil.which(executable) if os.sep not in executable else \
            os.path.abspath(executable)
    if not executable or not os.path.isfile(executable):
        raise NotRerunnable(f"{command[0]} is not found from here: run fix in the directory "
                            "the program was recorded in")
    started = time.monotonic()
    try:
        rebuilt, paths = _build.rebuild(executable, texts, workdir, timeout)
    except _build.CannotRebuild as error:
        raise NotRerunnable(f"{error}") from None
    new_trace = os.path.join(workdir, "check.trr")
    result = Rerun(new_trace, paths=paths, command=[rebuilt, *command[1:]], cwd=os.getcwd(),
                   built=True)
    result.env = {k: v for k, v in os.environ.items() if k not in _RECORDING_ENV}
    # The build took its part of --timeout; the run has what is left of it.
    left = max(1.0, timeout - (time.monotonic() - started))
    result.returncode, result.stderr, result.stopped = _record(
        [_fix.cli_path(), "record", "-o", new_trace, *flags, "--", *result.command], result.cwd,
        result.env, left, workdir, [new_trace], steps, shlex.join(command))
    return result


def _back(path: str, paths: dict) -> str:
    for copy, root in paths.items():
        if path.startswith(copy + os.sep):
            return root + path[len(copy):]
    return path


def _where(violations: list, paths: dict) -> list:
    """One indented line for each of the first three violations: its kind, op and culprit line
    (in the user's file)."""
    lines = []
    for v in violations[:3]:
        culprit = v.get("changed_source") or v.get("culprit") or {}
        frame = culprit.get("user_frame") or {}
        # A hook, a freed graph's backward() or an unrecorded write has no op of its own.
        what = culprit.get("op") or ("the unpack hook" if culprit.get("hook") else "a write")
        if v.get("kind") == "freed":
            what = "backward()"
        lines.append(f"  {v.get('kind')}: {what} at "
                     f"{_back(frame.get('file') or '?', paths)}:{frame.get('line') or '?'}")
    return lines


def _count(violations: list) -> str:
    return f"{len(violations)} violation{'s' if len(violations) != 1 else ''}"


def _last_error(stderr: str, paths: dict) -> str:
    """The program's last line on stderr that says something (torchrun ends with rules of '=')."""
    lines = [line for line in stderr.splitlines() if line.strip(" =-")]
    return _back(lines[-1], paths) if lines else ""


def verdict(run: Rerun, steps: Optional[int] = None) -> tuple:
    """(clean, the lines saying what the re-run found): the replay of its trace (the same rank's
    under torchrun, then a line for each other rank whose trace holds violations or is missing);
    "in the first N steps" when --steps N (`steps`) stopped it."""
    # Only a bound the user chose is named: the default one (the violations' steps) is said on
    # stderr as the re-run starts, and whether it stopped the program early depends on timing.
    lead = (f"with this patch, in the first {steps} step{'s' * (steps != 1)}"
            if run.stopped and steps else "with this patch")
    try:
        document, code = _fix.replay_json(run.trace)
    except _fix.TraceUnreadable as error:
        tail = _last_error(run.stderr, run.paths)
        return False, [f"{lead}: no trace to replay ({error})"] + ([tail] if tail else [])
    violations = document.get("violations", [])
    lines = []
    if violations:
        lines.append(f"{lead}: {_count(violations)} remain")
        lines += _where(violations, run.paths)
    else:
        passes = document.get("backward_passes", 0)
        lines.append(f"{lead}: backward ran ({passes} pass{'es' * (passes != 1)}), 0 violations")
    clean, found = not violations and code == 0, bool(violations)
    if run.launch:
        lines.append(f"  (rank {run.rank} of the launch re-run as: {run.launch})")
    for rank, trace in run.ranks.items():
        if rank == run.rank:
            continue
        try:
            other, other_code = _fix.replay_json(trace)
        except _fix.TraceUnreadable:
            lines.append(f"but rank {rank} wrote no trace to replay")
            clean = False
            continue
        found = found or bool(other.get("violations"))
        if other.get("violations"):
            lines.append(f"but rank {rank}'s trace has {_count(other['violations'])}")
            lines += _where(other["violations"], run.paths)
        clean = clean and not other.get("violations") and other_code == 0
    # A violation PyTorch raised ends the program: its status says nothing more then.
    program_failed = run.returncode != 0 and not run.stopped and not found
    if program_failed:
        error = _last_error(run.stderr, run.paths)
        lines.append(f"but the program exited with status {run.returncode}"
                     + (f": {error}" if error else ""))
    return clean and not program_failed, lines


_GRADIENT_SITE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fix_grads")
# How close two runs' gradient statistics must be: CPU kernels may sum in another order.
_GRADIENT_RTOL = 1e-4


def _gradients(run: Rerun, passes: int, snapshot: bool, timeout: float, workdir: str) -> tuple:
    """(the [shape, sum, sum of squares] of each leaf's gradient for each of the patched
    program's first `passes` backward passes, or None; the program's last error line)."""
    out = os.path.join(workdir, "gradients.snapshot.json" if snapshot else "gradients.json")
    env = dict(run.env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_GRADIENT_SITE, env.get("PYTHONPATH")) if p)
    env.update(TORCHRR_FIX_GRADIENTS=out, TORCHRR_FIX_PASSES=str(passes),
               TORCHRR_FIX_SNAPSHOT="1" if snapshot else "0")
    try:
        proc = subprocess.run(run.command, cwd=run.cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, str(error)
    try:
        with open(out) as f:
            return json.load(f), ""
    except (OSError, ValueError):
        return None, _last_error(proc.stderr.decode("utf-8", "replace"), run.paths)


def _close(a: list, b: list) -> bool:
    """Whether two gradients' [shape, sum, sum of squares] agree. A sum of n elements each off by
    a relative e is off by at most e times the L2 norm times sqrt(n), however the terms cancel."""
    if a is None or b is None:
        return a is b
    scale = (abs(a[2]) * math.prod(a[0])) ** 0.5 + 1e-12
    return a[0] == b[0] and abs(a[1] - b[1]) <= _GRADIENT_RTOL * (abs(a[1]) + scale) and \
        abs(a[2] - b[2]) <= _GRADIENT_RTOL * abs(a[2]) + 1e-12


def compare_gradients(run: Rerun, document: dict, timeout: float, workdir: str) -> tuple:
    """For a patch of silent violations, which PyTorch did not raise for: (True, False, or None
    when not compared; the line saying so) whether the patched program's gradients, up to the last
    silent violation's backward pass, equal those it computes with every saved tensor kept as
    saved (the program with every in-place write made out of place). (True, "") when no
    violation was silent."""
    silent = [v for v in document.get("violations", []) if v.get("kind") == "silent"]
    if not silent:
        return True, ""
    if run.built:
        return None, "the gradients were not compared: only a Python program's are"
    if run.launch:
        return None, "the gradients were not compared: a torchrun launch is re-run only recorded"
    passes = 1 + max(int(v.get("backward_pass") or 0) for v in silent)
    patched, error = _gradients(run, passes, False, timeout, workdir)
    reference, reference_error = _gradients(run, passes, True, timeout, workdir)
    if patched is None or reference is None:
        return None, ("the gradients were not compared: the program's gradient run wrote none"
                      + (f" ({error or reference_error})" if error or reference_error else ""))
    if len(patched) != len(reference):
        return False, (f"but it ran {len(patched)} backward passes, and {len(reference)} with "
                       "every saved tensor kept as saved")
    for number, (mine, theirs) in enumerate(zip(patched, reference)):
        if len(mine) != len(theirs):
            return False, (f"but its backward pass {number} reached {len(mine)} leaves, and "
                           f"{len(theirs)} with every saved tensor kept as saved")
        for leaf, (a, b) in enumerate(zip(mine, theirs)):
            if not _close(a, b):
                shape = "x".join(map(str, (a or b or [[]])[0])) or "scalar"
                return False, (f"but its gradients differ from those with every saved tensor "
                               f"kept as saved, the out-of-place program's: backward pass "
                               f"{number}, leaf {leaf} ({shape})")
    leaves = sum(len(p) for p in patched)
    return True, (f"and its gradients equal those with every saved tensor kept as saved, the "
                  f"out-of-place program's ({leaves} lea{'ves' if leaves != 1 else 'f'} in "
                  f"{len(patched)} backward pass{'es' * (len(patched) != 1)})")


def apply(space: "_fix.Workspace", texts: dict) -> list:
    """Writes each patched text over the user's file, the old one kept as FILE.orig. Returns the
    lines saying what was written."""
    lines = []
    for path, text in texts.items():
        with open(path) as f:
            if f.read() != space.sources[path].text:
                raise NotRerunnable(f"{path} changed while it was checked: nothing written")
    for path, text in texts.items():
        shutil.copy2(path, path + ".orig")
        temporary = path + ".torchrr-fix"
        with open(temporary, "w") as f:
            f.write(text)
        shutil.copymode(path, temporary)
        os.replace(temporary, path)
        shown = os.path.normpath(path)  # `scripts/../pkg/model.py` as `pkg/model.py`.
        lines.append(f"patched {shown} (the old file: {shown}.orig)")
    return lines


def _violation_steps(document: dict) -> Optional[int]:
    """How many steps a re-run needs to reach every violation: 1 + the last violation's step;
    None (the whole run) when a violation's step is not known."""
    steps = [v.get("step") for v in document.get("violations", [])]
    if not steps or any(not isinstance(step, int) or step < 0 for step in steps):
        return None
    return max(steps) + 1


def check(args, document: dict, space: "_fix.Workspace", texts: dict, codes: dict,
          all_certain: bool, say) -> int:
    """Checks the patch (`texts`, the patched files), calling `say` with each line of the
    verdict, then with --apply writes it. Returns the exit code: ok only when the re-run is clean
    and every violation had a certain patch."""
    if not texts:
        say("torchrr: nothing to check: no certain patch" if document.get("violations") else
            "torchrr: nothing to check: no violation")
        return codes["no_fix"] if document.get("violations") else codes["ok"]
    with tempfile.TemporaryDirectory(prefix="torchrr-fix-") as workdir:
        try:
            # By default the re-run stops once the steps its violations were in are recorded (a
            # training run's remaining hours prove nothing more of the patch); --steps overrides.
            run = rerun(args.trace, document, texts, args.timeout, workdir, args.steps,
                        default_steps=_violation_steps(document))
        except NotRerunnable as error:
            sys.stderr.write(f"torchrr: cannot re-run the recorded command: {error}\n")
            return codes["not_rerun"]
        except _build.CompileFailed as error:
            say(f"with this patch: {error}")
            return codes["violations"]
        except subprocess.TimeoutExpired:
            say(f"with this patch: the program ran past --timeout {args.timeout:g}s")
            return codes["violations"]
        clean, lines = verdict(run, args.steps)
        if clean:
            same, line = compare_gradients(run, document, args.timeout, workdir)
            lines += [line] if line else []
            clean = same is not False
    for line in lines:
        say(line)
    if not clean:
        return codes["violations"]
    if args.apply:
        try:
            for line in apply(space, texts):
                say(line)
        except (NotRerunnable, OSError) as error:
            sys.stderr.write(f"torchrr: error: {error}\n")
            return codes["other"]
    return codes["ok"] if all_certain else codes["no_fix"]
