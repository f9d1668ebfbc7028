"""``torchrr fix --check``: re-runs the recorded command (``python script.py ...`` or
``python -m module ...``) under ``torchrr record`` with the patch applied to copies of the files
(a temporary copy of the script's directory, or for ``-m`` of the working directory the module
was imported from; the user's files are never written), replays that trace and says what
remains. ``--apply`` then writes the checked patch to the user's files, each with a ``.orig``
backup.

The trace does not record the working directory: it is found from the script's argument and the
absolute path the trace's frames give the same script.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile

from . import _fix

# Not copied with the script's directory: what a re-run never imports, and what is large.
_SKIP = shutil.ignore_patterns(".git", "__pycache__", "*.trr", ".venv", "venv", "node_modules",
                               "*.pt", "*.pth", "*.ckpt", "*.safetensors")
_COPY_LIMIT = 256 << 20  # 256 MiB: a script's directory, not a data set.


class NotRerunnable(Exception):
    """The recorded command cannot be re-run here; the message says why, in one line."""


def _command(trace: str) -> tuple:
    """(the recorded command, the `torchrr record` flags its recording needs again)."""
    proc = _fix.run_cli("info", "--json", trace)
    try:
        info = json.loads(proc.stdout)
        command = info["info"]["command_line"]
    except (json.JSONDecodeError, KeyError, TypeError):
        info, command = {}, None
    if not command:
        raise NotRerunnable("the trace does not record the command that ran")
    # Fingerprints are written only under --verify-saved: without it the re-run could not see
    # the silent writes the trace found, and would look clean.
    fingerprints = (info.get("records_per_kind") or {}).get("fingerprint", 0)
    return list(command), ["--verify-saved"] if fingerprints else []


def _found(tail: str, user_files: list) -> str:
    """The directory `tail` (a relative path) hangs from: that of the user's file the trace names
    that ends with it, else the working directory when it holds it; "" when neither."""
    tail = os.sep + os.path.normpath(tail)
    for path in user_files:
        if path.endswith(tail) and os.path.isfile(path):
            return path[:-len(tail)] or os.sep
    return os.getcwd() if os.path.isfile(os.getcwd() + tail) else ""


def _script(command: list, user_files: list) -> tuple:
    """(index in `command` of the Python script, or of the module `-m` names; the absolute path
    of the file it runs; the directory to copy: the script's, or for `-m` the working directory
    it imported the module from; the working directory the command ran in)."""
    if "python" not in os.path.basename(command[0]):
        raise NotRerunnable(f"`{command[0]}` is not Python: only `python script.py ...` and "
                            "`python -m module ...` are re-run")
    for index, arg in enumerate(command[1:], 1):
        if arg == "-c":
            raise NotRerunnable(f"`{command[0]} -c` runs no file: only `python script.py ...` "
                                "and `python -m module ...` are re-run")
        if arg == "-m" and index + 1 < len(command):
            module = command[index + 1]
            if not all(part.isidentifier() for part in module.split(".")):
                raise NotRerunnable(f"`-m {module}` names no module")
            path = module.replace(".", os.sep)
            for tail in (path + ".py", os.path.join(path, "__main__.py")):
                cwd = _found(tail, user_files)
                if cwd:
                    return index + 1, os.path.join(cwd, tail), cwd, cwd
            raise NotRerunnable(f"module {module} is not found in the working directory the "
                                "trace's lines show (an installed module is not copied)")
        if arg.startswith("-"):
            continue
        if os.path.isabs(arg):
            if not os.path.isfile(arg):
                raise NotRerunnable(f"{arg} is missing on this machine")
            return index, arg, os.path.dirname(arg), os.getcwd()
        cwd = _found(arg, user_files)
        if cwd:
            script = os.path.join(cwd, os.path.normpath(arg))
            return index, script, os.path.dirname(script), cwd
        raise NotRerunnable(f"{arg} is missing on this machine")
    raise NotRerunnable("the recorded command names no script")


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


def rerun(trace: str, document: dict, texts: dict, timeout: float, workdir: str) -> tuple:
    """Runs the recorded command under `torchrr record` on patched copies in `workdir`. Returns
    (the new trace, the CompletedProcess, a map from copied paths back to the user's)."""
    command, flags = _command(trace)
    index, script, root, cwd = _script(command, list(texts) + _fix._user_files(document))
    outside = [p for p in texts if os.path.commonpath([root, p]) != root]
    if outside:
        raise NotRerunnable(f"the patch edits {outside[0]}, outside the script's directory "
                            f"{root}, which is all that is copied")
    if _copy_size(root) > _COPY_LIMIT:
        raise NotRerunnable(f"{root} holds more than {_COPY_LIMIT >> 20} MiB to copy")
    copy = os.path.join(workdir, "src")
    shutil.copytree(root, copy, symlinks=True, ignore=_SKIP)
    for path, text in texts.items():
        with open(os.path.join(copy, os.path.relpath(path, root)), "w") as f:
            f.write(text)
    if command[index - 1] != "-m":  # A module is found from the (copied) working directory.
        command[index] = os.path.join(copy, os.path.relpath(script, root))
    inside = os.path.commonpath([root, cwd]) == root
    run_cwd = os.path.join(copy, os.path.relpath(cwd, root)) if inside else cwd
    new_trace = os.path.join(workdir, "check.trr")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "TORCHRR_FIX_EXIT_CODES")}
    proc = subprocess.run([_fix.cli_path(), "record", "-o", new_trace, *flags, "--", *command],
                          capture_output=True, text=True, cwd=run_cwd, env=env, timeout=timeout)
    return new_trace, proc, {os.path.realpath(copy): root}


def _back(path: str, paths: dict) -> str:
    for copy, root in paths.items():
        if path.startswith(copy + os.sep):
            return root + path[len(copy):]
    return path


def verdict(new_trace: str, proc: subprocess.CompletedProcess, paths: dict) -> tuple:
    """(clean, the lines saying what the re-run found)."""
    try:
        document, code = _fix.replay_json(new_trace)
    except _fix.TraceUnreadable as error:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:]
        return False, [f"with this patch: no trace to replay ({error})", *tail]
    violations = document.get("violations", [])
    lines = []
    if violations:
        lines.append(f"with this patch: {len(violations)} violation"
                     f"{'s' if len(violations) != 1 else ''} remain")
        for v in violations[:3]:
            culprit = (v.get("changed_source") or v.get("culprit") or {}).get("user_frame") or {}
            lines.append(f"  {v.get('kind')}: {(v.get('culprit') or {}).get('op')} at "
                         f"{_back(culprit.get('file') or '?', paths)}:{culprit.get('line')}")
    else:
        passes = document.get("backward_passes", 0)
        lines.append(f"with this patch: backward ran ({passes} pass{'es' * (passes != 1)}), "
                     "0 violations")
    program_failed = proc.returncode != 0 and not violations
    if program_failed:
        error = [line for line in proc.stderr.splitlines() if line.strip()]
        lines.append(f"but the program exited with status {proc.returncode}"
                     + (f": {_back(error[-1], paths)}" if error else ""))
    return not violations and not program_failed and code == 0, lines


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
        lines.append(f"patched {path} (the old file: {path}.orig)")
    return lines


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
            new_trace, proc, paths = rerun(args.trace, document, texts, args.timeout, workdir)
        except NotRerunnable as error:
            sys.stderr.write(f"torchrr: cannot re-run the recorded command: {error}\n")
            return codes["not_rerun"]
        except subprocess.TimeoutExpired:
            say(f"with this patch: the program ran past --timeout {args.timeout:g}s")
            return codes["violations"]
        clean, lines = verdict(new_trace, proc, paths)
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
