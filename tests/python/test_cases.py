"""Tiny bug (and legal) scripts under `torchrr record -- python script.py`, replayed with
torchrr.replay. Each script's first line states what the replay must find (`# EXPECT k=v ...`);
its `# CULPRIT` and `# VICTIM` comments mark the lines (several `# VICTIM` lines: the victim is on
one of them, where torch releases name different lines).

Keys: `kind`, `node`, `victim_op`, `raised` (0/1) of the first violation; `op` (the culprit's op),
or `culprit=none`; `saved`, `current` (versions); `evidence` (silent; `-`: none); `message` (a phrase of
PyTorch's message, `_` for spaces; by default the one of the kind, MESSAGES); `verify_saved=1`;
`culprit=hook` (the culprit is the saved_tensors_hooks unpack hook, defined on the `# CULPRIT`
line); `exit` (the script's, 1 by default); `violations` (a count, nothing else checked) and `passes`
(backward passes); `victim_prefix` (instead of `victim_op`, for an op name with spaces); `tags`
(the modes a case runs under, from TAGS, so that each mode's cases can be found:
`grep -l tags=.*checkpoint`); `function` (the culprit ran inside that Python autograd.Function's
forward or backward: the `# CULPRIT` line is in the Function, and `# CALLED_FROM` marks the line
that ran it, the apply() or the backward() call); `read_by_recompute=1` (the tensor was not saved
but read by a reentrant checkpoint's block and again by its recomputation).

`KEY@MAJOR.MINOR=VALUE` replaces KEY's value for traces that torch MAJOR.MINOR or later recorded
(the torch the trace names), where PyTorch names things otherwise: `node@2.12=...`. The latest
such release not after the trace's torch wins; a trace before all of them keeps `KEY=VALUE`."""
import sys
from pathlib import Path

import pytest

import torchrr
from conftest import (PYTORCH_INPLACE, marker_line, marker_lines, needs_build, record_warm,
                      same_file, trace_order_problems)

CASES = Path(__file__).parent / "cases"
TAGS = {"hooks", "save_on_cpu", "checkpoint", "reentrant", "non_reentrant", "recomputation",
        "optimizer", "selective", "compile", "inductor", "aot_eager", "fullgraph", "graph_break",
        "autocast", "grad_scaler", "subclass", "dtensor"}

# A phrase of the message PyTorch raises for each kind (torch/csrc/autograd/saved_variable.cpp).
MESSAGES = {
    "version": PYTORCH_INPLACE,
    "detached": "Trying to use a saved tensor that has been detached in-place",
    "freed": "Trying to backward through the graph a second time",
}


def expectations(script, torch_version=None):
    """The `# EXPECT` keys of `script`, with the values for a trace that `torch_version` (the
    torch the trace names, "2.15.0+cu132"; "" when it names none) recorded; None, before there is
    a trace: the values without a release."""
    first = script.read_text().splitlines()[0]
    assert first.startswith("# EXPECT "), f"{script}: first line must be '# EXPECT ...'"
    expect, since = {}, {}
    for item in first[len("# EXPECT "):].split():
        key, value = item.split("=", 1)
        if "@" not in key:
            expect[key] = value
            continue
        key, release = key.split("@", 1)
        since.setdefault(key, []).append((release_tuple(release), value))
    if since and torch_version is not None:
        assert torch_version, f"{script}: values by release, and the trace names no torch"
        recording = release_tuple(torch_version)
        for key, values in since.items():
            assert key in expect, f"{script}: {key}@... without {key}=..."
            applying = [(release, value) for release, value in values if release <= recording]
            if applying:
                expect[key] = max(applying)[1]
    return expect


def release_tuple(version):
    """(major, minor) of "2.12" or "2.15.0+cu132"."""
    major, minor = version.split("+")[0].split(".")[:2]
    return int(major), int(minor)


@needs_build
@pytest.mark.parametrize("all_ops", [False, True], ids=["", "all_ops"])
@pytest.mark.parametrize("script", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_case(script, all_ops, tmp_path):
    # The same findings whether or not the ops folded into the op around them are recorded.
    expect = expectations(script)
    assert set(filter(None, expect.get("tags", "").split(","))) <= TAGS, expect["tags"]
    trace = tmp_path / "run.trr"
    flags = ["--verify-saved"] if expect.get("verify_saved") == "1" else []
    if all_ops:
        flags.append("--all-ops")
    proc = record_warm(trace, [sys.executable, script], flags=flags)
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok", report.trace
    expect = expectations(script, report.trace.get("torch", ""))
    want_exit = int(expect.get("exit", "1"))
    assert proc.returncode == want_exit, proc.stderr[-2000:]
    message = expect["message"].replace("_", " ") if "message" in expect else \
        MESSAGES.get(expect.get("kind", "version"))
    if want_exit == 1:
        assert message in proc.stderr  # The script's traceback, passed through.
    assert report.ops > 0
    assert trace_order_problems(trace) == []
    if "passes" in expect:
        assert report.backward_passes == int(expect["passes"])

    if "violations" in expect:
        assert len(report.violations) == int(expect["violations"]), report.violations
        # A backward that raised and no violation: PyTorch's error, reported as unexplained.
        unexplained = report.raw.get("unexplained_errors", [])
        assert len(unexplained) == (1 if want_exit == 1 else 0), unexplained
        if unexplained:
            assert message in (unexplained[0].get("message") or "")
        return
    assert report.violations, "no violation found"
    v = report.violations[0]
    assert v.kind == expect["kind"]
    assert v.backward_node.name == expect["node"]
    if "saved" in expect:
        assert v.saved_version == int(expect["saved"])
        assert v.current_version == int(expect["current"])
    else:
        assert v.current_version > v.saved_version
    assert v.pytorch_raised == (expect["raised"] == "1")
    if v.pytorch_raised:
        assert v.pytorch_message and message in v.pytorch_message
    else:
        assert v.pytorch_message is None
    assert v.read_by_recompute == (expect.get("read_by_recompute") == "1")
    if "evidence" in expect:  # "-": none (a violation PyTorch raised for).
        assert v.evidence == (None if expect["evidence"] == "-" else expect["evidence"])

    assert v.victim is not None
    if "victim_prefix" in expect:  # An op name with spaces ("Torch-Compiled Region: 0/0").
        assert v.victim.op.startswith(expect["victim_prefix"]), v.victim.op
    else:
        assert v.victim.op == expect["victim_op"]
    assert same_file(v.victim.user_frame.file, script)
    victims = marker_lines(script, "VICTIM")
    assert victims, f"{script}: no line marked VICTIM"
    assert v.victim.user_frame.line in victims, (v.victim.user_frame.line, victims)

    if expect.get("evidence") == "fingerprint":
        # No recorded op wrote it: no culprit, but the ops that touched its bytes are candidates.
        assert v.evidence == "fingerprint"
        assert v.culprit is None
        assert v.fingerprint and v.fingerprint["at_save"] != v.fingerprint["at_use"]
        lines = [c.op.user_frame.line for c in v.candidates if c.op.user_frame and
                 same_file(c.op.user_frame.file, script)]
        # A write through data_ptr() (ctypes, a kernel) made no tensor over the bytes: none.
        candidates = marker_lines(script, "CANDIDATE")
        assert lines == [] if not candidates else candidates[0] in lines, v.candidates
        return

    if expect.get("culprit") == "none":
        assert v.culprit is None
        return
    assert v.culprit is not None
    assert v.culprit.hook == (expect.get("culprit") == "hook"), v.culprit
    if v.culprit.hook:  # Not an op: where the hook was defined.
        assert v.culprit.op is None and v.culprit.id == 0
        assert same_file(v.culprit.user_frame.file, script)
        assert v.culprit.user_frame.line == marker_line(script, "CULPRIT")
        return
    if "op" in expect:
        assert v.culprit.op == expect["op"]
    assert same_file(v.culprit.user_frame.file, script)
    assert v.culprit.user_frame.line == marker_line(script, "CULPRIT")
    if "function" in expect:
        context = v.culprit.function
        assert context is not None and context.name == expect["function"], v.culprit
        assert context.called_from.line == marker_line(script, "CALLED_FROM"), context
    else:
        assert v.culprit.function is None, v.culprit

    callers = marker_lines(script, "CALLER")
    if callers:
        in_script = [f.line for f in v.culprit.stack if f.python and same_file(f.file, script)]
        assert in_script[:1] == [marker_line(script, "CULPRIT")]
        for line in callers:
            assert line in in_script, (line, in_script)
        functions = [f.function for f in v.culprit.stack if f.python]
        assert functions[:3] == ["rescale", "normalize", "forward"], functions
