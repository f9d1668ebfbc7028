"""Recording from Python: record() (a context manager), start() and stop()."""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Optional

from . import _modules, _native
from ._env_switch import switch_on

# Error kinds of torchrr_record_error (format::ErrorKind).
ERROR_CPP = 0
ERROR_PYTHON = 1
ERROR_UNCAUGHT = 2


def start(path: str | os.PathLike = "torchrr.trr", *, rank: Optional[int] = None,
          **options) -> bool:
    """Starts recording every tensor op autograd sees in this process into ``path``.

    rank: the distributed rank written to the trace (None reads RANK). The other keywords are
    the recording options, each named as in docs/recorder.md's table of options (the recorder's
    recording_options.def holds them, with what each one does): native_stacks, python_stacks,
    max_buffered_bytes, drop_when_full, verify_saved, cuda_kernels, all_ops, follow_forks,
    source, keep_last, keep_last_bytes, spill, steps, force (replace a file at ``path`` that is
    not a trace; by default such a file is refused). A switch takes True or False; a count an
    int; spill a directory (created if missing); steps a (first, last) pair of 0-based step
    numbers, inclusive, last None for the end of the run. One not given takes its default, as
    under ``torchrr record``: C++ stacks are off in a Python process (its user lines are in its
    Python frames).

    torch.compile: until stop(), AOTAutograd's cache is off (unless TORCHINDUCTOR_AUTOGRAD_CACHE
    is set), so that each compiled region is traced and its saved tensors are named by the lines
    inside it that use them; this changes compile time only.

    Modules: until stop(), global forward hooks name the nn.Module each op runs under
    (torchrr/_modules.py); they do nothing while torch.compile traces.

    Returns True when recording, False when not (already recording, or the file could not be
    opened: the recorder printed a warning saying which). Raises ValueError for an option the
    recorder does not know, a value it does not take, or options that do not go together
    (steps with keep_last, spill without keep_last); nothing starts then. Imports torch.
    Thread-safe.
    """
    lib = _native.library()
    given = _given(path, rank, options)
    _native.describe(lib, given)  # Raises ValueError before anything is created.
    if options.get("spill") is not None:
        os.makedirs(options["spill"], exist_ok=True)
    rc = lib.torchrr_start_with(given)
    if rc == 2:
        raise ValueError(f"torchrr.start: {_native.refusal(given)}")
    if rc == 0:
        _close_in_forked_children()
        _close_before_exit_and_exec()
        _trace_compiled_regions()
        _modules.install()
    return rc == 0


def _given(path, rank, options: dict):
    """start()'s arguments as the recorder's torchrr_options (None: not given)."""
    settings = [(name, _setting_text(name, value)) for name, value in options.items()
                if value is not None]
    return _native.options(os.fspath(path), rank, settings)


def _setting_text(name: str, value) -> str:
    """A keyword's value as the recorder takes it (c_api.h, torchrr_setting)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if name == "steps" and isinstance(value, (tuple, list)) and len(value) == 2:
        first, last = value
        return f"{'' if first is None else int(first)}:{'' if last is None else int(last)}"
    if isinstance(value, (str, bytes, os.PathLike)):
        return os.fsdecode(os.fspath(value))
    if isinstance(value, int):
        return str(value)
    raise ValueError(f"torchrr.start: {name}={value!r}: expected a bool, an int or a string")


def options_in_effect(path: str | os.PathLike = "torchrr.trr", *, rank: Optional[int] = None,
                      **options) -> dict:
    """What start(path, rank=rank, **options) would record with, without starting: every
    recording option's keyword and value, as the recorder's text ("1", "256", "2:5"). Raises
    ValueError as start() does. Imports torch."""
    text = _native.describe(_native.library(), _given(path, rank, options))
    return dict(line.split("=", 1) for line in text.splitlines() if line)


# The value of torch._functorch.config.enable_autograd_cache that start() replaced, restored by
# stop(); empty when it replaced none.
_AUTOGRAD_CACHE_BEFORE = []


def _trace_compiled_regions():
    """While recording, AOTAutograd traces every region torch.compile compiles instead of loading
    it from its cache: a region loaded from there has no backward graph to say which line each
    tensor it saves is for (docs/recorder.md, torch.compile). Compile time changes, nothing else.
    The user's choice (TORCHINDUCTOR_AUTOGRAD_CACHE, which `torchrr record` sets to 0) stands.
    stop() puts the setting back; a recording that ends on its own leaves it off."""
    if "TORCHINDUCTOR_AUTOGRAD_CACHE" in os.environ or _AUTOGRAD_CACHE_BEFORE:
        return
    try:
        import torch._functorch.config as config
        before = config.enable_autograd_cache
        config.enable_autograd_cache = False
    except (ImportError, AttributeError):  # A torch without that cache: nothing to turn off.
        return
    _AUTOGRAD_CACHE_BEFORE.append(before)


def start_from_environment() -> bool:
    """Starts recording as ``torchrr record`` asked through its TORCHRR_* environment variables
    (TORCHRR_OUTPUT the trace; parsed, with their defaults, by the recorder: c_api.h's
    torchrr_start_from_environment). Returns True when recording; False when TORCHRR_OUTPUT is
    unset, or the recorder printed why not. Imports torch."""
    if _native.library().torchrr_start_from_environment() != 0:
        return False
    _close_in_forked_children()
    _close_before_exit_and_exec()
    _warn_about_python_children()
    _modules.install()
    return True


class _AfterForkKey:
    """The key of the multiprocessing hook below (its registry holds keys weakly)."""


_after_fork_key = _AfterForkKey()
_fork_hooks_installed = False


def _stop_childs_own_recording():
    # Only where the child records (follow_forks, started at its first op): elsewhere there is
    # nothing of its own to close, and the recording the child inherited is the parent's.
    if recording():
        stop()


def _stop_at_multiprocessing_child_exit(_key):
    # multiprocessing ends a process it forked with os._exit, past atexit; it runs its finalizers
    # first. It clears those the child inherits before it runs the after-fork hooks.
    from multiprocessing import util

    util.Finalize(None, _stop_childs_own_recording, exitpriority=0)


def _stop_at_child_exit():
    import atexit

    atexit.register(_stop_childs_own_recording)


def _close_in_forked_children():
    """Closes a forked child's own recording (follow_forks) when the child ends: at its exit
    (atexit), and at the end of a multiprocessing child (a DataLoader worker), which ends with
    os._exit. Installed once, whatever the options: whether a child records is the recorder's to
    say (under `torchrr record`, from the environment), and the hooks ask it."""
    global _fork_hooks_installed
    if _fork_hooks_installed:
        return
    _fork_hooks_installed = True
    os.register_at_fork(after_in_child=_stop_at_child_exit)
    try:
        from multiprocessing import util

        util.register_after_fork(_after_fork_key, _stop_at_multiprocessing_child_exit)
    except Exception as error:  # Recording goes on; only such children's traces end cut.
        import sys

        sys.stderr.write(f"torchrr: warning: multiprocessing children: {error}\n")


_children_watched = False


def _is_python(argv) -> bool:
    """Whether an exec of `argv` starts a Python interpreter (this one, or any python*)."""
    if not argv:
        return False
    program = os.fsdecode(argv[0])
    name = os.path.basename(program)
    return name.startswith("python") or (
        os.path.sep in program and os.path.realpath(program) == os.path.realpath(sys.executable))


def _warn_about_python_children():
    """Under `torchrr record` without --follow-forks, a Python process this one starts
    (subprocess, torch.multiprocessing.spawn, a DataLoader worker with the spawn method) records
    nothing, and a bug there would go unseen: the first one started says so, once. Both
    subprocess and multiprocessing start them through _posixsubprocess.fork_exec (subprocess
    through the reference it took at import); the wrapper reads its arguments only."""
    global _children_watched
    if _children_watched or switch_on("TORCHRR_FOLLOW_FORKS"):
        return
    _children_watched = True
    try:
        import _posixsubprocess
    except ImportError:
        return
    real_fork_exec = _posixsubprocess.fork_exec
    warned = []

    def fork_exec(*args, **kwargs):
        try:
            if not warned and recording() and args and _is_python(args[0]):
                warned.append(True)
                shown = " ".join(os.fsdecode(a) for a in list(args[0])[:3])
                sys.stderr.write(
                    f"torchrr: warning: this program started another Python process ({shown}), "
                    "which is not recorded: `torchrr record --follow-forks` records each into "
                    "a trace of its own (FILE.pidN.trr)\n")
        except Exception:  # Never in the way of starting the process.
            pass
        return real_fork_exec(*args, **kwargs)

    _posixsubprocess.fork_exec = fork_exec
    if getattr(subprocess, "_fork_exec", None) is real_fork_exec:
        subprocess._fork_exec = fork_exec


_exit_hooks_installed = False
# Under `torchrr record`: the trace of the first image (FILE.trr), and how many execs came since.
_EXEC_BASE_ENV = "TORCHRR_EXEC_BASE"
_EXEC_COUNT_ENV = "TORCHRR_EXEC_COUNT"


# Set once an exec closed the recording: the environment changes every exec after it makes (an
# execvp tries each directory of PATH in turn).
_exec_changes: Optional[dict] = None


def _exec_trace_changes(env) -> dict:
    """What lets the image an exec starts record under `torchrr record` (TORCHRR_OUTPUT set):
    FILE.execN.EXT beside FILE.EXT as its trace, N counting the execs, instead of the trace this
    image just closed, and without the variable that says a process already records (None:
    removed). Nothing without TORCHRR_OUTPUT (torchrr.start())."""
    output = env.get("TORCHRR_OUTPUT")
    if not output:
        return {}
    base = env.get(_EXEC_BASE_ENV) or output
    count = int(env.get(_EXEC_COUNT_ENV) or 0) + 1
    stem, ext = os.path.splitext(base)
    return {_EXEC_BASE_ENV: base, _EXEC_COUNT_ENV: str(count),
            "TORCHRR_OUTPUT": f"{stem}.exec{count}{ext or '.trr'}", "TORCHRR_RECORDER_PID": None,
            "TORCHRR_RECORDER_RANK": None}


def _apply_exec_changes(env) -> None:
    for name, value in (_exec_changes or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value


def _close_before_exit_and_exec():
    """os._exit and the os.exec* functions end this image without atexit: the trace would keep
    only the chunks the writer thread had written (none, for a short program), and a replay would
    find nothing. Each now closes this process's recording first; under `torchrr record` an exec's
    new image records too, into FILE.execN.trr (_exec_trace). Installed once; a process that does
    not record goes straight through."""
    global _exit_hooks_installed
    if _exit_hooks_installed:
        return
    _exit_hooks_installed = True
    real_exit, real_execv, real_execve = os._exit, os.execv, os.execve

    def _exit(status):
        if recording():
            stop()
        real_exit(status)

    def execv(path, args):
        global _exec_changes
        if recording() and stop():
            _exec_changes = _exec_trace_changes(os.environ)
            _apply_exec_changes(os.environ)  # os.execv passes this process's environment on.
        real_execv(path, args)

    def execve(path, args, env):
        global _exec_changes
        if recording() and stop():
            _exec_changes = _exec_trace_changes(env)
        if _exec_changes:
            env = dict(env)
            _apply_exec_changes(env)
        real_execve(path, args, env)

    # os.execl, execle, execlp, execlpe, execvp and execvpe all end in os.execv or os.execve.
    _exit.__wrapped__, execv.__wrapped__, execve.__wrapped__ = real_exit, real_execv, real_execve
    os._exit, os.execv, os.execve = _exit, execv, execve


def stop() -> bool:
    """Stops the recording and closes the trace (symbolizing native stacks first). Returns False
    when nothing was recording. Never imports torch."""
    lib = _native.loaded()
    _modules.uninstall()
    stopped = lib is not None and lib.torchrr_stop() == 0
    if _AUTOGRAD_CACHE_BEFORE:
        import torch._functorch.config as config
        config.enable_autograd_cache = _AUTOGRAD_CACHE_BEFORE.pop()
    return stopped


def step() -> None:
    """Marks the start of a training step in the active recording (call it where each step
    begins). From the first call on, the program's marks are the only step boundaries; without
    any, the recorder finds the steps itself. A no-op when nothing records."""
    lib = _native.loaded()
    if lib is not None:
        lib.torchrr_step()


def flush() -> bool:
    """Returns once what the recording recorded so far is in its trace file on disk, as the
    writer thread does on its own every 0.5 s (with keep_last, in the spill file when there is
    one). For a program about to take a risk: a process that is then killed outright leaves it.
    Blocks only the caller. False when nothing records or the trace could not be written; never
    imports torch."""
    lib = _native.loaded()
    return lib is not None and lib.torchrr_flush() == 0


def recording() -> bool:
    """True while a recording started from this process records."""
    lib = _native.loaded()
    return lib is not None and lib.torchrr_recording() == 1


def ops_recorded() -> int:
    lib = _native.loaded()
    return int(lib.torchrr_ops_recorded()) if lib is not None else 0


def exception_type_name(exc_type: type) -> str:
    """``RuntimeError`` for builtins, ``module.Qualname`` otherwise (``torch.OutOfMemoryError``)."""
    module = getattr(exc_type, "__module__", "builtins")
    name = getattr(exc_type, "__qualname__", exc_type.__name__)
    return name if module in ("builtins", None) else f"{module}.{name}"


def record_error(exc: BaseException, kind: int = ERROR_PYTHON) -> None:
    """Records ``exc`` (type name and str()) into the active recording; a no-op when none."""
    lib = _native.loaded()
    if lib is None:
        return
    try:
        message = str(exc)
    except Exception:  # A broken __str__ must not hide the user's exception.
        message = repr(exc)
    lib.torchrr_record_error(int(kind), exception_type_name(type(exc)).encode(),
                             message.encode("utf-8", "replace"))


def record(path: str | os.PathLike = "torchrr.trr", **options) -> "Recording":
    """A context manager that records the block's tensor ops into ``path``: see Recording."""
    return Recording(path, **options)


class Recording:
    """Records the tensor ops run inside a ``with`` block into a trace::

        with torchrr.record("step.trr"):
            loss = model(batch).loss
            loss.backward()          # the in-place RuntimeError is recorded, then re-raised
        report = torchrr.replay("step.trr")

    Takes the same options as start(). An exception leaving the block is recorded into the
    trace (kind 1, its type name and message) before the trace is closed; it is never swallowed.
    When the trace explains it (a violation), the verdict, each culprit and victim line with the
    fix (``torchrr replay --short``), is added to it as a note, so its traceback ends with it.
    ``.recording`` tells whether the recorder started (it prints a warning when it did not).
    """

    def __init__(self, path: str | os.PathLike = "torchrr.trr", **options):
        self.path = os.fspath(path)
        self._options = options
        self.recording = False

    def __enter__(self) -> "Recording":
        self.recording = start(self.path, **self._options)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self.recording:
            if exc is not None:
                record_error(exc)
            stop()
            self.recording = False
            if isinstance(exc, Exception):
                _add_verdict_note(exc, self.path)
        return False


def _add_verdict_note(exc: BaseException, path: str) -> None:
    """Adds `torchrr replay --short`'s verdict of the trace at `path` to `exc` as a note, when it
    has one. Whatever goes wrong here, the user's exception is left as it was."""
    try:
        proc = subprocess.run([_native.cli_path(), "replay", "--short", path],
                              capture_output=True, text=True, timeout=300)
        verdict = proc.stdout.rstrip("\n")
        if verdict and hasattr(exc, "add_note"):  # Python 3.11+.
            exc.add_note(verdict)
    except Exception:  # noqa: BLE001 - never replace the exception the block raised.
        pass
