"""Building a C++ program again with patched sources, for ``torchrr fix --check``: the program's
CMake build directory (the one above its executable) gives each source file's compile command
(compile_commands.json, CMAKE_EXPORT_COMPILE_COMMANDS) and the executable's link command (Ninja:
``ninja -t commands -s``; Unix Makefiles: the target's ``link.txt``). Each patched file is
compiled from its copy into an object in the work directory, and the executable is linked again
into the work directory with those objects in place of the old ones: put before the libraries,
an object of a static library's is taken instead of the library's member. Nothing is written
into the build directory or beside the sources: the compile commands' dependency-file options
are dropped, and the copy's quoted includes are looked up in the original file's directory.

Refused, with one line saying why (CannotRebuild): a program with no CMake build above it, a build
without compile_commands.json, another generator, a patched header (every file including it
would have to be compiled again), a file whose object goes into a shared library.

Standard library only.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from typing import Optional

# Compile options that write beside the object (dependency files), dropped with their argument
# where they take one.
_DEPFILE_FLAGS = {"-MD": 0, "-MMD": 0, "-MF": 1, "-MT": 1, "-MQ": 1}
_SOURCE_EXTENSIONS = (".cc", ".cpp", ".cxx", ".c++", ".cu")


class CannotRebuild(Exception):
    """The program cannot be built again here; the message says why, in one line."""


def build_directory(executable: str) -> str:
    """The CMake build directory the executable lies in (the nearest with a CMakeCache.txt)."""
    directory = os.path.dirname(os.path.realpath(executable))
    while True:
        if os.path.isfile(os.path.join(directory, "CMakeCache.txt")):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            raise CannotRebuild(f"{executable} is not in a CMake build directory (none of the "
                                "directories above it holds a CMakeCache.txt)")
        directory = parent


def _cache(build: str) -> dict:
    values = {}
    with open(os.path.join(build, "CMakeCache.txt"), errors="replace") as f:
        for line in f:
            name, eq, value = line.rstrip("\n").partition("=")
            if eq and not name.startswith(("#", "//")):
                values[name.split(":")[0]] = value
    return values


def _arguments(entry: dict) -> list:
    return list(entry["arguments"]) if "arguments" in entry else shlex.split(entry["command"])


def _compile_entries(build: str) -> list:
    database = os.path.join(build, "compile_commands.json")
    try:
        with open(database) as f:
            return json.load(f)
    except (OSError, ValueError) as error:
        raise CannotRebuild(f"{database} cannot be read ({error}): configure the build with "
                            "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON") from None


def _compile_entry(entries: list, build: str, path: str) -> dict:
    wanted = os.path.realpath(path)
    for entry in entries:
        file = os.path.join(entry.get("directory", build), entry.get("file", ""))
        if os.path.realpath(file) == wanted:
            return entry
    raise CannotRebuild(f"{path} is not compiled by the build in {build} "
                        "(compile_commands.json has no command for it)")


def _option_value(args: list, flag: str) -> Optional[str]:
    for index, arg in enumerate(args[:-1]):
        if arg == flag:
            return args[index + 1]
    return None


def compile_command(entry: dict, copy: str, obj: str) -> list:
    """The entry's compile command made to compile `copy` into `obj`: without its dependency-file
    options, with the original file's directory searched for quoted includes (the copy's own
    directory holds only the copy)."""
    args, out, skip = _arguments(entry), [], 0
    original = os.path.join(entry.get("directory", ""), entry["file"])
    real = os.path.realpath(original)
    for arg in args:
        if skip:
            skip -= 1
            continue
        if arg in _DEPFILE_FLAGS:
            skip = _DEPFILE_FLAGS[arg]
            continue
        if arg.startswith(("-MF", "-MT", "-MQ")) and len(arg) > 3:
            continue
        out.append(arg)
    source = None
    for index, arg in enumerate(out):
        if arg == "-o" and index + 1 < len(out):
            out[index + 1] = obj
        elif arg == entry["file"] or arg == original or \
                os.path.realpath(os.path.join(entry.get("directory", ""), arg)) == real and \
                not arg.startswith("-"):
            out[index] = copy
            source = index
    if source is None:
        raise CannotRebuild(f"the compile command of {original} does not name it")
    # Before the source, not after the compiler: the command may start with a launcher (ccache).
    # nvcc takes no -iquote; its -I comes after the file's own directory all the same.
    quote = "-I" if any(os.path.basename(a) == "nvcc" for a in out[:source]) else "-iquote"
    return [*out[:source], quote, os.path.dirname(real), *out[source:]]


def link_command(build: str, executable: str) -> tuple:
    """(the directory the executable's link command runs in, the command as a shell line)."""
    cache = _cache(build)
    generator = cache.get("CMAKE_GENERATOR", "")
    target = os.path.relpath(os.path.realpath(executable), build)
    if generator.startswith("Ninja"):
        ninja = cache.get("CMAKE_MAKE_PROGRAM") or "ninja"
        proc = subprocess.run([ninja, "-C", build, "-t", "commands", "-s", target],
                              capture_output=True, text=True)
        lines = [line for line in proc.stdout.splitlines() if line.strip()]
        if proc.returncode != 0 or not lines:
            raise CannotRebuild(f"ninja gives no command that builds {target} in {build}")
        return build, lines[-1]
    if generator == "Unix Makefiles":
        wanted = os.path.realpath(executable)
        for directory, dirs, files in os.walk(build):
            if "link.txt" not in files or not directory.endswith(".dir"):
                continue
            # CMakeFiles/NAME.dir/link.txt runs in the directory above CMakeFiles.
            runs_in = os.path.dirname(os.path.dirname(directory))
            with open(os.path.join(directory, "link.txt"), errors="replace") as f:
                lines = [line.strip() for line in f if line.strip()]
            for line in lines:
                out = _option_value(shlex.split(line), "-o")
                if out and os.path.realpath(os.path.join(runs_in, out)) == wanted:
                    return runs_in, line
        raise CannotRebuild(f"no link.txt in {build} links {target}")
    raise CannotRebuild(f"the build in {build} uses the {generator or 'unknown'} generator: only "
                        "Ninja and Unix Makefiles builds are rebuilt")


def _in_static_library(obj: str, link: str, runs_in: str) -> bool:
    """Whether a static library the link command names has a member named like `obj`."""
    member = os.path.basename(obj)
    for word in shlex.split(link):
        if not word.endswith(".a"):
            continue
        proc = subprocess.run(["ar", "t", os.path.join(runs_in, word)], capture_output=True,
                              text=True)
        if member in proc.stdout.split():
            return True
    return False


def relink(runs_in: str, link: str, executable: str, objects: dict, out: str) -> str:
    """The link command made to write `out`, with each object of `objects` (old path, relative
    to `runs_in` where the link command runs, -> new path) in place of the old one, or,
    for an object of a static library, before the command's output option (ahead of the
    libraries, whose member the linker then does not need)."""
    words = shlex.split(link)
    old_out = _option_value(words, "-o")
    if old_out is None:
        raise CannotRebuild(f"the link command of {executable} has no -o")
    line = re.sub(r"(?<!\S)-o\s+" + re.escape(old_out) + r"(?!\S)",
                  lambda _: "-o " + shlex.quote(out), link, count=1)
    ahead = []
    for old, new in objects.items():
        replaced = re.sub(r"(?<!\S)" + re.escape(old) + r"(?!\S)",
                          lambda _: shlex.quote(new), line)
        if replaced != line:
            line = replaced
        elif _in_static_library(old, link, runs_in):
            ahead.append(shlex.quote(new))
        else:
            raise CannotRebuild(f"{old} goes into neither {executable} nor a static library it "
                                "links (a shared library is not rebuilt)")
    if ahead:
        line = re.sub(r"(?<!\S)-o\s", lambda m: " ".join(ahead) + " " + m.group(0), line,
                      count=1)
    return line


def rebuild(executable: str, texts: dict, workdir: str, timeout: float) -> tuple:
    """Builds `executable` again into `workdir` with `texts` (source path -> patched text),
    within `timeout` seconds for every compile and the link together. Returns (the new
    executable, {the copy's directory: the original's} for naming the user's files). Raises
    CannotRebuild, or CompileFailed when the compiler or the linker fails or runs out of time."""
    deadline = time.monotonic() + timeout
    build = build_directory(executable)
    for path in texts:
        if not path.lower().endswith(_SOURCE_EXTENSIONS):
            raise CannotRebuild(f"the patch edits {path}, a header: every file that includes it "
                                "would have to be compiled again; apply the patch and rebuild")
    runs_in, link = link_command(build, executable)
    entries = _compile_entries(build)
    objects, paths = {}, {}
    for number, (path, text) in enumerate(sorted(texts.items())):
        entry = _compile_entry(entries, build, path)
        directory = os.path.join(workdir, "src", str(number))
        os.makedirs(directory, exist_ok=True)
        copy = os.path.join(directory, os.path.basename(path))
        with open(copy, "w") as f:
            f.write(text)
        paths[os.path.realpath(directory)] = os.path.dirname(os.path.realpath(path))
        obj = os.path.join(workdir, "obj", f"{number}.o")
        os.makedirs(os.path.dirname(obj), exist_ok=True)
        _run(compile_command(entry, copy, obj), entry.get("directory", build), deadline,
             path, "compile", {copy: path})
        old = _option_value(_arguments(entry), "-o")
        if old is None:
            raise CannotRebuild(f"the compile command of {path} has no -o")
        old = os.path.relpath(os.path.join(entry.get("directory", build), old), runs_in)
        objects[old] = obj
    out = os.path.join(workdir, "bin", os.path.basename(executable))
    os.makedirs(os.path.dirname(out), exist_ok=True)
    _run(relink(runs_in, link, executable, objects, out), runs_in, deadline,
         executable, "link")
    return out, paths


class CompileFailed(Exception):
    """The compiler or the linker failed on the patched program: the first error line."""


def _run(command, cwd: str, deadline: float, what: str, verb: str,
         names: Optional[dict] = None) -> None:
    """Runs the command that makes `what` `verb` (compile, link) until `deadline`
    (time.monotonic()); `names` (copy -> the user's file) renames the files in the error it
    reports."""
    left = deadline - time.monotonic()
    try:
        if left <= 0:
            raise subprocess.TimeoutExpired(command, 0)
        proc = subprocess.run(command, cwd=cwd, shell=isinstance(command, str),
                              capture_output=True, text=True, timeout=left,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise CompileFailed(f"{what} did not {verb} within --timeout") from None
    except OSError as error:
        raise CannotRebuild(f"{what} cannot {verb}: {error}") from None
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "error" in line]
        lines = errors or [line for line in proc.stderr.splitlines() if line.strip()]
        first = lines[0].strip() if lines else ""
        for copy, path in (names or {}).items():
            first = first.replace(copy, path)
        raise CompileFailed(f"{what} does not {verb}" + (f": {first}" if first else ""))
