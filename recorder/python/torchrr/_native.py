"""Where the native parts are (the recorder library, the ``torchrr`` executable), the torch
they were built against, and the recorder library loaded with ctypes.

They are found, in this order: from ``TORCHRR_LIB`` (the recorder library) and ``TORCHRR_CLI``
(the executable); from ``TORCHRR_BUILD_DIR`` (a build directory); inside this package, in
``lib/`` and ``bin/`` (a wheel: ``pip install``); beside this package when it sits at
``<libdir>/torchrr/python/torchrr`` (``cmake --install``, or the build tree's link to the
checkout's package, which is how ``torchrr record`` runs it), with the executable in
``<prefix>/bin``; from ``_build_dir.txt`` beside this file (the checkout's package, written by
``tools/install_into_venv.sh``); the executable also from PATH.

The recorder is C++ compiled against one torch: loaded into another it fails on an undefined
symbol, or worse, reads that torch's objects with the wrong layout. ``torchrr_build.json``
beside the library names the torch it was built against and the range torchrr supports; the
library is loaded only into that torch (check_torch).
"""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import threading
from pathlib import Path

# Not resolved: through the build tree's link, the package must find that build's libraries.
_HERE = Path(os.path.abspath(__file__)).parent
_RECORDER = "libtorchrr_recorder.so"
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None  # Guarded by _lock.


def build_dir() -> Path | None:
    """The build directory named by TORCHRR_BUILD_DIR or _build_dir.txt, or None."""
    env = os.environ.get("TORCHRR_BUILD_DIR")
    if env:
        return Path(env)
    marker = _HERE / "_build_dir.txt"
    try:
        text = marker.read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def _libdir_in_package() -> Path | None:
    """This package's lib/ when it holds the recorder (a wheel) and TORCHRR_BUILD_DIR does not
    name another build; else None."""
    if os.environ.get("TORCHRR_BUILD_DIR"):
        return None
    libdir = _HERE / "lib"
    return libdir if (libdir / _RECORDER).exists() else None


def _libdir_beside_package() -> Path | None:
    """<libdir> when this package is <libdir>/torchrr/python/torchrr beside the recorder, and
    TORCHRR_BUILD_DIR does not name another build; else None."""
    parents = list(_HERE.parents)
    if (os.environ.get("TORCHRR_BUILD_DIR") or len(parents) < 3 or parents[0].name != "python"
            or parents[1].name != "torchrr"):
        return None
    libdir = parents[2]
    return libdir if (libdir / _RECORDER).exists() else None


def library_path() -> Path:
    env = os.environ.get("TORCHRR_LIB")
    if env:
        return Path(env)
    libdir = _libdir_in_package() or _libdir_beside_package()
    if libdir is not None:
        return libdir / _RECORDER
    build = build_dir()
    if build is None:
        raise RuntimeError(
            "torchrr: the recorder library is not known: run tools/install_into_venv.sh BUILD_DIR "
            f"or set TORCHRR_LIB to {_RECORDER}")
    return build / "lib" / _RECORDER


def cli_path() -> str:
    """The ``torchrr`` executable (see the module's comment for where it is looked for)."""
    env = os.environ.get("TORCHRR_CLI")
    if env:
        return env
    candidates = []
    if _libdir_in_package() is not None:
        candidates.append(_HERE / "bin" / "torchrr")
    libdir = _libdir_beside_package()
    if libdir is not None:
        # <prefix>/lib, or a multiarch <prefix>/lib/x86_64-linux-gnu.
        candidates += [prefix / "bin" / "torchrr" for prefix in list(libdir.parents)[:2]]
    build = build_dir()
    if build is not None:
        candidates.append(build / "bin" / "torchrr")
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("torchrr")
    if found:
        return found
    raise RuntimeError("torchrr: the torchrr executable was not found: build it, run "
                       "tools/install_into_venv.sh BUILD_DIR, or set TORCHRR_CLI")


def build_info(library: Path | None = None) -> dict | None:
    """What the recorder library was built against (``torchrr_build.json`` beside it): keys
    ``torchrr``, ``torch``, ``torch_cuda``, ``torch_min``, ``torch_max``; None when the file is
    missing or unreadable (a build older than the file, or no recorder)."""
    try:
        path = (library or library_path()).parent / "torchrr_build.json"
        return json.loads(path.read_text())
    except (OSError, ValueError, RuntimeError):
        return None


def version() -> str:
    """torchrr's version: that of the build this package uses (``torchrr_build.json``), else the
    installed distribution's, else "unknown"."""
    info = build_info()
    if info and info.get("torchrr"):
        return str(info["torchrr"])
    try:
        from importlib.metadata import PackageNotFoundError, version as installed
        return installed("torchrr")
    except (ImportError, PackageNotFoundError):
        return "unknown"


def _minor(version: str) -> tuple[int, int] | None:
    match = re.match(r"(\d+)\.(\d+)", version)
    return (int(match[1]), int(match[2])) if match else None


_REBUILD = ("rebuild torchrr against this torch: `pip install --no-build-isolation "
            "--force-reinstall --no-deps <torchrr source>` in this environment, or `make build` "
            "in a checkout")


def torch_problem(torch_version: str, info: dict | None) -> str | None:
    """Why the recorder built as ``info`` says cannot record under torch ``torch_version``
    (``torch.__version__``), as one message naming both versions and how to rebuild; None when
    it can, or when ``info`` is None (nothing to compare with)."""
    if not info:
        return None
    low, high, running = _minor(info.get("torch_min", "")), _minor(info.get("torch_max", "")), \
        _minor(torch_version)
    if low and high and running and not low <= running <= high:
        return (f"torch {torch_version} is outside the versions torchrr supports "
                f"({info['torch_min']} to {info['torch_max']}; this torchrr was built against "
                f"torch {info.get('torch')}): install a supported torch, then {_REBUILD}")
    built = info.get("torch")
    # Public versions only: the package metadata omits torch.__version__'s local part (+cu130),
    # and builds of one release for several CUDA versions share their C++ ABI.
    if built and built.split("+")[0] != torch_version.split("+")[0]:
        return (f"torchrr was built against torch {built}, and this Python has torch "
                f"{torch_version}: {_REBUILD}")
    return None


def installed_torch_problem() -> str | None:
    """torch_problem() for the torch this environment has installed, read from its metadata
    without importing it; None when there is none, it is the right one, or no recorder is
    known. Never raises."""
    try:
        from importlib import metadata
        version = metadata.version("torch")
    except Exception:  # No torch (replay needs none), or unreadable metadata.
        return None
    try:
        return torch_problem(version, build_info())
    except Exception:
        return None


class Setting(ctypes.Structure):
    """c_api.h's torchrr_setting."""
    _fields_ = [("name", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class Options(ctypes.Structure):
    """c_api.h's torchrr_options."""
    _fields_ = [("path", ctypes.c_char_p), ("rank", ctypes.c_int),
                ("settings", ctypes.POINTER(Setting)), ("setting_count", ctypes.c_size_t),
                ("error", ctypes.c_char_p), ("error_size", ctypes.c_size_t)]


_ERROR_SIZE = 512


def options(path: str, rank, settings) -> Options:
    """torchrr_options for `path`, `rank` (None: RANK's) and (keyword, text) settings. The
    result keeps the buffers it points into alive."""
    given = Options()
    array = (Setting * max(len(settings), 1))(
        *[Setting(name.encode(), os.fsencode(value)) for name, value in settings])
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    given._keep = (array, error)
    given.path = os.fsencode(path)
    given.rank = -1 if rank is None else int(rank)
    given.settings = ctypes.cast(array, ctypes.POINTER(Setting))
    given.setting_count = len(settings)
    given.error = ctypes.cast(error, ctypes.c_char_p)
    given.error_size = _ERROR_SIZE
    return given


def refusal(given: Options) -> str:
    """Why the recorder refused `given` (its error text)."""
    return os.fsdecode(given._keep[1].value)


def describe(lib: ctypes.CDLL, given: Options) -> str:
    """torchrr_describe_options' "keyword=value" lines for `given`; ValueError when refused."""
    out = ctypes.create_string_buffer(16 << 10)
    if lib.torchrr_describe_options(ctypes.byref(given), out, len(out)) == 2:
        raise ValueError(f"torchrr.start: {refusal(given)}")
    return os.fsdecode(out.value)


def library() -> ctypes.CDLL:
    """The recorder library, loaded once. Imports torch first, so that the library binds to the
    libtorch this process already uses; raises RuntimeError (torch_problem's message) when that
    torch is not the one the library was built against. ctypes.CDLL (not PyDLL) releases the GIL
    during calls: torchrr_stop waits for op callbacks that may be taking the GIL to capture a
    Python stack."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        import torch  # (loads libtorch before the recorder library)

        path = library_path()
        if not path.exists():
            raise RuntimeError(f"torchrr: {path} not found: is the recorder built?")
        problem = torch_problem(torch.__version__, build_info(path))
        if problem:
            raise RuntimeError(f"torchrr: {problem}")
        lib = ctypes.CDLL(str(path))
        lib.torchrr_start_with.argtypes = [ctypes.POINTER(Options)]
        lib.torchrr_start_with.restype = ctypes.c_int
        lib.torchrr_describe_options.argtypes = [ctypes.POINTER(Options), ctypes.c_char_p,
                                                 ctypes.c_size_t]
        lib.torchrr_describe_options.restype = ctypes.c_int
        lib.torchrr_step.argtypes = []
        lib.torchrr_step.restype = None
        lib.torchrr_fingerprint.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                                            ctypes.POINTER(ctypes.c_uint64)]
        lib.torchrr_fingerprint.restype = ctypes.c_int
        lib.torchrr_set_module.argtypes = [ctypes.c_char_p]
        lib.torchrr_set_module.restype = None
        lib.torchrr_flush.argtypes = []
        lib.torchrr_flush.restype = ctypes.c_int
        lib.torchrr_start_from_environment.argtypes = []
        lib.torchrr_start_from_environment.restype = ctypes.c_int
        lib.torchrr_stop.argtypes = []
        lib.torchrr_stop.restype = ctypes.c_int
        lib.torchrr_recording.argtypes = []
        lib.torchrr_recording.restype = ctypes.c_int
        lib.torchrr_record_error.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p]
        lib.torchrr_record_error.restype = None
        lib.torchrr_ops_recorded.argtypes = []
        lib.torchrr_ops_recorded.restype = ctypes.c_uint64
        lib.torchrr_python_stack_walker.argtypes = []
        lib.torchrr_python_stack_walker.restype = ctypes.c_char_p
        _lib = lib
        return lib


def loaded() -> ctypes.CDLL | None:
    """The library when already loaded, else None (never loads it, never imports torch)."""
    return _lib
