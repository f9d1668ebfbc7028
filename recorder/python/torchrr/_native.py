"""Where the native build is, and the recorder library loaded with ctypes.

The build directory comes from ``TORCHRR_BUILD_DIR``, else from ``_build_dir.txt`` beside this
file (written by ``tools/install_into_venv.sh``). ``TORCHRR_LIB`` overrides the recorder library
and ``TORCHRR_CLI`` the ``torchrr`` executable.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_lock = threading.Lock()
_lib: ctypes.CDLL | None = None  # Guarded by _lock.


def build_dir() -> Path | None:
    """The native build directory, or None when it is not known."""
    env = os.environ.get("TORCHRR_BUILD_DIR")
    if env:
        return Path(env)
    marker = _HERE / "_build_dir.txt"
    try:
        text = marker.read_text().strip()
    except OSError:
        return None
    return Path(text) if text else None


def library_path() -> Path:
    env = os.environ.get("TORCHRR_LIB")
    if env:
        return Path(env)
    build = build_dir()
    if build is None:
        raise RuntimeError(
            "torchrr: the recorder library is not known: run tools/install_into_venv.sh BUILD_DIR "
            "or set TORCHRR_LIB to libtorchrr_recorder.so")
    return build / "lib" / "libtorchrr_recorder.so"


def cli_path() -> str:
    """The ``torchrr`` executable: TORCHRR_CLI, the build's bin/torchrr, or one on PATH."""
    env = os.environ.get("TORCHRR_CLI")
    if env:
        return env
    build = build_dir()
    if build is not None and (build / "bin" / "torchrr").exists():
        return str(build / "bin" / "torchrr")
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
