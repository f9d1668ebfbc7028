"""torchrr's sitecustomize: records an unchanged Python program under ``torchrr record``.

``torchrr record -o FILE -- python ...`` puts this directory first on PYTHONPATH and sets
TORCHRR_OUTPUT (absolute) and the TORCHRR_* variables of the options it was given, which the
recorder reads (torchrr_start_from_environment in c_api.h says which, and their defaults). Here:

- Any sitecustomize found later on sys.path (the user's, the distribution's) runs first, as if
  this one were not there.
- Recording starts right after ``import torch`` completes (an import hook on sys.meta_path),
  before the program can run a tensor op, with the torchrr package this file belongs to (that of
  the ``torchrr record`` running the program), imported as ``torchrr`` for the whole program.
- Which process records: the first Python process of the run that is not a launcher; under a
  launcher (torchrun, ``python -m torch.distributed.run``, ``accelerate launch``, deepspeed's)
  every worker (RANK set), each into FILE.rankN.trr, the launcher itself nothing. Processes the
  recording process starts (DataLoader workers, subprocesses, torch.multiprocessing.spawn's
  workers) record nothing, but under ``--follow-forks`` (forked ones, whose recording the
  recorder starts itself, and Python ones started afresh, which start their own here: each into
  FILE.pidN.trr), and for distributed workers of another rank than its own (a launcher torchrr
  does not know: RANK set, and not the recording process's). Without ``--follow-forks``, the
  recording process warns once when it starts a Python process (torchrr._recording).
- An exec keeps recording: the image it starts records into FILE.execN.trr (torchrr._recording).
- The program's uncaught exception is recorded as an error (kind 1, its type and message) by a
  sys.excepthook that then calls the previous hook; the trace is closed at exit (atexit).

Nothing here raises into the program: trouble prints one ``torchrr: warning:`` line.
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
# Set in the recording process (inherited by its children, which then do not record).
_RECORDER_PID_ENV = "TORCHRR_RECORDER_PID"
# The recording process's RANK ("" without one): a child of another rank records all the same.
_RECORDER_RANK_ENV = "TORCHRR_RECORDER_RANK"
# --follow-forks: children record too, each into a trace of its own.
_FOLLOW_ENV = "TORCHRR_FOLLOW_FORKS"


def _warn(message):
    sys.stderr.write(f"torchrr: warning: {message}\n")


def _package_file(name, failed):
    """The globals of torchrr/NAME run by its path: importing the torchrr package here would
    load the recorder before the program's torch. None, with a warning that says `failed`, when
    it cannot run (a torchrr install without the file): the program goes on."""
    import runpy
    try:
        return runpy.run_path(os.path.join(os.path.dirname(_HERE), name))
    except Exception as error:
        _warn(f"{failed}: {error!r}")
        return None


def _switch_on(name):
    """Whether the TORCHRR_* switch `name` is on as the recorder reads it
    (torchrr/_env_switch.py); off, the recorder's default, when that file cannot run."""
    module = _package_file("_env_switch.py", f"{name} read as off")
    return module is not None and module["switch_on"](name)


def _chain_to_next_sitecustomize():
    """Runs the sitecustomize this one hides (the next one on sys.path), as site.py would
    (torchrr/_site_chain.py)."""
    chain = _package_file("_site_chain.py", "the sitecustomize after torchrr's did not run")
    if chain is not None:
        chain["run_next_sitecustomize"](_HERE)


# Launchers that start the ranks and run no tensor op of their own: as a console script (its name,
# and the subcommand that launches when there is one) and as a module.
_LAUNCHER_SCRIPTS = {"torchrun": None, "accelerate": "launch", "deepspeed": None}
_LAUNCHER_MODULES = ("torch.distributed.run", "torch.distributed.launch",
                     "accelerate.commands.launch", "deepspeed.launcher.runner",
                     "deepspeed.launcher.launch")


def _is_launcher():
    """True in a distributed launcher (torchrun, accelerate launch, deepspeed's): it records
    nothing, the workers it starts do."""
    if "RANK" in os.environ:
        return False
    argv = list(getattr(sys, "orig_argv", None) or sys.argv)
    for i, arg in enumerate(argv[:3]):
        name = os.path.basename(arg)
        if name in _LAUNCHER_SCRIPTS:
            subcommand = _LAUNCHER_SCRIPTS[name]
            if subcommand is None or subcommand in argv[i + 1:i + 2]:
                return True
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in _LAUNCHER_MODULES:
            return True
    return False


def _own_trace():
    """Points TORCHRR_OUTPUT (FILE.EXT) at FILE.pidN.EXT for this process, as the recorder names
    a forked child's trace."""
    stem, ext = os.path.splitext(os.environ.get("TORCHRR_OUTPUT", ""))
    os.environ["TORCHRR_OUTPUT"] = f"{stem}.pid{os.getpid()}{ext or '.trr'}"


def _should_record():
    """Whether this process records (the module's docstring says which do)."""
    if os.environ.get(_RECORDER_PID_ENV):
        rank = os.environ.get("RANK")
        if rank is None or rank == os.environ.get(_RECORDER_RANK_ENV, ""):
            if not _switch_on(_FOLLOW_ENV):
                return False
            if _is_launcher():
                return False
            _own_trace()
            return True
    return not _is_launcher()


def _import_torchrr():
    """The package this file belongs to: the recorder of the ``torchrr record`` that runs the
    program, whichever other torchrr this interpreter could import."""
    root = os.path.dirname(os.path.dirname(_HERE))
    sys.path.insert(0, root)
    try:
        import torchrr
    finally:
        sys.path.remove(root)
    return torchrr


def _start_recording():
    if not _should_record():
        return
    try:
        torchrr = _import_torchrr()
        from torchrr import _recording

        started = _recording.start_from_environment()  # Under torchrun, FILE.rankN.trr.
    except Exception as error:
        _warn(f"not recording: {error}")
        return
    if not started:
        return  # The recorder printed why.
    locate = os.environ.pop("TORCHRR_LOCATE_WRITE", "")
    if locate:
        try:
            from torchrr import _locate

            _locate.install(locate)
        except Exception as error:
            _warn(f"--locate-write: {error}")
    os.environ[_RECORDER_PID_ENV] = str(os.getpid())
    os.environ[_RECORDER_RANK_ENV] = os.environ.get("RANK", "")

    previous_hook = sys.excepthook

    def excepthook(exc_type, exc, tb):
        try:
            torchrr.record_error(exc)
        except Exception:
            pass
        previous_hook(exc_type, exc, tb)

    sys.excepthook = excepthook

    import atexit

    def close():
        try:
            torchrr.stop()
        except Exception as error:
            _warn(f"closing the trace: {error}")

    atexit.register(close)


class _AfterTorchImport:
    """A meta-path finder that wraps torch's loader once, to start recording right after
    ``torch/__init__.py`` ran (torch loaded: the recorder binds to its libtorch)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _StartAfterExec(spec.loader)
        return spec


class _StartAfterExec:
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        # torch sees its own loader (inspect, importlib.resources use it).
        module.__loader__ = self._inner
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._inner
        self._inner.exec_module(module)
        _start_recording()

    def __getattr__(self, name):
        return getattr(self._inner, name)


_chain_to_next_sitecustomize()
if os.environ.get("TORCHRR_OUTPUT") and _should_record():
    if "torch" in sys.modules:
        _start_recording()
    else:
        sys.meta_path.insert(0, _AfterTorchImport())
