"""The flight recorder (`torchrr record --keep-last N`): a long run of the PEFT sample whose bug
first bites late is recorded whole, and only its last steps are written, as a trace that replays
on its own to the same culprit and victim lines as a short recording of the same bug, whose size
does not grow with the run's length."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import cli, marker_line, needs_build, record

pytestmark = needs_build

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "samples" / "python" / "peft_lora.py"
# A small model: the test runs a few hundred steps on two CPU cores.
SMALL = ["--device", "cpu", "--hidden", "32", "--seq", "8", "--batch", "1"]


def replay(trace):
    proc = subprocess.run([cli(), "replay", "--json", str(trace)], capture_output=True, text=True,
                          timeout=300)
    return proc.returncode, json.loads(proc.stdout)


def lines_of(document):
    """(culprit line, victim line) of the first violation, as file basename:line."""
    v = document["violations"][0]

    def where(op):
        frame = op["user_frame"]
        return f"{Path(frame['file']).name}:{frame['line']}"
    return where(v["culprit"]), where(v["victim"])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("keep_last")
    bug = ["--bug", "inplace_activation"]
    short = directory / "short.trr"
    proc = record(short, [sys.executable, SAMPLE, *SMALL, *bug, "--steps", "3",
                          "--bug-at-step", "2"], timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]
    out = {"short": short}
    for steps in (40, 300):
        trace = directory / f"long{steps}.trr"
        proc = record(trace, [sys.executable, SAMPLE, *SMALL, *bug, "--steps", str(steps),
                              "--bug-at-step", str(steps - 1)],
                      flags=["--keep-last", "2"], timeout=900)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert f"step {steps - 2} loss" in proc.stdout, proc.stdout[-500:]
        out[steps] = trace
    return out


def test_the_window_replays_to_the_same_lines(runs):
    code, short = replay(runs["short"])
    assert code == 1 and short["violations"], short
    code, window = replay(runs[300])
    assert code == 1, window
    assert lines_of(window) == lines_of(short)
    script_line = marker_line(SAMPLE, r"BUG\(inplace_activation\)")
    assert lines_of(window)[0] == f"peft_lora.py:{script_line}"
    steps = window["recording"]["steps"]
    assert steps == {"first": 298, "last": 299, "count": 2, "window": True}, steps
    assert window["recording"]["complete"]


def test_the_size_does_not_grow_with_the_run(runs):
    sizes = {name: Path(path).stat().st_size for name, path in runs.items()}
    # 40 and 300 steps keep the same two steps: the same size, give or take compression.
    assert abs(sizes[300] - sizes[40]) < 0.1 * sizes[40], sizes
    assert sizes[300] < 1.5 * sizes["short"], sizes


def test_text_says_which_steps(runs):
    proc = subprocess.run([cli(), "replay", str(runs[300])], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "steps 298 to 299 of the run, the earlier ones not kept" in proc.stdout, proc.stdout


def test_clean_window_is_not_a_clean_bill(tmp_path):
    trace = tmp_path / "clean.trr"
    proc = record(trace, [sys.executable, SAMPLE, *SMALL, "--steps", "6"],
                  flags=["--keep-last", "2"], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    code, document = replay(trace)
    assert code == 8 and not document["violations"], document
    assert document["recording"]["steps"]["first"] == 4, document["recording"]


def start_loop(tmp_path):
    """A training loop recorded with `--keep-last 3`, once its 20th step is done: the recording
    `torchrr record` process, and the trace's path."""
    script = tmp_path / "loop.py"
    script.write_text(
        "import sys, torch\n"
        "w = torch.ones(4, requires_grad=True)\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "step = 0\n"
        "while True:\n"
        "    loss = (w * 2).sigmoid().sum()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n"
        "    step += 1\n"
        "    if step == 20:\n"
        "        open(sys.argv[1], 'w').close()\n")
    ready = tmp_path / "ready"
    trace = tmp_path / "loop.trr"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen([cli(), "record", "-o", str(trace), "--keep-last", "3", "--",
                             sys.executable, str(script), str(ready)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not ready.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    if not ready.exists():
        proc.kill()
        pytest.fail(proc.communicate()[1])
    return proc, trace


def test_sigterm_writes_the_window(tmp_path):
    """A run ended by SIGTERM (the default action: no handler of its own) still leaves its last
    steps, as `torchrr record` forwards the signal."""
    proc, trace = start_loop(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    code, document = replay(trace)
    assert code == 8, document  # A window with no violation.
    steps = document["recording"]["steps"]
    assert steps["count"] == 3 and steps["first"] >= 17, steps


# tgkill(2), to send a signal to one thread of another process.
TGKILL = {"x86_64": 234, "aarch64": 131}


def blocked_signals(pid, tid):
    for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
        if line.startswith("SigBlk:"):
            mask = int(line.split()[1], 16)
            return {s for s in range(1, 64) if mask >> (s - 1) & 1}
    return set()


@pytest.mark.skipif(os.uname().machine not in TGKILL, reason="tgkill's number on this machine")
def test_the_writer_thread_takes_no_fatal_signal(tmp_path):
    """The kernel gives a signal sent to the process to any thread that does not block it. Taken
    on the writer thread, the handler that waits for the window to be written would wait for
    itself, and the process would die 10 s later without its window. The writer thread blocks
    them: a SIGTERM sent to it alone stays pending, and one sent to the process writes the
    window."""
    import ctypes
    proc, trace = start_loop(tmp_path)
    try:
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        assert len(children) == 1, children  # `torchrr record` runs the program as its child.
        child = int(children[0])
        # The writer thread: the one that blocks SIGXFSZ, to see a full disk as an error.
        writers = [int(tid) for tid in os.listdir(f"/proc/{child}/task")
                   if signal.SIGXFSZ in blocked_signals(child, tid)]
        assert len(writers) == 1, writers
        assert {signal.SIGTERM, signal.SIGINT, signal.SIGABRT} <= blocked_signals(child,
                                                                                   writers[0])
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.syscall(TGKILL[os.uname().machine], child, writers[0],
                            int(signal.SIGTERM)) == 0
        time.sleep(0.5)
        assert proc.poll() is None, "the writer thread took the signal"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    code, document = replay(trace)
    assert code == 8, document  # The window, with no violation.
    assert document["recording"]["steps"]["count"] == 3, document["recording"]


def test_steps_range(tmp_path):
    """--steps A:B keeps those steps; a bug after them is not in the trace, which says it holds
    only some steps (exit 8 when nothing is found there)."""
    trace = tmp_path / "range.trr"
    proc = record(trace, [sys.executable, SAMPLE, *SMALL, "--bug", "inplace_activation",
                          "--steps", "12", "--bug-at-step", "9"],
                  flags=["--steps", "4:5"], timeout=600)
    assert proc.returncode == 1, proc.stderr[-2000:]  # The program's own status.
    code, document = replay(trace)
    assert code == 8 and not document["violations"], document
    assert document["recording"]["steps"] == {"first": 4, "last": 5, "count": 2, "window": True}
    bad = subprocess.run([cli(), "record", "--steps", "5:4", "-o", str(tmp_path / "x.trr"), "--",
                          sys.executable, "-c", "pass"], capture_output=True, text=True)
    assert bad.returncode == 2 and "B is before A" in bad.stderr, bad.stderr


def test_program_marks_its_steps(tmp_path):
    """torchrr.step() marks the steps: two backward passes per step (gradient accumulation) make
    one step, numbered from the first mark."""
    script = tmp_path / "accumulate.py"
    script.write_text(
        "import torch, torchrr\n"
        "w = torch.ones(4, requires_grad=True)\n"
        "opt = torch.optim.SGD([w], lr=0.1)\n"
        "for step in range(6):\n"
        "    torchrr.step()\n"
        "    for micro in range(2):\n"
        "        (w * 2).sigmoid().sum().backward()\n"
        "    opt.step()\n"
        "    opt.zero_grad()\n")
    trace = tmp_path / "marked.trr"
    proc = record(trace, [sys.executable, script], flags=["--keep-last", "2"])
    assert proc.returncode == 0, proc.stderr
    code, document = replay(trace)
    assert document["recording"]["steps"] == {"first": 4, "last": 5, "count": 2, "window": True}
    assert document["backward_passes"] == 4, document
    dump = subprocess.run([cli(), "dump", "--json", str(trace)], capture_output=True, text=True)
    marks = [json.loads(line) for line in dump.stdout.splitlines() if '"kind":"step"' in line]
    assert [m["marked"] for m in marks] == [True, True], marks


KILLED = """\
import os, signal, sys, torch, torchrr
w = torch.ones(4, requires_grad=True)
opt = torch.optim.SGD([w], lr=0.1)
for step in range(30):
    h = (w * 2).sigmoid()  # VICTIM
    if step == 25:
        h.mul_(3)  # CULPRIT
    try:
        h.sum().backward()
    except RuntimeError:
        assert torchrr.flush()  # In the spill file; then killed as the OOM killer kills.
        os.kill(os.getpid(), signal.SIGKILL)
    opt.step()
    opt.zero_grad()
"""


def test_spill_outlives_sigkill(tmp_path):
    """--spill DIR: a run killed outright (SIGKILL, as the OOM killer kills) loses the window in
    memory but leaves it in DIR, as a trace cut short that replays to the culprit."""
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    trace, spill = tmp_path / "run.trr", tmp_path / "spill"
    proc = record(trace, [sys.executable, script],
                  flags=["--keep-last", "2", "--spill", str(spill)])
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr[-2000:]
    files = sorted(p.name for p in spill.iterdir())
    assert files == ["run.step00000025.trr"], files
    code, document = replay(spill / files[0])
    assert code == 4, document  # Cut short: the verdict covers what was flushed.
    assert document["trace"]["status"] == "truncated"
    assert lines_of(document) == (f"killed.py:{marker_line(script, 'CULPRIT')}",
                                  f"killed.py:{marker_line(script, 'VICTIM')}")
    steps = document["recording"]["steps"]
    assert steps == {"first": 24, "last": 25, "count": 2, "window": True}, steps


def test_spill_is_removed_once_the_trace_is_written(tmp_path):
    """Through the Python API: the spill directory is made, and emptied at a clean end, when the
    trace holds the window."""
    trace, spill = tmp_path / "api.trr", tmp_path / "spill" / "deeper"
    script = tmp_path / "api.py"
    script.write_text(
        "import sys, torch, torchrr\n"
        "assert torchrr.start(sys.argv[1], keep_last=2, spill=sys.argv[2])\n"
        "w = torch.ones(4, requires_grad=True)\n"
        "for step in range(12):\n"
        "    (w * 2).sigmoid().sum().backward()\n"
        "torchrr.stop()\n")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, script, trace, spill], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert spill.is_dir() and not list(spill.iterdir())
    code, document = replay(trace)
    assert code == 8 and document["recording"]["steps"]["first"] == 10, document["recording"]
    for flags, message in ((["--spill", str(spill)], "--spill requires --keep-last"),
                           (["--keep-last", "2", "--spill", str(script)], "not a directory")):
        bad = subprocess.run([cli(), "record", "-o", str(tmp_path / "x.trr"), *flags, "--",
                              sys.executable, "-c", "pass"], capture_output=True, text=True)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
