"""The README's examples run as written: its `train.py` recorded with `torchrr record` names the
planted bug's line, and its Python snippet, extracted and run under this build, finds it too
(a snippet that recorded only `loss.backward()` would find nothing). One recording each."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, needs_build

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = needs_build


def block(name: str) -> str:
    """The fenced code block right after the README's `<!-- example: NAME -->` marker."""
    found = re.search(rf"<!-- example: {re.escape(name)} -->\s*```\w*\n(.*?)```",
                      README.read_text(), re.S)
    assert found, f"README.md has no example {name!r}"
    return found.group(1)


def bug_line(source: str) -> int:
    return next(n for n, line in enumerate(source.splitlines(), 1) if "# the bug" in line)


def env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_the_python_snippet_finds_the_planted_bug(tmp_path):
    source = block("python")
    (tmp_path / "snippet.py").write_text(source)
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env=env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What the snippet prints is the violation, at its planted line.
    assert re.search(rf"aten::mul_\S* at \S*snippet\.py:{bug_line(source)}\b", proc.stdout), \
        proc.stdout


def test_record_of_train_py_prints_the_verdict_the_readme_shows(tmp_path):
    source = block("train.py")
    (tmp_path / "train.py").write_text(source)
    proc = subprocess.run([cli(), "record", "--", sys.executable, "train.py"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, env=env())
    assert proc.returncode == 1, proc.stderr
    assert (tmp_path / "torchrr.trr").is_file()
    shown = block("verdict")
    line = bug_line(source)
    assert f"train.py:{line}" in shown
    # The README's verdict, as printed here: the README's script is in /home/me/project, and the
    # trace's size may differ.
    printed = proc.stderr[proc.stderr.index("torchrr: wrote torchrr.trr"):]
    printed = printed.replace(str(tmp_path), "/home/me/project")

    def sized(text):
        return re.sub(r"\(the trace, [^;)]*", "(the trace, SIZE", text).strip()

    assert sized(printed) == sized(shown), printed
    fixed = subprocess.run([cli(), "fix", "torchrr.trr", "--check"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env())
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "with this patch" in fixed.stdout and "0 violations" in fixed.stdout, fixed.stdout
