"""`make demo` builds only what the demo runs: the CLI, the recorder and the libraries it loads
(CMake's torchrr_demo), never a test, fuzzer or benchmark, which `make build`, `make test` and
`make bench` build. Read from the build's own graph (ninja) and from make's plan, without
building anything."""
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torchrr import _native

REPO = Path(__file__).resolve().parents[2]
BUILD = _native.build_dir()

needs_ninja_build = pytest.mark.skipif(
    BUILD is None or not (Path(BUILD) / "build.ninja").is_file() or not shutil.which("ninja"),
    reason="no Ninja build tree")


@needs_ninja_build
def test_the_demo_target_builds_the_cli_and_recorder_only():
    # Every command building torchrr_demo would run, whatever is built already: what it links.
    proc = subprocess.run(["ninja", "-C", str(BUILD), "-t", "commands", "torchrr_demo"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    linked = {Path(out).name for out in re.findall(r" -o (\S*(?:bin|lib)/[^\s/]+)(?=\s|$)",
                                                   proc.stdout)}
    assert {"torchrr", "libtorchrr_recorder.so", "libtorchrr_preload.so"} <= linked, linked
    unwanted = [name for name in linked if re.search(r"_test$|^fuzz_|^bench_|gtest", name)]
    assert unwanted == [], unwanted
    # The whole build does link them: the check above can see them.
    everything = subprocess.run(["ninja", "-C", str(BUILD), "-t", "commands", "all"],
                                capture_output=True, text=True, timeout=60).stdout
    assert re.search(r" -o \S*bin/replayer_test(\s|$)", everything)


def test_make_demo_builds_the_demo_target_not_everything():
    proc = subprocess.run(["make", "-n", "demo", "BUILD=build-demo-plan"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    builds = [line for line in proc.stdout.splitlines() if "cmake --build" in line]
    assert builds and all("--target torchrr_demo" in line for line in builds), proc.stdout
    cpp = subprocess.run(["make", "-n", "demo", "DEMO=cpp", "BUILD=build-demo-plan"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert "--target torchrr_demo lora_step" in cpp.stdout, cpp.stdout
