"""Where the gradient stopped: small programs under `torchrr record`, each recorded once and
replayed with torchrr.replay. Each script's first line states what the replay must find
(`# EXPECT k=v ...`): `cause` (the first gradient cut's), `raised` (0/1: backward raised),
`params` (how many parameters the cut kept from backward), `exit` (the script's, 1 by default);
a script with no `cause` is a legal twin that must report no cut. Its `# CUT` comment marks the
line the cut is at (the checkpoint's call for a reentrant checkpoint)."""
import sys
from pathlib import Path

import pytest

import torchrr
from conftest import marker_line, needs_build, record, same_file

CASES = Path(__file__).parent / "gradient_cuts"
NO_GRAD_FN = "does not require grad and does not have a grad_fn"


def expectations(script):
    first = script.read_text().splitlines()[0]
    assert first.startswith("# EXPECT"), f"{script}: first line must be '# EXPECT ...'"
    return dict(item.split("=", 1) for item in first[len("# EXPECT"):].split())


@needs_build
@pytest.mark.parametrize("script", sorted(CASES.glob("*.py")), ids=lambda p: p.stem)
def test_gradient_cut(script, tmp_path):
    expect = expectations(script)
    trace = tmp_path / "run.trr"
    proc = record(trace, [sys.executable, script])
    assert proc.returncode == int(expect.get("exit", "1")), proc.stderr[-2000:]
    report = torchrr.replay(trace)
    assert report.trace.get("status") == "ok", report.trace
    assert report.violations == []
    cuts = report.gradient_cuts
    if "cause" not in expect:
        assert cuts == [], [str(c) for c in cuts]
        assert report.exit_code == 0
        assert "the gradient stopped" not in proc.stderr
        return

    assert report.exit_code == 15, report.raw
    assert len(cuts) == 1, [str(c) for c in cuts]
    cut = cuts[0]
    assert cut.cause == expect["cause"]
    assert cut.raised == (expect["raised"] == "1")
    if cut.raised:
        assert NO_GRAD_FN in cut.message
        assert report.program_error is None  # The cut explains it.
    at = cut.checkpoint if cut.cause == "reentrant_checkpoint" else cut.op
    assert at is not None and at.user_frame is not None, cut
    assert same_file(at.user_frame.file, script)
    assert at.user_frame.line == marker_line(script, "CUT")
    if "params" in expect:
        assert cut.parameter_count == int(expect["params"]), cut.parameters
    assert cut.help
    # The verdict `torchrr record` prints after the program, at the same line.
    assert "torchrr: the gradient stopped" in proc.stderr, proc.stderr[-2000:]
    assert f"{script.name}:{at.user_frame.line}" in proc.stderr
