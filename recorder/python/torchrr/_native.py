"""Where the native parts are (the recorder library, the ``torchrr`` executable), and the
recorder library loaded with ctypes.

They are found, in this order: from ``TORCHRR_LIB`` (the recorder library) and ``TORCHRR_CLI``
(the executable); from ``TORCHRR_BUILD_DIR`` (a build directory); beside this package when it
sits at ``<libdir>/torchrr/python/torchrr`` (an install, or the build tree's link to the
checkout's package, which is how ``torchrr record`` runs it), with the executable in
``<prefix>/bin``; from ``_build_dir.txt`` beside this file (the checkout's package, written by
``tools/install_into_venv.sh``); the executable also from PATH.
"""
from __future__ import annotations

import ctypes
import os
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
    libdir = _libdir_beside_package()
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


def library() -> ctypes.CDLL:
    """The recorder library, loaded once. Imports torch first, so that the library binds to the
    libtorch this process already uses. ctypes.CDLL (not PyDLL) releases the GIL during calls:
    torchrr_stop waits for op callbacks that may be taking the GIL to capture a Python stack."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        import torch  # noqa: F401  (loads libtorch before the recorder library)

        path = library_path()
        if not path.exists():
            raise RuntimeError(f"torchrr: {path} not found: is the recorder built?")
        lib = ctypes.CDLL(str(path))
        lib.torchrr_start.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                                      ctypes.c_uint32]
        lib.torchrr_start.restype = ctypes.c_int
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
