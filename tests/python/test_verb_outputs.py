"""One convention for every verb that writes: `-o -` is stdout wherever the output is a file
(export, redact, report, repro; `record` refuses it), each says on stderr what it wrote and where,
`record` without -o writes torchrr.trr and numbers the name rather than replace an earlier trace,
and a run that recorded nothing says why. The trace-reading verbs run on a checked-in golden
trace (no torch); `record` runs real programs."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import cli, needs_build

REPO = Path(__file__).resolve().parents[2]
# Two training steps of every record kind (tests/golden/make_golden.cc).
GOLDEN = REPO / "tests" / "golden" / "v1_15.trr"

pytestmark = needs_build


def run(*args, cwd=None, env=None, text=True):
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=text, timeout=120,
                          cwd=cwd, env=full_env)


def test_export_to_stdout_and_to_a_file_say_what_they_wrote(tmp_path):
    piped = run("export", GOLDEN, "-o", "-")
    assert piped.returncode == 0, piped.stderr
    assert "traceEvents" in json.loads(piped.stdout)
    assert piped.stderr.startswith("torchrr: wrote stdout (Chrome Trace Event JSON, "), piped.stderr
    assert not (Path.cwd() / "-").exists()
    # --chrome-trace is the default format: naming it or not writes the same file.
    named = run("export", "--chrome-trace", GOLDEN, "-o", tmp_path / "named.json")
    unnamed = run("export", GOLDEN, "-o", tmp_path / "unnamed.json")
    assert named.returncode == unnamed.returncode == 0, named.stderr + unnamed.stderr
    assert (tmp_path / "named.json").read_bytes() == (tmp_path / "unnamed.json").read_bytes()
    assert (tmp_path / "named.json").read_text() == piped.stdout
    assert unnamed.stderr.startswith(f"torchrr: wrote {tmp_path / 'unnamed.json'} ("), \
        unnamed.stderr


def test_redact_to_stdout_is_the_same_trace_as_to_a_file(tmp_path):
    piped = run("redact", GOLDEN, "-o", "-", text=False)
    assert piped.returncode == 0, piped.stderr
    stderr = piped.stderr.decode()
    assert stderr.startswith("torchrr: wrote stdout (the redacted copy: "), stderr
    to_file = run("redact", GOLDEN, "-o", tmp_path / "copy.trr")
    assert to_file.returncode == 0, to_file.stderr
    assert to_file.stderr.startswith(f"torchrr: wrote {tmp_path / 'copy.trr'} ("), to_file.stderr
    piped_copy = tmp_path / "piped.trr"
    piped_copy.write_bytes(piped.stdout)
    # The same records either way: the piped copy reads back whole, to the same verdict.
    replays = [run("replay", "--json", path) for path in (piped_copy, tmp_path / "copy.trr")]
    assert replays[0].returncode == replays[1].returncode, replays[0].stderr
    violations = [json.loads(replay.stdout)["violations"] for replay in replays]
    assert violations[0] == violations[1]
    assert not (Path.cwd() / "-").exists()


def test_report_and_repro_say_what_they_wrote(tmp_path):
    page = run("report", GOLDEN, "-o", tmp_path / "page.html")
    assert page.returncode == 0, page.stderr
    assert f"torchrr: wrote {tmp_path / 'page.html'} (the HTML page, " in page.stderr, page.stderr
    piped = run("report", GOLDEN, "-o", "-")
    assert piped.stdout.startswith("<!DOCTYPE html>") or "<html" in piped.stdout[:200]
    assert "torchrr: wrote stdout (the HTML page, " in piped.stderr, piped.stderr
    # Nothing to reproduce in it: nothing written, and nothing said to be.
    script = run("repro", GOLDEN, "-o", "-")
    assert script.returncode == 12 and script.stdout == "", script.stderr
    assert "wrote" not in script.stderr, script.stderr


def test_record_refuses_stdout_before_running_anything(tmp_path):
    marker = tmp_path / "ran"
    proc = run("record", "-o", "-", "--", sys.executable, "-c",
               f"open({str(marker)!r}, 'w')", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "a trace cannot go to stdout" in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "-").exists()


def test_record_of_a_program_without_torch_says_why(tmp_path):
    proc = run("record", "--", sys.executable, "-c", "print('no torch here')", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "no torch here\n"
    assert proc.stderr == ("torchrr: no trace written to torchrr.trr: the program never imported "
                           "torch (recording starts at `import torch`)\n"), proc.stderr
    assert list(tmp_path.iterdir()) == []
    failed = run("record", "-o", "x.trr", "--", sys.executable, "-c", "raise SystemExit(3)",
                 cwd=tmp_path)
    assert failed.returncode == 3
    assert failed.stderr.endswith("never imported torch (recording starts at `import torch`); "
                                  "it exited with status 3\n"), failed.stderr


CLEAN = "import torch\nx = torch.ones(3, requires_grad=True)\ntorch.sigmoid(x).sum().backward()\n"


def test_record_without_o_numbers_the_default_name(tmp_path):
    # An earlier run's trace, and a rank trace of the first numbered name: neither is replaced.
    shutil.copy(GOLDEN, tmp_path / "torchrr.trr")
    shutil.copy(GOLDEN, tmp_path / "torchrr.1.rank0.trr")
    (tmp_path / "clean.py").write_text(CLEAN)
    proc = run("record", "--", sys.executable, "clean.py", cwd=tmp_path,
               env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "torchrr.trr").read_bytes() == GOLDEN.read_bytes()
    assert (tmp_path / "torchrr.2.trr").is_file()
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("torchrr: wrote torchrr.2.trr (the trace, "), proc.stderr
    assert lines[0].endswith("; the default name, numbered: torchrr.trr is taken)"), proc.stderr
    replay = run("replay", "--json", tmp_path / "torchrr.2.trr")
    assert replay.returncode == 0, replay.stderr + replay.stdout
    # A CPU-only run is not said to have used the CUDA its torch was built with.
    info = run("info", tmp_path / "torchrr.2.trr")
    written_by = next(line for line in info.stdout.splitlines() if line.startswith("written by:"))
    assert written_by.endswith(("; this run used no CUDA device)", "(a build without CUDA)")), \
        written_by
    assert json.loads(run("info", "--json", tmp_path / "torchrr.2.trr").stdout)["run_used_cuda"] \
        is False


def test_info_says_when_the_run_used_cuda():
    # The golden trace holds CUDA kernels and copies, from a torch built with CUDA 12.1.
    info = run("info", GOLDEN)
    assert "torch 2.4.1+cu121 (built with CUDA 12.1; this run used a CUDA device)" in info.stdout, \
        info.stdout
    assert json.loads(run("info", "--json", GOLDEN).stdout)["run_used_cuda"] is True


def test_help_shows_metavars_defaults_and_each_verbs_exit_codes():
    top = run("--help")
    assert top.returncode == 0
    assert top.stdout.count("Exit codes:") == 1 and "  127 record: the program could not be run" \
        in top.stdout, top.stdout
    helps = {verb: run(verb, "--help").stdout
             for verb in ("info", "dump", "record", "replay", "export", "redact", "report", "fix",
                          "repro")}
    for verb, text in helps.items():
        # The parser's own words are not shown: metavars are.
        for internal in ("ENUM:", "TEXT", "FLOAT", "UINT", "INT:", "value in {", " in ["):
            assert internal not in text, f"{verb} --help shows {internal!r}:\n{text}"
        assert text.count("Exit codes:") == 1, text
    assert "--timeout SECONDS" in helps["fix"] and "(default: 600)" in helps["fix"]
    assert "--timeout SECONDS" in helps["repro"] and "(default: 120)" in helps["repro"]
    assert "--color auto|always|never" in helps["replay"]
    assert "-o,--output OUT" in helps["export"]
    # Each verb lists the codes it returns, not the others'.
    assert "  13 repro --check" in helps["repro"] and "  13 " not in helps["fix"]
    assert "  11 fix --check" in helps["fix"] and "  11 " not in helps["report"]
    assert "  127 record" in helps["record"] and "  127 " not in helps["replay"]
    assert "  1  replay: violations found" in helps["replay"]
    assert "  1  " not in helps["export"]
