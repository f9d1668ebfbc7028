"""Signals under `torchrr record`, as a shell user expects: the program gets each signal once,
closes its trace on the way out, and its exit status is its own.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group, `torchrr record` and
the program alike; the tests send it the same way (os.killpg), to a `torchrr record` started in
a session of its own so that the test itself is not hit.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time

from conftest import cli, needs_build, record

pytestmark = needs_build

# The program: some ops, then waits to be interrupted; its cleanup runs more ops and takes long
# enough that a second SIGINT (one forwarded by `torchrr record`) would land inside it.
INTERRUPTED_PROGRAM = textwrap.dedent("""\
    import os, sys, time, torch
    x = torch.ones(4, requires_grad=True)
    (x * 2).sum().backward()
    open(sys.argv[1], "w").close()
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        time.sleep(0.5)
        (x * 3).sum().backward()
        print("cleanup done", flush=True)
    sys.exit(0)
    """)


def _as_in_a_terminal():
    """A terminal's foreground job starts with SIGINT and SIGQUIT at their defaults. The tests may
    not: a non-interactive shell starts its background jobs (`make test &`) with both ignored,
    which survives exec, and a Python started so never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _start_recording(tmp_path, script, ready, trace):
    """`torchrr record -o TRACE -- python SCRIPT READY` in a new session, once READY exists."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "RANK"):
        env.pop(name, None)
    proc = subprocess.Popen([cli(), "record", "-o", str(trace), "--", sys.executable,
                             str(script), str(ready)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=_as_in_a_terminal)
    deadline = time.monotonic() + 60
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the program never got ready: {out}{err}")
        time.sleep(0.05)
    return proc


def test_ctrl_c_reaches_the_program_once(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(INTERRUPTED_PROGRAM)
    for attempt in range(5):
        ready = tmp_path / f"ready{attempt}"
        trace = tmp_path / f"run{attempt}.trr"
        proc = _start_recording(tmp_path, script, ready, trace)
        os.killpg(proc.pid, signal.SIGINT)  # What the terminal does on Ctrl-C.
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise
        assert proc.returncode == 0, f"attempt {attempt}: exit {proc.returncode}: {err}"
        assert "cleanup done" in out, f"attempt {attempt}: {out}{err}"
        info = subprocess.run([cli(), "info", str(trace)], capture_output=True, text=True,
                              timeout=60)
        assert info.returncode == 0, f"attempt {attempt}: trace not closed: {info.stderr}"


def test_sigterm_sent_to_torchrr_record_is_forwarded_once(tmp_path):
    # A job scheduler stops what it started: the program gets that SIGTERM once.
    script = tmp_path / "terminated.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, sys, time, torch
        received = []
        def on_term(number, frame):
            received.append(number)
            if len(received) == 1:
                time.sleep(0.5)  # A second SIGTERM would land here.
                print("terms", len(received), flush=True)
                sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        torch.ones(3).add(1)
        open(sys.argv[1], "w").close()
        while True:
            time.sleep(0.05)
        """))
    trace = tmp_path / "run.trr"
    proc = _start_recording(tmp_path, script, tmp_path / "ready", trace)
    os.kill(proc.pid, signal.SIGTERM)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.returncode == 0, err
    assert out.split() == ["terms", "1"], out + err
    assert subprocess.run([cli(), "info", str(trace)], capture_output=True,
                          timeout=60).returncode == 0


def test_a_program_killed_by_a_signal_exits_128_plus_n(tmp_path):
    script = tmp_path / "killed.py"
    script.write_text("import os, signal, torch\ntorch.ones(2).add(1)\n"
                      "os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = record(tmp_path / "run.trr", [sys.executable, script], timeout=60)
    assert proc.returncode == 128 + signal.SIGKILL, proc.stderr


def test_the_program_ends_when_torchrr_record_is_killed(tmp_path):
    # SIGKILL (or the OOM killer) on the wrapper alone: the program must not train on orphaned,
    # its exit status lost. It gets SIGTERM (PR_SET_PDEATHSIG); its handler runs, and its trace
    # keeps what was written.
    script = tmp_path / "orphan.py"
    script.write_text(textwrap.dedent("""\
        import os, signal, sys, time, torch
        def on_term(number, frame):
            open(sys.argv[1] + ".term", "w").close()
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        torch.ones(3).add(1)
        with open(sys.argv[1], "w") as ready:
            ready.write(str(os.getpid()))
        while True:
            time.sleep(0.05)
        """))
    ready = tmp_path / "ready"
    proc = _start_recording(tmp_path, script, ready, tmp_path / "run.trr")
    deadline = time.monotonic() + 10
    while not ready.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    program = int(ready.read_text())
    proc.kill()  # The wrapper alone, not its process group.
    proc.communicate(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:  # Gone, or a zombie that whoever adopted it has not reaped yet.
            with open(f"/proc/{program}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.05)
    else:
        os.kill(program, signal.SIGKILL)
        raise AssertionError("the program trains on after torchrr record was killed")
    assert (tmp_path / "ready.term").exists(), "the program did not get SIGTERM"
