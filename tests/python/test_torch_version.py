"""The recorder records only under the torch it was built against (torchrr_build.json beside the
library): import warns, start() and `torchrr record` refuse, each with one message naming both
versions and how to rebuild; the matching torch records as usual."""
import json
import os
import shutil
import subprocess
import sys

import pytest
from conftest import needs_build, record

import torchrr
from torchrr import _native

INFO = {"torchrr": "0.1.0", "torch": "2.11.0+cu130", "torch_cuda": "13.0", "torch_min": "2.9",
        "torch_max": "2.15"}


def test_the_torch_built_against_is_accepted_whatever_its_local_part():
    assert _native.torch_problem("2.11.0+cu130", INFO) is None
    assert _native.torch_problem("2.11.0", INFO) is None  # pip's metadata drops "+cu130".
    assert _native.torch_problem("2.11.0+cpu", INFO) is None
    assert _native.torch_problem("2.15.0", None) is None  # Nothing known to compare with.


def test_another_torch_names_both_versions_and_the_rebuild():
    problem = _native.torch_problem("2.15.0+cu132", INFO)
    assert "2.11.0+cu130" in problem and "2.15.0+cu132" in problem
    assert "pip install --no-build-isolation" in problem and "make build" in problem


@pytest.mark.parametrize("version", ["2.8.0", "2.16.0", "3.0.0"])
def test_a_torch_outside_the_range_says_which_range(version):
    problem = _native.torch_problem(version, INFO)
    assert f"torch {version} is outside the versions torchrr supports (2.9 to 2.15" in problem


@needs_build
def test_the_build_names_its_torch_and_the_range():
    info = _native.build_info()
    assert info is not None, f"no torchrr_build.json beside {_native.library_path()}"
    import torch
    assert info["torch"] == torch.__version__
    assert (info["torch_min"], info["torch_max"]) == ("2.9", "2.15")
    assert _native.installed_torch_problem() is None


def foreign_library(tmp_path, torch_version):
    """A copy of the recorder's directory whose torchrr_build.json names `torch_version`."""
    lib_dir = tmp_path / "lib"
    shutil.copytree(_native.library_path().parent, lib_dir, symlinks=True,
                    ignore=shutil.ignore_patterns("torchrr"))
    info = json.loads((lib_dir / "torchrr_build.json").read_text())
    info["torch"] = torch_version
    (lib_dir / "torchrr_build.json").write_text(json.dumps(info))
    return lib_dir / "libtorchrr_recorder.so"


@needs_build
def test_import_warns_and_start_refuses_under_another_torch(tmp_path):
    lib = foreign_library(tmp_path, "2.10.0")
    program = (
        "import sys, warnings\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    import torchrr\n"
        "print('warned:', [str(w.message) for w in caught\n"
        "                  if w.category is torchrr.TorchVersionWarning])\n"
        "try:\n"
        "    torchrr.start(sys.argv[1])\n"
        "except RuntimeError as error:\n"
        "    print('refused:', error)\n"
        "import os; print('trace:', os.path.exists(sys.argv[1]))\n")
    env = dict(os.environ, TORCHRR_LIB=str(lib),
               PYTHONPATH=os.path.dirname(torchrr.__path__[0]))
    run = subprocess.run([sys.executable, "-c", program, str(tmp_path / "t.trr")],
                         capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr
    lines = dict(line.split(": ", 1) for line in run.stdout.splitlines())
    assert "built against torch 2.10.0" in lines["warned"], run.stdout
    assert "built against torch 2.10.0" in lines["refused"], run.stdout
    assert "pip install --no-build-isolation" in lines["refused"]
    assert lines["trace"] == "False"


@needs_build
def test_record_refuses_before_running_the_program_under_another_torch(tmp_path):
    lib = foreign_library(tmp_path, "2.10.0")
    marker = tmp_path / "ran"
    program = tmp_path / "train.py"
    program.write_text(f"import torch\nopen({str(marker)!r}, 'w').close()\n")
    # The check runs the program's own interpreter; TORCHRR_LIB points the package at the copy.
    run = record(tmp_path / "t.trr", [sys.executable, program], env={"TORCHRR_LIB": str(lib)})
    assert run.returncode == 9, run.stderr
    assert run.stderr.count("built against torch 2.10.0") == 1, run.stderr
    assert not marker.exists() and not (tmp_path / "t.trr").exists()
    # The same program under the matching torch records.
    run = record(tmp_path / "u.trr", [sys.executable, program])
    assert run.returncode == 0, run.stderr
    assert marker.exists() and (tmp_path / "u.trr").exists()


@needs_build
def test_under_a_launcher_the_program_warns_and_records_nothing(tmp_path):
    # `--python` with a launcher that is not named python*: no check before the run; the
    # sitecustomize refuses in the program, with one warning.
    lib = foreign_library(tmp_path, "2.10.0")
    launcher = tmp_path / "launch"
    launcher.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import torch' \"$@\"\n")
    launcher.chmod(0o755)
    run = record(tmp_path / "t.trr", [launcher], env={"TORCHRR_LIB": str(lib)},
                 flags=["--python"])
    assert run.returncode == 0, run.stderr
    assert "not recording: torchrr: torchrr was built against torch 2.10.0" in run.stderr
    assert not (tmp_path / "t.trr").exists()


def fake_libtorch(root, layout, version):
    """A libtorch_cpu.so in `root` laid out as pip's torch/lib (with torch/version.py) or a
    libtorch archive's libtorch/lib (with build-version), claiming `version`."""
    lib = root / layout / "lib"
    lib.mkdir(parents=True)
    (root / "fake.c").write_text("int fake_torch(void) { return 1; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libtorch_cpu.so", "-o",
                    lib / "libtorch_cpu.so", root / "fake.c"], check=True)
    if layout == "torch":
        (root / layout / "version.py").write_text(f"__version__ = '{version}'\n")
    else:
        (root / layout / "build-version").write_text(version + "\n")
    return lib


PROGRAM = """\
#include <stdio.h>
int fake_torch(void);
int main(int argc, char** argv) {
  FILE* ran = fopen(argv[1], "a");
  fputs("ran\\n", ran);
  fclose(ran);
  return fake_torch() == 1 ? 0 : 1;
}
"""


@needs_build
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
@pytest.mark.parametrize("layout,version,message", [
    ("torch", "2.10.0+cpu", "torchrr was built against torch {built}, and the program loads "
                            "torch 2.10.0+cpu"),
    ("libtorch", "2.8.0+cpu", "the program loads torch 2.8.0+cpu"),
])
def test_record_refuses_a_native_program_on_another_libtorch(tmp_path, layout, version,
                                                              message):
    """A C++ program linked against another libtorch is refused before it runs (the preloaded
    recorder would otherwise bring its own libtorch into it), from the libtorch its loader picks
    and that libtorch's own version file."""
    lib = fake_libtorch(tmp_path, layout, version)
    (tmp_path / "train.c").write_text(PROGRAM)
    program = tmp_path / "train"
    subprocess.run(["cc", "-o", program, tmp_path / "train.c", f"-L{lib}", "-ltorch_cpu",
                    f"-Wl,-rpath,{lib}"], check=True)
    marker = tmp_path / "ran"
    run = record(tmp_path / "t.trr", [program, marker], flags=["--native"])
    assert run.returncode == 9, run.stderr
    built = _native.build_info()["torch"]
    assert run.stderr.count(message.format(built=built)) == 1, run.stderr
    assert str(lib / "libtorch_cpu.so") in run.stderr
    assert not marker.exists() and not (tmp_path / "t.trr").exists()


@needs_build
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_the_native_check_never_runs_a_static_program(tmp_path):
    """A static program would ignore the loader's listing and simply run: it is not asked, and
    runs once, recorded or not."""
    (tmp_path / "static.c").write_text(
        "#include <stdio.h>\n"
        "int main(int argc, char** argv) { FILE* f = fopen(argv[1], \"a\"); fputs(\"ran\\n\", f);"
        " fclose(f); return 0; }\n")
    program = tmp_path / "static"
    built = subprocess.run(["cc", "-static", "-o", program, tmp_path / "static.c"],
                           capture_output=True)
    if built.returncode != 0:
        pytest.skip("no static C library")
    marker = tmp_path / "ran"
    run = record(tmp_path / "t.trr", [program, marker], flags=["--native"])
    assert run.returncode == 0, run.stderr
    assert marker.read_text() == "ran\n"
