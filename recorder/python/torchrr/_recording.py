"""Recording from Python: record() (a context manager), start() and stop()."""
from __future__ import annotations

import os
from typing import Optional

from . import _native

# torchrr_start's flags (c_api.h).
_VERIFY_SAVED = 1
_NO_CUDA_KERNELS = 2
_ALL_OPS = 4
_FOLLOW_FORKS = 8
_NO_SOURCE = 16

# Error kinds of torchrr_record_error (format::ErrorKind).
ERROR_CPP = 0
ERROR_PYTHON = 1
ERROR_UNCAUGHT = 2


def start(path: str | os.PathLike = "torchrr.trr", *, native_stacks: bool = False,
          python_stacks: bool = True, max_buffered_bytes: int = 0,
          drop_when_full: bool = False, rank: Optional[int] = None,
          verify_saved: bool = False, cuda_kernels: bool = True,
          all_ops: bool = False, follow_forks: bool = False, source: bool = True,
          keep_last: int = 0, keep_last_bytes: int = 0,
          steps: Optional[tuple] = None,
          spill: Optional[str | os.PathLike] = None) -> bool:
    """Starts recording every tensor op autograd sees in this process into ``path``.

    native_stacks: a C++ stack per top-level op (symbolized when the trace closes). Off by
    default, as under ``torchrr record`` for a Python program: the user's lines are in the Python
    frames, the C++ frames are the interpreter's and torch's, and unwinding them costs more than
    the op. python_stacks: the Python frames that issued each top-level op.
    max_buffered_bytes: memory for records waiting for the writer thread (0: the default, 256
    MiB). drop_when_full: drop records (and say so in the trace) rather than wait for the writer.
    rank: the distributed rank written to the trace (None reads RANK). verify_saved: fingerprint
    every saved tensor's bytes when it is saved and when backward uses it, so that writes no
    version counter sees (numpy, raw CUDA kernels, extensions) are reported as ``silent``; costs a
    pass over the saved bytes at save and at use. cuda_kernels: record CUDA kernels, copies and
    memsets through CUPTI, each with the op that launched it (only when a GPU is present).
    all_ops: also the ops folded by default into the op they run in: those a kernel runs below
    autograd, and those of a backward formula that write none of their arguments (they create no
    autograd node and bump no version counter; the op around them stands for them); about 60% of
    a training step's ops. On with verify_saved. follow_forks: a process forked from this one
    (os.fork, DataLoader workers with the fork start method) records into a trace of its own,
    ``FILE.pidN.trr`` beside ``path``, closed when it exits (a multiprocessing child's too, which
    ends with os._exit; not one that calls os._exit itself); without it a forked process records
    nothing. source: the lines around each line of user code the stacks name (not torch's,
    site-packages' or the standard library's) go into the trace with each file's hash, so that it
    replays with its code on a machine without the sources; False leaves the code out.
    keep_last: keep only the last N steps of the run (0: all), in memory and compressed, at most
    keep_last_bytes of them (0: 1 GiB), written when the recording stops (at exit, at an uncaught
    exception, or when SIGTERM, SIGINT or SIGABRT ends the process); step() marks steps, else the
    recorder finds them (a backward pass, the forward ops before it, the optimizer after it).
    spill: with keep_last, a directory (created if missing) where the kept steps are also kept on
    disk, in one trace file named after ``path`` and the step under way (``run.step00000900.trr``),
    so that a process killed outright (SIGKILL, the OOM killer) leaves them behind; removed once
    the trace at ``path`` is written.
    steps: (first, last) keeps only those steps (0-based, inclusive; last None: to the end), and
    writes the trace as soon as a step after ``last`` begins.

    torch.compile: until stop(), AOTAutograd's cache is off (unless TORCHINDUCTOR_AUTOGRAD_CACHE
    is set), so that each compiled region is traced and its saved tensors are named by the lines
    inside it that use them; this changes compile time only.

    Returns True when recording, False when not (already recording, or the file could not be
    opened: the recorder printed a warning saying which). Imports torch. Thread-safe.
    """
    lib = _native.library()
    if keep_last < 0 or keep_last_bytes < 0:
        raise ValueError("keep_last and keep_last_bytes must be 0 or more")
    first, last = 1, 0  # Every step.
    if steps is not None:
        first, last = steps
        last = 2**64 - 1 if last is None else last
        if not 0 <= first <= last:
            raise ValueError("steps must be (first, last) with 0 <= first <= last")
        if keep_last:
            raise ValueError("steps and keep_last exclude each other")
    spill_dir = None
    if spill is not None:
        if not keep_last:
            raise ValueError("spill needs keep_last")
        os.makedirs(spill, exist_ok=True)
        spill_dir = os.fsencode(os.fspath(spill))
    rc = lib.torchrr_start_keeping(os.fsencode(os.fspath(path)), int(bool(native_stacks)),
                                   int(bool(python_stacks)), int(max_buffered_bytes),
                                   int(bool(drop_when_full)), -1 if rank is None else int(rank),
                                   (_VERIFY_SAVED if verify_saved else 0) |
                                   (0 if cuda_kernels else _NO_CUDA_KERNELS) |
                                   (_ALL_OPS if all_ops else 0) |
                                   (_FOLLOW_FORKS if follow_forks else 0) |
                                   (0 if source else _NO_SOURCE),
                                   int(keep_last), int(keep_last_bytes), int(first), int(last),
                                   spill_dir)
    if rc == 0:
        _close_in_forked_children()
        _trace_compiled_regions()
    return rc == 0


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


def stop() -> bool:
    """Stops the recording and closes the trace (symbolizing native stacks first). Returns False
    when nothing was recording. Never imports torch."""
    lib = _native.loaded()
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
        return False
