"""Building a C++ program again with patched sources (torchrr/_fix_cpp_build.py, behind `torchrr
fix --check` for C++): a small CMake project, no torch, built with each generator, whose library
source is patched. The rebuilt program runs the patch, and the build directory and the sources
are left as they were."""
import os
import shutil
import subprocess
import textwrap

import pytest

from torchrr import _fix_cpp_build as build

PROJECT = {
    "CMakeLists.txt": """
        cmake_minimum_required(VERSION 3.16)
        project(tiny CXX)
        set(CMAKE_EXPORT_COMPILE_COMMANDS ON)
        set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
        add_library(value STATIC lib/value.cc)
        target_include_directories(value PUBLIC lib)
        add_executable(tiny main.cc)
        target_link_libraries(tiny PRIVATE value)
        """,
    "lib/value.h": "int Value();\n",
    "lib/value.cc": '#include "value.h"\n\nint Value() { return 1; }  // the value\n',
    "main.cc": '#include <cstdio>\n#include "value.h"\n\n'
               'int main() { std::printf("%d %d\\n", Value(), 10); }\n',
}

GENERATORS = [g for g, tool in (("Ninja", "ninja"), ("Unix Makefiles", "make"))
              if shutil.which(tool)]


def tree(root):
    """Every file under `root` with its size and modification time."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            stat = os.stat(path)
            found[path] = (stat.st_size, stat.st_mtime_ns)
    return found


@pytest.fixture(params=GENERATORS)
def project(request, tmp_path):
    if not shutil.which("cmake"):
        pytest.skip("cmake is not installed")
    source = tmp_path / "source"
    for name, text in PROJECT.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(textwrap.dedent(text).lstrip("\n"))
    out = tmp_path / "build"
    subprocess.run(["cmake", "-S", source, "-B", out, "-G", request.param], check=True,
                   capture_output=True, timeout=120)
    subprocess.run(["cmake", "--build", out], check=True, capture_output=True, timeout=120)
    return source, out


def run(program):
    return subprocess.run([program], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("name, old, new, prints", [
    ("lib/value.cc", "return 1;", "return 2;", "2 10\n"),  # A static library's member.
    ("main.cc", "10);", "20);", "1 20\n"),                  # One of the program's own objects.
])
def test_the_program_is_built_again_with_the_patch(project, tmp_path, name, old, new, prints):
    source, out = project
    program = out / "bin" / "tiny"
    assert run(program) == "1 10\n"
    before = tree(source) | tree(out)
    work = tmp_path / "work"
    work.mkdir()
    text = (source / name).read_text().replace(old, new)
    rebuilt, paths = build.rebuild(str(program), {str(source / name): text}, str(work), 120)
    assert run(rebuilt) == prints
    assert run(program) == "1 10\n"
    assert tree(source) | tree(out) == before, "nothing is written into the build or the sources"
    assert os.path.commonpath([rebuilt, str(work)]) == str(work)
    assert paths == {os.path.realpath(work / "src" / "0"): str((source / name).parent.resolve())}


def test_a_patch_that_does_not_compile_says_so(project, tmp_path):
    source, out = project
    text = (source / "lib/value.cc").read_text().replace("return 1;", "return x;")
    with pytest.raises(build.CompileFailed, match=r"value.cc does not compile: "
                                                 r"\S*source/lib/value.cc:3:\d+: error: .*x"):
        build.rebuild(str(out / "bin" / "tiny"), {str(source / "lib/value.cc"): text},
                      str(tmp_path), 120)


def test_the_build_stops_at_the_timeout(project, tmp_path):
    source, out = project
    with pytest.raises(build.CompileFailed, match="main.cc did not compile "
                                                 "within --timeout"):
        build.rebuild(str(out / "bin" / "tiny"), {str(source / "main.cc"): "int main() {}\n"},
                      str(tmp_path), 1e-6)


def test_what_is_not_rebuilt_is_refused_with_its_reason(project, tmp_path):
    source, out = project
    program = str(out / "bin" / "tiny")
    with pytest.raises(build.CannotRebuild, match="a header"):
        build.rebuild(program, {str(source / "lib/value.h"): "int Value();\n"}, str(tmp_path), 60)
    other = tmp_path / "other.cc"
    other.write_text("int Other() { return 0; }\n")
    with pytest.raises(build.CannotRebuild, match="no command for it"):
        build.rebuild(program, {str(other): other.read_text()}, str(tmp_path), 60)
    os.remove(out / "compile_commands.json")
    with pytest.raises(build.CannotRebuild, match="CMAKE_EXPORT_COMPILE_COMMANDS=ON"):
        build.rebuild(program, {str(source / "main.cc"): "int main() {}\n"}, str(tmp_path), 60)
    lone = tmp_path / "lone" / "tiny"
    lone.parent.mkdir()
    shutil.copy(program, lone)
    with pytest.raises(build.CannotRebuild, match="not in a CMake build directory"):
        build.rebuild(str(lone), {str(source / "main.cc"): "int main() {}\n"}, str(tmp_path), 60)


@pytest.mark.parametrize("command, want", [
    # A launcher before the compiler, and the dependency-file options dropped.
    ("ccache /usr/bin/c++ -DX -MD -MT a.o -MF a.o.d -o a.o -c /src/a.cc",
     ["ccache", "/usr/bin/c++", "-DX", "-o", "/w/0.o", "-c", "-iquote", "/src", "/w/a.cc"]),
    # nvcc takes -I for the original directory.
    ("/usr/local/cuda/bin/nvcc -x cu -c /src/a.cc -o a.o -MFa.d",
     ["/usr/local/cuda/bin/nvcc", "-x", "cu", "-c", "-I", "/src", "/w/a.cc", "-o", "/w/0.o"]),
])
def test_a_compile_command_made_to_compile_the_copy(command, want):
    entry = {"directory": "/b", "command": command, "file": "/src/a.cc"}
    assert build.compile_command(entry, "/w/a.cc", "/w/0.o") == want
