"""`pip install --no-build-isolation <checkout>` into an environment that has torch: the recorder is
built against that torch; the installed package records and replays with nothing pointing back
into the checkout; `pip uninstall` leaves nothing behind.

The environment is a scratch venv that sees this interpreter's packages (torch, scikit-build-core)
through a .pth file, so that no package is downloaded. The wheel builds the recorder from scratch
(minutes): set TORCHRR_SKIP_PIP_TEST=1 to skip it while iterating."""
import os
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest
from conftest import REPO, marker_line

pytestmark = pytest.mark.skipif(os.environ.get("TORCHRR_SKIP_PIP_TEST") == "1",
                                reason="TORCHRR_SKIP_PIP_TEST=1")

PROGRAM = """\
import torch

x = torch.randn(4, 8, requires_grad=True)
y = torch.sigmoid(x)  # VICTIM
y.mul_(2)  # CULPRIT
y.sum().backward()
"""


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)


def site_packages(python):
    return Path(run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                    check=True).stdout.strip())


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("pip")
    venv.create(root / "venv", with_pip=False)
    python = root / "venv" / "bin" / "python"
    site = site_packages(python)
    # This interpreter's packages (torch, scikit-build-core, pip), after the venv's own.
    (site / "outer.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    before = {p.relative_to(root) for p in (root / "venv").rglob("*")}
    build = run([python, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "-q",
                 "--no-cache-dir", REPO], timeout=3600, cwd=root,
                env=dict(os.environ, CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 2)))
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return root, python, site, before


def test_the_package_carries_its_libraries_and_command(env):
    root, python, site, _ = env
    package = site / "torchrr"
    for path in ("__init__.py", "_sitecustomize/sitecustomize.py", "bin/torchrr",
                 "lib/libtorchrr_recorder.so", "lib/libtorchrr_preload.so",
                 "lib/torchrr_build.json"):
        assert (package / path).exists(), f"not installed: torchrr/{path}"
    assert not (package / "_build_dir.txt").exists()
    # Nothing installed names the checkout (the source tree, a build directory in it).
    source = str(REPO).encode()
    for path in package.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            assert source not in path.read_bytes(), f"{path} names {REPO}"
    version = run([root / "venv" / "bin" / "torchrr", "--version"], check=True).stdout
    assert version.startswith("torchrr "), version


def test_the_installed_command_records_and_replays(env, tmp_path):
    root, python, _, _ = env
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    trace = tmp_path / "t.trr"
    # Run from elsewhere, with no trace of the checkout in the environment.
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHRR_", "PYTHON"))}
    command = root / "venv" / "bin" / "torchrr"
    recorded = run([command, "record", "-o", trace, "--", python, program], env=clean,
                   cwd=tmp_path, timeout=300)
    assert recorded.returncode == 1, recorded.stderr  # The program's backward raises.
    assert trace.exists(), recorded.stderr
    replay = run([command, "replay", trace], env=clean, cwd=tmp_path, timeout=300)
    assert replay.returncode == 1, replay.stderr
    assert f"train.py:{marker_line(program, 'CULPRIT')}" in replay.stdout, replay.stdout
    assert f"train.py:{marker_line(program, 'VICTIM')}" in replay.stdout, replay.stdout
    # In process: the installed package, its own library.
    script = ("import sys, torchrr; from torchrr import _native\n"
              "print(_native.library_path())\n"
              "with torchrr.record(sys.argv[1]):\n"
              "    import torch; torch.ones(2, requires_grad=True).exp().sum().backward()\n")
    inproc = run([python, "-c", script, tmp_path / "u.trr"], env=clean, cwd=tmp_path,
                 timeout=300)
    assert inproc.returncode == 0, inproc.stderr
    assert Path(inproc.stdout.strip()).is_relative_to(root), inproc.stdout


def test_uninstall_leaves_nothing_behind(env):
    root, python, site, before = env
    removed = run([python, "-m", "pip", "uninstall", "-y", "-q", "torchrr"], timeout=300)
    assert removed.returncode == 0, removed.stderr
    after = {p.relative_to(root) for p in (root / "venv").rglob("*")}
    assert sorted(str(p) for p in after - before) == []
