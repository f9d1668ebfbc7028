"""Shared helpers for the Python tests: the native build, `torchrr record`, and marker lines.

The tests need the native build (the recorder library and the CLI) made visible to the venv by
tools/install_into_venv.sh; without it they skip with the reason.
"""
import json
import os
import re
import socket
import subprocess
import sys
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


def record(out, argv, *, env=None, timeout=120, cwd=None, flags=()):
    """Runs `torchrr record -o OUT [FLAGS] -- ARGV...` and returns the CompletedProcess (text)."""
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "RANK"):
        full_env.pop(name, None)
    full_env.update(env or {})
    return subprocess.run([cli(), "record", "-o", str(out), *flags, "--", *map(str, argv)],
                          capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


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
