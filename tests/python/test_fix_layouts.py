"""`torchrr fix --check --apply` on the layouts real repositories have: the interpreter's own
options before the script (`python -W ignore scripts/train.py`, `-X dev`), a package found
through `sys.path.insert(0, join(dirname(__file__), ".."))` (the trace names its files through
`scripts/../pkg`), and `scripts/train.py` beside `src/pkg` found through a path entry that names
the user's tree (as an editable install's does). The re-run says on stderr what it runs, and by
default stops after the step the violation was in. The command line is read as CPython reads it
(_python_target, checked without a build)."""
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import MISSING_BUILD, cli, record
from torchrr._fix_check import _python_target

MODEL = textwrap.dedent("""\
    import torch


    def step(layer, x):
        act = torch.sigmoid(layer(x))
        act.mul_(2)  # BUG
        return act.sum()
    """)

# Three steps; the first one's backward raises, which ends the program.
TRAIN = textwrap.dedent("""\
    import os
    import sys
    {path_setup}
    import torch
    from pkg.model import step

    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 4)
    for _ in range(3):
        step(layer, torch.randn(2, 4)).backward()
    print("trained")
    """)

needs_build = pytest.mark.skipif(MISSING_BUILD is not None, reason=f"no build: {MISSING_BUILD}")


def layout(root: Path, package_parent: str, path_setup: str) -> Path:
    """scripts/train.py and PACKAGE_PARENT/pkg/model.py under `root`; returns the model file."""
    (root / "scripts").mkdir(parents=True)
    (root / "scripts" / "train.py").write_text(TRAIN.format(path_setup=path_setup))
    package = root / package_parent / "pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(MODEL)
    return package / "model.py"


def fix(trace, cwd, env=None):
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([cli(), "fix", str(trace), "--apply"], capture_output=True, text=True,
                          timeout=300, cwd=cwd, env=full_env)


def assert_fixed(proc, model: Path):
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "with this patch: backward ran (1 pass), 0 violations" in proc.stdout.splitlines(), \
        proc.stdout
    assert f"patched {model}" in proc.stdout, proc.stdout
    assert "act = act.mul(2)  # BUG" in model.read_text()
    assert Path(str(model) + ".orig").read_text() == MODEL
    # The progress line, with the bound the violation's step gave and the command as recorded.
    assert "torchrr: re-running the patched program (its first 1 step, at most 600 s): " \
        in proc.stderr, proc.stderr
    assert "scripts/train.py\n" in proc.stderr and "torchrr-fix-" not in proc.stderr, proc.stderr


@needs_build
def test_dot_dot_path_and_a_warning_option(tmp_path):
    model = layout(tmp_path, ".", 'sys.path.insert(0, os.path.join(os.path.dirname(__file__), '
                                  '".."))')
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, "-W", "ignore", "scripts/train.py"], cwd=tmp_path,
                  flags=["--quiet"])
    assert proc.returncode == 1 and "modified by an inplace operation" in proc.stderr, proc.stderr
    checked = fix(trace, tmp_path)
    assert_fixed(checked, model)
    assert "scripts/../pkg" not in checked.stdout, checked.stdout


@needs_build
def test_scripts_beside_src_package_on_a_path_entry(tmp_path):
    # `pip install -e .` of a src layout puts a path entry naming the user's src/ on sys.path:
    # PYTHONPATH does the same here without touching the environment's site-packages.
    model = layout(tmp_path, "src", "")
    env = {"PYTHONPATH": str(tmp_path / "src")}
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, "-X", "dev", "-W", "ignore", "scripts/train.py"],
                  cwd=tmp_path, env=env, flags=["--quiet"])
    assert proc.returncode == 1 and "modified by an inplace operation" in proc.stderr, proc.stderr
    # The re-run imports the patched copy of src/pkg, not the user's file the entry names: were
    # it the user's, the violation would remain and the exit code be 1.
    assert_fixed(fix(trace, tmp_path, env), model)


@pytest.mark.parametrize("argv, target", [
    (["python", "train.py", "-W", "x"], ("script", 1)),
    (["python", "-W", "ignore", "train.py"], ("script", 3)),
    (["python", "-Wignore", "-X", "dev", "train.py"], ("script", 4)),
    (["python", "-uW", "ignore", "-B", "train.py"], ("script", 4)),
    (["python", "-u", "-m", "pkg.train", "--lr", "1"], ("module", 3, "pkg.train")),
    (["python", "-mpkg.train"], ("module", 1, "pkg.train")),
    (["python", "-um", "pkg.train"], ("module", 2, "pkg.train")),
    (["python", "--check-hash-based-pycs", "always", "t.py"], ("script", 3)),
    (["python", "-I", "--", "-weird.py"], ("script", 3)),
    (["python", "-c", "print(1)"], ("c", 2, "print(1)")),
    (["python", "-W", "ignore"], ("stdin", 3)),
    (["python", "-"], ("stdin", 1)),
])
def test_python_options_read_as_python_reads_them(argv, target):
    assert _python_target(argv) == target
