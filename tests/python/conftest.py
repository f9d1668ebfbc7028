"""Shared helpers for the Python tests: the native build, `torchrr record`, and marker lines.

The tests need the native build (the recorder library and the CLI) made visible to the venv by
tools/install_into_venv.sh; without it they skip with the reason.
"""
import atexit
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "recorder" / "python"))
sys.path.insert(0, str(REPO / "tests" / "catalog"))

import torchrr  # noqa: E402
from run_catalog import check_trace_order  # noqa: E402 (standard library only)
from torchrr import _native  # noqa: E402

PYTORCH_INPLACE = "modified by an inplace operation"


def _missing_build():
    try:
        cli = _native.cli_path()
        lib = _native.library_path()
    except RuntimeError as error:
        return str(error)
    if not lib.exists():
        return f"{lib} not built"
    return None if os.path.exists(cli) else f"{cli} not built"


MISSING_BUILD = _missing_build()
needs_build = pytest.mark.skipif(MISSING_BUILD is not None, reason=f"no native build: "
                                 f"{MISSING_BUILD} (build, then tools/install_into_venv.sh)")


def cli():
    return _native.cli_path()


def _program_environment(env):
    """The environment a recorded program starts from: this one, one intra-op thread, no
    recording of an outer torchrr, and `env` on top."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "RANK"):
        full_env.pop(name, None)
    full_env.update(env or {})
    return full_env


def record(out, argv, *, env=None, timeout=120, cwd=None, flags=()):
    """Runs `torchrr record -o OUT [FLAGS] -- ARGV...` and returns the CompletedProcess (text)."""
    return subprocess.run([cli(), "record", "-o", str(out), *flags, "--", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout,
                          env=_program_environment(env), cwd=cwd)


class _WarmRecorder:
    """The client of warm_recorder.py: one warm process per test process (so one per xdist
    worker), started at the first recording and ended with the test process."""

    def __init__(self):
        self._process = None
        self._environments = {}

    def environment(self, out, flags, env):
        """What `torchrr record -o OUT FLAGS` sets for its program, read by running it on a
        program that prints its environment (`python -S`: no site, so nothing records)."""
        key = (tuple(flags), tuple(sorted((env or {}).items())))
        if key not in self._environments:
            probe = [sys.executable, "-S", "-c",
                     "import json, os, sys; sys.stdout.write(json.dumps(dict(os.environ)))"]
            with tempfile.TemporaryDirectory() as scratch:
                proc = subprocess.run(
                    [cli(), "record", "--quiet", "-o", os.path.join(scratch, "probe.trr"),
                     *flags, "--", *probe], capture_output=True, text=True, timeout=60,
                    env=_program_environment(env), check=True)
            self._environments[key] = json.loads(proc.stdout)
        environment = dict(self._environments[key])
        environment["TORCHRR_OUTPUT"] = os.path.abspath(out)
        return environment

    def _start(self):
        environment = self.environment("unused.trr", (), None)
        del environment["TORCHRR_OUTPUT"]
        self._process = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("warm_recorder.py"))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=environment)
        ready = self._process.stdout.readline()
        assert json.loads(ready) == {"ready": True}, f"warm_recorder.py did not start: {ready!r}"

    def run(self, out, argv, *, env, timeout, cwd, flags):
        if self._process is None or self._process.poll() is not None:
            self._start()
        with tempfile.TemporaryDirectory() as scratch:
            request = {"argv": list(map(str, argv[1:])), "env": self.environment(out, flags, env),
                       "cwd": str(cwd or os.getcwd()), "timeout": timeout,
                       "stdout": os.path.join(scratch, "stdout"),
                       "stderr": os.path.join(scratch, "stderr")}
            self._process.stdin.write(json.dumps(request) + "\n")
            self._process.stdin.flush()
            answer = self._process.stdout.readline()
            assert answer, "warm_recorder.py ended"
            outputs = [Path(request[name]).read_text(errors="replace")
                       for name in ("stdout", "stderr")]
        return subprocess.CompletedProcess(argv, json.loads(answer)["returncode"], *outputs)

    def close(self):
        if self._process is not None and self._process.poll() is None:
            self._process.stdin.close()
            self._process.wait(timeout=30)


_WARM = _WarmRecorder()
atexit.register(_WARM.close)


def record_warm(out, argv, *, env=None, timeout=120, cwd=None, flags=()):
    """As record(OUT, [python, SCRIPT, ARGS...]), for a test whose subject is what the recording
    says: the script runs in a fork of a process that imported torch once (warm_recorder.py), as
    `torchrr record` would run it, but for the verdict it prints at the end. Returns a
    CompletedProcess with the script's exit status, stdout and stderr."""
    assert argv[0] == sys.executable, f"record_warm runs Python scripts only: {argv}"
    return _WARM.run(out, argv, env=env, timeout=timeout, cwd=cwd, flags=flags)


def record_ranks(tmp_path, name, program, *args, ranks=2):
    """Writes `program` to tmp_path/name and records it under `torchrun --nproc-per-node RANKS`
    with ARGS; returns (script, {rank: replay JSON}, {rank: replay exit code})."""
    script = tmp_path / name
    script.write_text(program)
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = record(tmp_path / "run.trr",
                  [torchrun, "--nproc-per-node", str(ranks), "--master-port", str(free_port()),
                   script, *args], timeout=240, cwd=tmp_path)
    traces = sorted(p.name for p in tmp_path.glob("run.rank*.trr"))
    assert traces == [f"run.rank{r}.trr" for r in range(ranks)], (traces, proc.stderr[-2000:])
    documents, codes = {}, {}
    for rank in range(ranks):
        replay = subprocess.run([cli(), "replay", "--json", f"run.rank{rank}.trr"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path)
        documents[rank] = json.loads(replay.stdout)
        codes[rank] = replay.returncode
    return script, documents, codes


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (torchrun's --master-port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def marker_lines(path, marker):
    """1-based numbers of the lines of `path` whose comment holds `marker` (a regex)."""
    pattern = re.compile(r"#\s*" + marker + r"\s*$")
    return [i for i, line in enumerate(Path(path).read_text().splitlines(), 1)
            if pattern.search(line)]


def marker_line(path, marker):
    lines = marker_lines(path, marker)
    assert len(lines) == 1, f"{path}: expected one line marked {marker}, found {lines}"
    return lines[0]


def trace_order_problems(trace):
    """What breaks SPEC.md's order in `trace` (the catalog runner's check): [] when nothing."""
    problems = []
    check_trace_order(problems, str(cli()), str(trace))
    return problems


def same_file(a, b):
    return a is not None and os.path.realpath(a) == os.path.realpath(b)


class OneFile:
    """_fix.Workspace's two methods, over one source."""

    def __init__(self, src):
        self.src = src

    def source(self, path):
        return self.src if path == self.src.path else None

    def locate(self, path, line):
        return line
