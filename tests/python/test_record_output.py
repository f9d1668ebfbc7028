"""The trace's path, checked before anything runs: `torchrr record` refuses an output that can
never hold a trace, options out of range, and an output another recording is writing; the
recorder's own open (torchrr.start, the C API) refuses the same, and never truncates another
recording's file."""
import json
import os
import subprocess
import sys
import textwrap
import time

from conftest import REPO, cli, needs_build, record

pytestmark = needs_build

PROGRAM = [sys.executable, "-c", "import torch; torch.ones(2).add(1); print('ran')"]


def _errors(stderr):
    return [line for line in stderr.splitlines() if line.startswith("torchrr: error:")]


def _assert_refused_before_running(proc, why):
    """`torchrr record` exited 2 with one error line naming `why`, and the program never ran."""
    assert proc.returncode == 2, proc.stderr
    assert "ran" not in proc.stdout
    errors = _errors(proc.stderr)
    assert len(errors) == 1 and why in errors[0], proc.stderr


def _python_api(code, timeout=60):
    """Runs `code` in a fresh interpreter that imports the checkout's torchrr package."""
    env = dict(os.environ, PYTHONPATH=str(REPO / "recorder" / "python"), OMP_NUM_THREADS="1")
    env.pop("TORCHRR_OUTPUT", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env)


def test_a_fifo_is_refused_before_the_program_runs(tmp_path):
    # The recorder would block in open() until something read the FIFO: the program never ran.
    fifo = tmp_path / "run.trr"
    os.mkfifo(fifo)
    _assert_refused_before_running(record(fifo, PROGRAM, timeout=30), "not a regular file")


def test_a_directory_is_refused(tmp_path):
    proc = record(tmp_path, PROGRAM, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert len(_errors(proc.stderr)) == 1 and "ran" not in proc.stdout, proc.stderr


def test_an_empty_output_is_refused(tmp_path):
    proc = record("", PROGRAM, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert len(_errors(proc.stderr)) == 1 and "ran" not in proc.stdout, proc.stderr


def test_out_of_range_options_are_refused(tmp_path):
    for value in ["-5", "0", "99999999999"]:
        proc = record(tmp_path / "run.trr", PROGRAM, timeout=30, flags=["--max-buffer-mb", value])
        assert proc.returncode == 2, f"--max-buffer-mb {value}: {proc.returncode} {proc.stderr}"
        assert "ran" not in proc.stdout
        assert not (tmp_path / "run.trr").exists()


def test_the_python_api_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "api.trr"
    os.mkfifo(fifo)
    proc = _python_api(f"import torchrr; print(torchrr.start({str(fifo)!r}))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]
    assert "not a regular file" in proc.stderr


class _FirstRecording:
    """`torchrr record -o TRACE` of a program that records, then waits for GO to exist."""

    def __init__(self, tmp_path, trace):
        self.ready = tmp_path / "ready"
        self.go = tmp_path / "go"
        script = tmp_path / "first.py"
        script.write_text(textwrap.dedent("""\
            import os, sys, time, torch
            x = torch.ones(4, requires_grad=True)
            (x * 2).sum().backward()
            open(sys.argv[1], "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
                time.sleep(0.05)
            (x * 3).sum().backward()
            print("first done")
            """))
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("TORCHRR_OUTPUT", None)
        self.proc = subprocess.Popen(
            [cli(), "record", "-o", str(trace), "--", sys.executable, str(script),
             str(self.ready), str(self.go)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 60
        while not self.ready.exists():
            assert self.proc.poll() is None and time.monotonic() < deadline, self.finish()
            time.sleep(0.05)

    def finish(self):
        self.go.touch()
        try:
            return self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise


def test_a_second_recording_to_the_same_path_is_refused(tmp_path):
    trace = tmp_path / "run.trr"
    first = _FirstRecording(tmp_path, trace)
    second = record(trace, PROGRAM, timeout=60)
    out, err = first.finish()
    assert first.proc.returncode == 0 and "first done" in out, err
    assert second.returncode == 7, second.stderr
    assert "ran" not in second.stdout
    errors = _errors(second.stderr)
    assert len(errors) == 1 and "another recording" in errors[0], second.stderr
    info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr


def test_the_recorder_never_truncates_a_file_another_recording_writes(tmp_path):
    # torchrr.start reaches the recorder's open directly, past the command line's checks.
    trace = tmp_path / "run.trr"
    first = _FirstRecording(tmp_path, trace)
    second = _python_api(f"import torchrr; print(torchrr.start({str(trace)!r}))")
    out, err = first.finish()
    assert first.proc.returncode == 0, err
    assert second.stdout.split() == ["False"], second.stderr
    assert "another recording" in second.stderr
    info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0, info.stderr


def test_a_link_at_the_output_is_refused_and_its_target_kept(tmp_path):
    # O_NOFOLLOW: a link planted at the path neither truncates its target nor, dangling, makes a
    # file where it points.
    target = tmp_path / "results.txt"
    target.write_text("the program's results\n")
    link = tmp_path / "run.trr"
    link.symlink_to(target)
    _assert_refused_before_running(record(link, PROGRAM, timeout=30), "symbolic link")
    assert target.read_text() == "the program's results\n"

    dangling = tmp_path / "dangling.trr"
    dangling.symlink_to(tmp_path / "elsewhere.trr")
    proc = record(dangling, PROGRAM, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert not (tmp_path / "elsewhere.trr").exists()

    proc = _python_api(f"import torchrr; print(torchrr.start({str(link)!r}))")
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr
    assert "symbolic link" in proc.stderr
    assert target.read_text() == "the program's results\n"


CLOSES_ITS_DESCRIPTORS = """
import os, sys, torch
w = torch.randn(8, 8, requires_grad=True)
for step in range(2):
    if step == 1:
        # What python-daemon and some launchers do, then the program opens its own file, which
        # gets the lowest free number.
        os.closerange(3, 4096)
        with open(sys.argv[1], "w") as results:
            results.write("result line\\n")
            results.flush()
        # Files of its own at every low number, the trace's old one among them.
        scratch = [open(os.path.join(sys.argv[2], "scratch%d" % i), "wb") for i in range(64)]
    h = torch.sigmoid(torch.randn(4, 8) @ w)
    h.mul_(2)  # BUG: sigmoid saved its output.
    try:
        h.sum().backward()
    except RuntimeError:
        pass
    with open(sys.argv[1], "a") as results:
        results.write("after step %d\\n" % step)
"""


def test_a_program_that_closes_its_descriptors_keeps_its_files_and_the_trace(tmp_path):
    script = tmp_path / "daemon_like.py"
    script.write_text(CLOSES_ITS_DESCRIPTORS)
    results = tmp_path / "results.txt"
    trace = tmp_path / "run.trr"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    proc = record(trace, [sys.executable, script, results, scratch])
    assert proc.returncode == 0, proc.stderr
    written = {p.name: p.stat().st_size for p in scratch.iterdir() if p.stat().st_size}
    assert len(list(scratch.iterdir())) == 64 and not written, written
    # The program's file holds only what it wrote: no chunk of the trace (which starts TRRC).
    assert results.read_bytes() == b"result line\nafter step 1\n", results.read_bytes()[:64]
    replay = subprocess.run([cli(), "replay", "--json", str(trace)], capture_output=True,
                            text=True, timeout=120)
    report = json.loads(replay.stdout)
    assert replay.returncode == 1, replay.stdout[-2000:] + replay.stderr
    # Both steps' violations: the writes after the close reached the trace too.
    assert len(report["violations"]) == 2, [v.get("culprit", {}).get("op") for v in
                                            report["violations"]]
    assert "Bad file descriptor" not in proc.stderr


SCRIPT = "import torch\nprint('the script ran')\n"


def test_an_existing_file_that_is_not_a_trace_is_kept_unless_forced(tmp_path):
    # `record -o train.py -- python train.py`: the script is refused as an output, not replaced.
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    _assert_refused_before_running(record(script, PROGRAM, timeout=30), "--force replaces it")
    assert script.read_text() == SCRIPT
    proc = _python_api(f"import torchrr; print(torchrr.start({str(script)!r}))")
    assert proc.stdout.strip() == "False", proc.stdout + proc.stderr
    assert "not a torchrr trace" in proc.stderr
    assert script.read_text() == SCRIPT
    # An empty file and an older trace are replaced; anything with --force.
    empty = tmp_path / "empty.trr"
    empty.touch()
    assert record(empty, PROGRAM, timeout=60, flags=["--quiet"]).returncode == 0
    assert record(empty, PROGRAM, timeout=60, flags=["--quiet"]).returncode == 0
    proc = record(script, PROGRAM, timeout=60, flags=["--quiet", "--force"])
    assert proc.returncode == 0, proc.stderr
    assert script.read_bytes().startswith(b"TORCHRR\0")


def _verb(args, timeout=60):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def test_report_export_and_redact_write_only_their_own_files(tmp_path):
    trace = tmp_path / "run.trr"
    assert record(trace, PROGRAM, timeout=60, flags=["--quiet"]).returncode == 0
    verbs = {"report": ["report", trace, "-o"],
             "export": ["export", "--chrome-trace", trace, "-o"],
             "redact": ["redact", trace, "-o"]}
    for name, args in verbs.items():
        # The user's file at the output: refused with one line, kept.
        kept = tmp_path / f"{name}.py"
        kept.write_text(SCRIPT)
        proc = _verb(args + [kept])
        assert proc.returncode == 2 and len(_errors(proc.stderr)) == 1, (name, proc.stderr)
        assert "--force" in proc.stderr and kept.read_text() == SCRIPT, name
        # A link, dangling or not: never written through.
        link = tmp_path / f"{name}.link"
        link.symlink_to(kept)
        proc = _verb(args + [link])
        assert proc.returncode == 2 and "symbolic link" in proc.stderr, (name, proc.stderr)
        assert kept.read_text() == SCRIPT, name
        dangling = tmp_path / f"{name}.dangling"
        dangling.symlink_to(tmp_path / f"{name}.elsewhere")
        assert _verb(args + [dangling]).returncode == 2, name
        assert not (tmp_path / f"{name}.elsewhere").exists(), name
        # A FIFO: refused at once, where an open for writing would wait for a reader.
        fifo = tmp_path / f"{name}.fifo"
        os.mkfifo(fifo)
        proc = _verb(args + [fifo], timeout=30)
        assert proc.returncode == 2 and "FIFO" in proc.stderr, (name, proc.stderr)
        # Its own earlier output is replaced; anything with --force.
        own = tmp_path / f"{name}.out"
        assert _verb(args + [own]).returncode == 0, name
        first = own.read_bytes()
        proc = _verb(args + [own])
        assert proc.returncode == 0 and own.read_bytes()[:16] == first[:16], (name, proc.stderr)
        proc = _verb(args + [kept, "--force"])
        assert proc.returncode == 0 and kept.read_bytes()[:16] == first[:16], (name, proc.stderr)
