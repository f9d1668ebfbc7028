"""Source context in the trace (format 1.4): a trace replays with its code where its sources are
gone, says where the file at hand is not the one the run used, carries only the user's code (not
torch's, site-packages' or the standard library's), and carries none with `record --no-source` or
after `redact --drop-source`."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import marker_line, needs_build, record
from demo_like import SCRIPT
from test_redact import run, verdicts

pytestmark = needs_build

BUG_CODE = "act.mul_(gate)  # BUG"
VICTIM_CODE = "act = torch.sigmoid(gate)  # VICTIM"


# Lines no frame names, more than the context after the script's last line.
PADDING = "".join(f"# padding {i}\n" for i in range(10))


def record_script(directory, flags=()):
    """Records make demo's kind of step (demo_like.py), padded; returns (trace, script, bug line,
    victim line)."""
    script = Path(directory) / "mlp_step.py"
    script.write_text(SCRIPT + PADDING)
    trace = Path(directory) / "run.trr"
    proc = record(trace, [sys.executable, script], flags=flags)
    assert trace.exists() and "backward raised" in proc.stdout, proc.stdout + proc.stderr
    return trace, script, marker_line(script, "BUG"), marker_line(script, "VICTIM")


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    return record_script(tmp_path_factory.mktemp("source"))


def privacy(trace):
    proc = run("info", "--json", trace)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["privacy"]


def source_records(trace):
    """{path: (SourceFile record, {line: text})} from `torchrr dump --json`."""
    proc = run("dump", "--json", trace)
    assert proc.returncode == 0, proc.stderr
    strings, files, lines = {}, {}, {}
    for line in proc.stdout.splitlines():
        record = json.loads(line)
        if record.get("kind") == "string":
            strings[record["id"]] = record["text"]
        elif record.get("kind") == "source_file":
            files[record["file"]] = record
        elif record.get("kind") == "source_lines":
            for i, text in enumerate(record["text"]):
                number = record["first_line"] + i
                assert number not in lines.setdefault(record["file"], {}), "a line written twice"
                lines[record["file"]][number] = text
    return {strings[file]: (info, lines.get(file, {})) for file, info in files.items()}


class Hidden:
    """Moves `path` away while in the `with` block (the recording machine's sources gone)."""

    def __init__(self, path):
        self.path, self.away = Path(path), Path(str(path) + ".away")

    def __enter__(self):
        shutil.move(self.path, self.away)

    def __exit__(self, *exc):
        shutil.move(self.away, self.path)


def test_only_user_code_with_its_hash(recorded):
    trace, script, bug, victim = recorded
    sources = source_records(trace)
    assert list(sources) == [str(script)], "code of files other than the user's script"
    info, lines = sources[str(script)]
    text = script.read_bytes()
    assert info["bytes"] == len(text) and info["lines"] == len(text.decode().splitlines())
    xxhsum = shutil.which("xxhsum")
    if xxhsum:  # The documented hash: `xxhsum -H64` of the file.
        out = subprocess.run([xxhsum, "-H64", script], capture_output=True, text=True).stdout
        assert out.split()[0].lower().endswith(f"{info['hash']:016x}"), out
    source = text.decode().splitlines()
    for number in (bug, victim):
        for near in range(max(1, number - 3), min(len(source), number + 3) + 1):
            assert lines.get(near) == source[near - 1], f"line {near} around {number}"
    padding = len(PADDING.splitlines())
    assert max(lines) <= len(source) - padding + 3, "lines far from every frame"
    shown = privacy(trace)
    assert shown["source_files"] == 1 and shown["source_lines"] == len(lines)


def test_replays_with_code_where_the_sources_are_gone(recorded, tmp_path):
    trace, script, bug, victim = recorded
    moved = tmp_path / "elsewhere" / "run.trr"
    moved.parent.mkdir()
    shutil.copy(trace, moved)
    with Hidden(script):
        proc = run("replay", moved)
        report = tmp_path / "report.html"
        html = run("report", moved, "-o", report)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{script}:{bug}" in proc.stdout and BUG_CODE in proc.stdout, proc.stdout
    assert VICTIM_CODE in proc.stdout, proc.stdout
    assert "differs" not in proc.stdout, proc.stdout
    assert html.returncode == 0, html.stderr
    assert BUG_CODE in report.read_text(), "the HTML report quotes no code"


def test_says_where_the_file_at_hand_differs(recorded, tmp_path):
    trace, script, bug, victim = recorded
    original = script.read_text()
    try:
        # An edit after the run: every line moved down by one.
        script.write_text("# edited after the run\n" + original)
        proc = run("replay", trace)
    finally:
        script.write_text(original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert BUG_CODE in proc.stdout and VICTIM_CODE in proc.stdout, proc.stdout
    assert proc.stdout.count("on this machine differs from the file the run used") == 1, \
        proc.stdout


def test_no_source(tmp_path):
    trace, script, bug, victim = record_script(tmp_path, flags=["--no-source"])
    assert source_records(trace) == {}
    shown = privacy(trace)
    assert shown["source_lines"] == 0 and shown["source_files"] == 0
    with Hidden(script):
        replay = run("replay", trace)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert f"{script}:{bug}" in replay.stdout, replay.stdout
    assert BUG_CODE not in replay.stdout, "code from a trace recorded with --no-source"
    info = run("info", trace).stdout
    assert "source code:      none" in info, info


def test_redact_keeps_or_drops_the_code(recorded, tmp_path):
    trace, script, bug, victim = recorded
    # Paths rewritten to a directory that exists nowhere: the code comes from the trace alone.
    mapped = tmp_path / "mapped.trr"
    proc = run("redact", trace, "-o", mapped, "--map", f"{script.parent}=/nonexistent/project")
    assert proc.returncode == 0, proc.stderr
    replay = run("replay", mapped)
    assert f"/nonexistent/project/{script.name}:{bug}" in replay.stdout, replay.stdout
    assert BUG_CODE in replay.stdout, replay.stdout

    dropped = tmp_path / "dropped.trr"
    proc = run("redact", trace, "-o", dropped, "--drop-source")
    assert proc.returncode == 0 and "source code dropped" in proc.stderr, proc.stderr
    assert source_records(dropped) == {}
    assert privacy(dropped)["source_lines"] == 0
    (code, dropped_verdicts), (original_code, original) = verdicts(dropped), verdicts(trace)
    assert dropped_verdicts.pop("records") < original.pop("records")  # The source records.
    assert (code, dropped_verdicts) == (original_code, original)
    with Hidden(script):
        assert BUG_CODE not in run("replay", dropped).stdout


def test_api_switch(tmp_path):
    """torchrr.record(..., source=False) leaves the code out; the default keeps it."""
    script = tmp_path / "api_step.py"
    script.write_text(
        "import sys\n"
        "import torch\n"
        "import torchrr\n"
        "for name, source in ((\"on.trr\", True), (\"off.trr\", False)):\n"
        "    with torchrr.record(sys.argv[1] + \"/\" + name, source=source):\n"
        "        x = torch.ones(3, requires_grad=True)\n"
        "        (x * 2).sum().backward()  # STEP\n")
    proc = subprocess.run([sys.executable, script, tmp_path], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr
    on = source_records(tmp_path / "on.trr")
    assert list(on) == [str(script)]
    assert on[str(script)][1][marker_line(script, "STEP")].strip().startswith("(x * 2)")
    assert source_records(tmp_path / "off.trr") == {}
