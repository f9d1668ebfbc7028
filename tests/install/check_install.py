#!/usr/bin/env python3
"""`cmake --install` into a scratch prefix stands alone: `PREFIX/bin/torchrr record` records a C++
program (its preload library from the prefix) and a Python one (the sitecustomize, the package and
the recorder library from the prefix, even with the checkout's package importable); the package,
put on PYTHONPATH, records in process with the prefix's library; and nothing installed that is
read at run time names the source or the build tree (no ELF run path, no Python or CMake file, no
string in the command line).

Usage: check_install.py CMAKE BUILD_DIR SOURCE_DIR LIBDIR PYTHON CXX_PROGRAM WORK_DIR
CXX_PROGRAM: tests/recorder's exit_modes (`return` runs a backward and returns 0).
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

cmake, build, source, libdir, python, cxx_program, work = sys.argv[1:8]
work = Path(work)
shutil.rmtree(work, ignore_errors=True)
work.mkdir(parents=True)
prefix = work / "prefix"
problems = []


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


install = run([cmake, "--install", build, "--prefix", prefix, "--strip"])
if install.returncode != 0:
    sys.exit(f"FAIL cmake --install: {install.stderr.strip()}")

cli = prefix / "bin" / "torchrr"
lib = prefix / libdir
package = lib / "torchrr" / "python" / "torchrr"
for path in (cli, lib / "libtorchrr_recorder.so", lib / "libtorchrr_preload.so",
             package / "__init__.py", package / "_sitecustomize" / "sitecustomize.py"):
    if not path.exists():
        problems.append(f"not installed: {path.relative_to(prefix)}")
if (package / "_build_dir.txt").exists():
    problems.append("the checkout's _build_dir.txt was installed")

# Paths of the trees the install must not lean on (a venv inside the checkout is torch's home,
# not the checkout's: only the source's own directories count).
trees = [str(Path(build).resolve())] + [str(Path(source).resolve() / d) for d in
                                        ("recorder", "replayer", "format", "kernels", "cmake")]
for path in sorted(p for p in prefix.rglob("*") if p.is_file()):
    data = path.read_bytes()
    name = path.relative_to(prefix)
    if data.startswith(b"\x7fELF"):
        dynamic = run(["readelf", "-d", path]).stdout
        if any(tree in dynamic for tree in trees):
            problems.append(f"{name}: its run path names the source or build tree")
        if path == cli and any(tree.encode() in data for tree in trees):
            problems.append(f"{name}: names the source or build tree")
    elif any(tree.encode() in data for tree in trees):
        problems.append(f"{name}: names the source or build tree")

env = {k: v for k, v in os.environ.items()
       if k not in ("TORCHRR_BUILD_DIR", "TORCHRR_LIB", "TORCHRR_CLI", "PYTHONPATH")}
env.setdefault("OMP_NUM_THREADS", "1")

trace = work / "cxx.trr"
rec = run([cli, "record", "-o", trace, "--", cxx_program, "return"], env=env)
info = run([cli, "info", trace], env=env)
if rec.returncode != 0 or info.returncode != 0:
    problems.append(f"C++ program: record exit {rec.returncode}, info exit {info.returncode}: "
                    f"{rec.stderr.strip()[-1000:]} {info.stderr.strip()}")

script = work / "step.py"
script.write_text(
    "import torch, torchrr\n"
    "from torchrr import _native\n"
    "x = torch.ones(3, requires_grad=True)\n"
    "(x * 2).sum().backward()\n"
    "print(torchrr.recording(), torchrr.__file__, _native.library_path(), sep='\\n')\n")
trace = work / "python.trr"
rec = run([cli, "record", "-o", trace, "--", python, script], env=env)
lines = rec.stdout.split("\n")
if rec.returncode != 0 or len(lines) < 3:
    problems.append(f"Python program: record exit {rec.returncode}: {rec.stderr.strip()[-1000:]}")
else:
    recording, package_file, library = lines[:3]
    if recording != "True":
        problems.append(f"Python program: not recording: {rec.stderr.strip()[-1000:]}")
    for what, path in (("package", package_file), ("recorder library", library)):
        if not Path(path).resolve().is_relative_to(prefix.resolve()):
            problems.append(f"Python program: the {what} is {path}, not the prefix's")
    replay = run([cli, "replay", trace], env=env)
    if replay.returncode != 0:
        problems.append(f"Python program: replay exit {replay.returncode}: {replay.stderr}")

# In process: the installed package on PYTHONPATH finds its library and command line.
script = work / "in_process.py"
script.write_text(
    "import sys, torch, torchrr\n"
    "from torchrr import _native\n"
    "with torchrr.record(sys.argv[1]):\n"
    "    recording = torchrr.recording()\n"
    "    torch.ones(2, requires_grad=True).sum().backward()\n"
    "print(recording, torchrr.__file__, _native.library_path(), _native.cli_path(), "
    "torchrr.replay(sys.argv[1]).ops > 0, sep='\\n')\n")
trace = work / "in_process.trr"
run_py = run([python, script, trace], env=dict(env, PYTHONPATH=str(package.parent)))
lines = run_py.stdout.split("\n")
if run_py.returncode != 0 or lines[:1] != ["True"] or lines[4:5] != ["True"]:
    problems.append(f"in process: exit {run_py.returncode}, output {lines}: "
                    f"{run_py.stderr.strip()[-1000:]}")
else:
    for what, path in zip(("package", "recorder library", "command line"), lines[1:4]):
        if not Path(path).resolve().is_relative_to(prefix.resolve()):
            problems.append(f"in process: the {what} is {path}, not the prefix's")

for problem in problems:
    print("FAIL " + problem)
print("PASS" if not problems else f"{len(problems)} problems")
sys.exit(1 if problems else 0)
