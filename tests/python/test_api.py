"""The in-process API: `with torchrr.record(...)`, start()/stop(), replay()'s errors."""
import sys
from pathlib import Path

import pytest

import torchrr
from conftest import PYTORCH_INPLACE, cli, needs_build

THIS = __file__


def sigmoid_bug():
    import torch

    x = torch.randn(6, requires_grad=True)
    y = torch.sigmoid(x)  # VICTIM
    y.add_(1)  # CULPRIT
    y.sum().backward()


def line_of(marker):
    with open(THIS) as f:
        return next(i for i, line in enumerate(f, 1) if line.rstrip().endswith("# " + marker))


def test_import_does_not_import_torch():
    import subprocess

    code = "import sys, torchrr; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={"PYTHONPATH": str(torchrr.__path__[0] + "/..")})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


@needs_build
def test_version_is_the_command_lines():
    import subprocess

    shown = subprocess.run([cli(), "--version"], capture_output=True, text=True, timeout=30)
    assert shown.stdout.split()[:2] == ["torchrr", torchrr.__version__], shown.stdout
    with pytest.raises(AttributeError):
        torchrr.no_such_attribute


@needs_build
def test_record_context_manager_records_the_exception(tmp_path):
    trace = tmp_path / "api.trr"
    with pytest.raises(RuntimeError, match=PYTORCH_INPLACE):
        with torchrr.record(trace) as rec:
            assert rec.recording and torchrr.recording()
            sigmoid_bug()
    assert not torchrr.recording()
    report = torchrr.replay(trace)
    assert len(report.violations) == 1
    v = report.violations[0]
    assert v.pytorch_raised and PYTORCH_INPLACE in v.pytorch_message
    assert v.backward_node.name == "SigmoidBackward0"
    assert (v.culprit.op, v.culprit.user_frame.line) == ("aten::add_", line_of("CULPRIT"))
    assert v.culprit.user_frame.function == "sigmoid_bug"
    assert v.culprit.user_frame.file == THIS
    assert v.victim.user_frame.line == line_of("VICTIM")
    # Frames below the user's: pytest's own (site-packages) are framework, this file is not.
    python = [f for f in v.culprit.stack if f.python]
    assert not python[0].framework
    assert any(f.framework and "site-packages" in f.file for f in python)


@needs_build
def test_the_exception_leaving_record_carries_the_verdict(tmp_path):
    # Its traceback, printed where the program dies or in a notebook cell, ends with the lines.
    with pytest.raises(RuntimeError, match=PYTORCH_INPLACE) as info:
        with torchrr.record(tmp_path / "noted.trr"):
            sigmoid_bug()
    notes = getattr(info.value, "__notes__", [])
    assert len(notes) == 1, notes
    assert notes[0].startswith("torchrr: 1 violation in "), notes[0]
    assert f"  culprit: {THIS}:{line_of('CULPRIT')} in sigmoid_bug\n" in notes[0], notes[0]
    assert f"  victim:  {THIS}:{line_of('VICTIM')} in sigmoid_bug\n" in notes[0], notes[0]
    # An exception the trace does not explain gets no note.
    with pytest.raises(ValueError) as clean:
        with torchrr.record(tmp_path / "clean.trr"):
            raise ValueError("not about saved tensors")
    assert not getattr(clean.value, "__notes__", [])


@needs_build
def test_second_recording_names_the_same_code_again(tmp_path):
    # Code objects are interned for the process; each trace must still describe them.
    for name in ("first.trr", "second.trr"):
        assert torchrr.start(tmp_path / name)
        try:
            sigmoid_bug()
        except RuntimeError:
            pass
        assert torchrr.stop()
        v = torchrr.replay(tmp_path / name).violations[0]
        assert v.culprit.user_frame is not None, name
        assert v.culprit.user_frame.function == "sigmoid_bug", name


def dumped_records(trace):
    """Every record of `trace`, as `torchrr dump --json` gives them (dicts, in order)."""
    import json
    import subprocess

    out = subprocess.run([cli(), "dump", "--json", str(trace)], check=True,
                         capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def ops_inside(trace, parent_name):
    """How many ops of `trace` ran inside an op named `parent_name`, from the dump."""
    strings, names, parents = {}, {}, []
    for r in dumped_records(trace):
        if r["kind"] == "string":
            strings[r["id"]] = r["text"]
        elif r["kind"] == "op":
            names[r["op"]] = strings.get(r["name"])
            parents.append(r.get("parent", 0))
    return sum(1 for p in parents if names.get(p) == parent_name)


@needs_build
def test_folded_ops_are_recorded_only_when_asked_for(tmp_path):
    import torch

    def program():
        x = torch.randn(6, requires_grad=True)
        (x * x).sum().backward()  # MulBackward0's formula runs aten::mul twice: folded.
        y = torch.sigmoid(x.to(torch.float64))
        y.add_(1)
        y.sum().backward()

    found = {}
    for all_ops in (False, True):
        trace = tmp_path / f"all_ops_{all_ops}.trr"
        with torchrr.record(trace, all_ops=all_ops):
            try:
                program()
            except RuntimeError:
                pass
        (v,) = torchrr.replay(trace).violations
        found[all_ops] = ((ops_inside(trace, "aten::_to_copy"), ops_inside(trace, "MulBackward0")),
                          v.culprit.op, v.victim.op, v.backward_node.name,
                          v.culprit.user_frame.line)
    assert found[False][0] == (0, 0) and min(found[True][0]) > 0, found
    assert found[False][1:] == found[True][1:] == (
        "aten::add_", "aten::sigmoid", "SigmoidBackward0", found[False][4]), found


@needs_build
def test_python_stacks_off(tmp_path):
    trace = tmp_path / "nostacks.trr"
    with torchrr.record(trace, python_stacks=False):
        try:
            sigmoid_bug()
        except RuntimeError:
            pass
    v = torchrr.replay(trace).violations[0]
    assert v.culprit.op == "aten::add_"
    assert v.culprit.stack == [] and v.culprit.user_frame is None


@needs_build
def test_native_stacks_off_unless_asked(tmp_path):
    # As under `torchrr record` for a Python program, whose C++ frames are the interpreter's and
    # torch's: Python frames only, unless C++ stacks are asked for.
    kinds = {}
    for options in ({}, {"native_stacks": True}):
        trace = tmp_path / f"native_{bool(options)}.trr"
        with torchrr.record(trace, **options):
            try:
                sigmoid_bug()
            except RuntimeError:
                pass
        stack = torchrr.replay(trace).violations[0].culprit.stack
        kinds[bool(options)] = {"python" if f.python else "native" for f in stack}
    assert kinds == {False: {"python"}, True: {"python", "native"}}


WALKER_PROGRAM = """
import asyncio, sys, threading, torch, torchrr
from torchrr import _native

x = torch.ones(3)

def leaf(i):
    return x.add(i)

def gen(n):
    for i in range(n):
        yield x.mul(i)  # In a generator's frame.

class Model:
    def forward(self, i):
        return [leaf(j) for j in range(2)]  # From a comprehension.

def recurse(n):
    if n == 0:
        try:
            raise ValueError
        except ValueError:
            return leaf(0)  # In an exception handler, at varying depth.
    return recurse(n - 1)

async def coroutine(i):
    await asyncio.sleep(0)
    return x.div(i + 1)  # In a coroutine's frame, resumed by the event loop.

async def many():
    for i in range(20):
        await coroutine(i)

def main():
    m = Model()
    for i in range(120):  # More ops than the fast walker's first checked captures.
        m.forward(i)
        list(gen(2))
        recurse(i % 7)
        (lambda: x.sub(1))()
    asyncio.run(many())
    worker = threading.Thread(target=lambda: [leaf(i) for i in range(20)])  # Another thread.
    worker.start()
    worker.join()

with torchrr.record(sys.argv[1]):
    main()
print(_native.library().torchrr_python_stack_walker().decode())
"""


def resolved_stacks(trace):
    """Each op's name and Python frames (file, line, function), innermost first, from the dump."""
    strings, frames, stacks, ops = {}, {}, {}, []
    for r in dumped_records(trace):
        if r["kind"] == "string":
            strings[r["id"]] = r["text"]
        elif r["kind"] == "frame":
            frames[r["id"]] = r
        elif r["kind"] == "stack":
            stacks[r["id"]] = r["frames"]
        elif r["kind"] == "op":
            ops.append((strings.get(r["name"]), [
                (strings.get(frames[f].get("file")), frames[f].get("line"),
                 strings.get(frames[f].get("function")))
                for f in stacks.get(r.get("stack", 0), [])]))
    return ops


@needs_build
def test_python_stacks_read_from_frames_match_the_api(tmp_path):
    # On CPython 3.11 the recorder reads the interpreter's frames directly; elsewhere, or with
    # TORCHRR_PYTHON_WALKER=api, it goes through frame objects. Both must give the same stacks.
    import os
    import subprocess

    program = tmp_path / "walk.py"
    program.write_text(WALKER_PROGRAM)
    env = dict(os.environ, PYTHONPATH=str(Path(torchrr.__path__[0]).parent))
    env.pop("TORCHRR_PYTHON_WALKER", None)
    runs = {}
    for walker in ("default", "api"):
        run_env = dict(env, TORCHRR_PYTHON_WALKER="api") if walker == "api" else env
        trace = tmp_path / f"{walker}.trr"
        out = subprocess.run([sys.executable, str(program), str(trace)], env=run_env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        runs[walker] = (out.stdout.strip().splitlines()[-1], resolved_stacks(trace))
    fast = "frames" if sys.version_info[:2] == (3, 11) else "api"
    assert runs["default"][0] == fast  # Still on after checking its walks against the API's.
    assert runs["api"][0] == "api"
    default_ops, api_ops = runs["default"][1], runs["api"][1]
    with_stacks = [stack for _, stack in default_ops if stack]
    assert len(with_stacks) >= 700
    functions = {frame[2] for stack in with_stacks for frame in stack}
    assert {"leaf", "gen", "Model.forward", "recurse", "main", "coroutine", "many"} <= functions
    assert default_ops == api_ops


@needs_build
def test_start_twice_and_stop_without_start(tmp_path):
    assert not torchrr.stop()
    assert torchrr.start(tmp_path / "a.trr")
    try:
        assert not torchrr.start(tmp_path / "b.trr")  # Already recording: a warning, False.
    finally:
        assert torchrr.stop()


@needs_build
def test_replay_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        torchrr.replay(tmp_path / "missing.trr")
    junk = tmp_path / "junk.trr"
    junk.write_bytes(b"not a trace at all" * 10)
    with pytest.raises(torchrr.ReplayError) as info:
        torchrr.replay(junk)
    assert info.value.exit_code == 3


COMPILED_STEPS = """
import sys
import torch
import torchrr


def f(x, w):
    return torch.sigmoid(x @ w) * x  # VICTIM


g = torch.compile(f)
w = torch.randn(8, 8, requires_grad=True)
with torchrr.record(sys.argv[1]):
    for step in range(2):
        h = torch.randn(4, 8, requires_grad=True) * 2
        y = g(h, w)
        if step == 1:
            h.add_(1)
        try:
            y.sum().backward()
        except RuntimeError:
            print("raised")
import torch._functorch.config as config
print(config.enable_autograd_cache)
"""


@needs_build
def test_compiled_regions_name_their_lines_on_a_second_run(tmp_path):
    # The first run's clean step compiles the region's backward, which AOTAutograd would put in
    # its cache, and the second run would load the region from there with no backward graph to
    # name the line inside it: while recording, that cache is off (and back on after).
    import os
    import subprocess

    script = tmp_path / "compiled.py"
    script.write_text(COMPILED_STEPS)
    victim = next(i for i, line in enumerate(COMPILED_STEPS.splitlines(), 1)
                  if line.endswith("# VICTIM"))
    env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_AUTOGRAD_CACHE"}
    env.update(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "inductor"), OMP_NUM_THREADS="1")
    for run in range(2):
        trace = tmp_path / f"run{run}.trr"
        proc = subprocess.run([sys.executable, script, trace], capture_output=True, text=True,
                              env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == ["raised", "True"], proc.stdout
        v = torchrr.replay(trace).violations[0]
        assert v.victim.op.startswith("Torch-Compiled Region")
        assert (v.victim.user_frame.file, v.victim.user_frame.line) == (str(script), victim)


@needs_build
def test_flush_puts_what_was_recorded_on_disk(tmp_path):
    import subprocess

    import torch

    assert not torchrr.flush()  # Nothing records.
    trace = tmp_path / "flushed.trr"
    with torchrr.record(trace):
        torch.ones(3).add(2)
        assert torchrr.flush()
        # The trace is still open: it reads to its last chunk, which holds the add.
        dump = subprocess.run([str(cli()), "dump", "--json", str(trace)], capture_output=True,
                              text=True, timeout=60)
        assert '"aten::add"' in dump.stdout, dump.stderr
    assert not torchrr.flush()
