"""`torchrr replay --format gnu` and `--format sarif` on a recorded bug: the culprit's line is
where editors and code-scanning views read it, and the SARIF log is valid against OASIS's
SARIF 2.1.0 schema (tests/python/data/sarif-schema-2.1.0.json, vendored from
oasis-tcs/sarif-spec's sarif-2.1/schema)."""
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlsplit

import jsonschema
import pytest

from conftest import cli, marker_line, needs_build, record

pytestmark = needs_build

SCHEMA = Path(__file__).parent / "data" / "sarif-schema-2.1.0.json"

# The same bug at every step, each step's error caught: three violations, one diagnostic.
BUGGY = textwrap.dedent("""\
    import torch
    for step in range(3):
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)  # VICTIM
        y.mul_(2)  # CULPRIT
        try:
            y.sum().backward()
        except RuntimeError:
            pass
    """)


@pytest.fixture(scope="module")
def buggy_trace(tmp_path_factory):
    """(script, trace) of BUGGY, recorded."""
    directory = tmp_path_factory.mktemp("editor_formats")
    script = directory / "buggy.py"
    script.write_text(BUGGY)
    trace = directory / "run.trr"
    proc = record(trace, [sys.executable, script], cwd=directory, flags=["--quiet"])
    assert proc.returncode == 0 and trace.exists(), proc.stderr
    return script, trace


def replay(*args):
    return subprocess.run([cli(), "replay", *map(str, args)], capture_output=True, text=True,
                          timeout=60)


def validate_sarif(log):
    schema = json.loads(SCHEMA.read_text())
    validator = jsonschema.Draft4Validator(schema, format_checker=jsonschema.FormatChecker())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(log)]
    assert errors == [], "\n".join(errors)


def test_gnu_puts_the_error_on_the_culprits_line(buggy_trace):
    script, trace = buggy_trace
    proc = replay("--format", "gnu", trace)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    culprit, victim = marker_line(script, "CULPRIT"), marker_line(script, "VICTIM")
    # Column 5: the statement's first character, after the loop's indentation.
    assert re.match(rf"^{re.escape(str(script))}:{culprit}:5: error: ", lines[0]), lines
    # Three steps' violations are one line that says how many.
    assert "saved tensor modified in place by aten::mul_.Tensor" in lines[0], lines[0]
    assert f"aten::sigmoid at {script}:{victim} saved it for SigmoidBackward0" in lines[0]
    assert lines[0].endswith(" (3 times)"), lines[0]
    assert sum(": error: " in line for line in lines) == 1, lines
    assert lines[1] == (f"{script}:{victim}:5: note: aten::sigmoid saved the tensor here for "
                        "SigmoidBackward0"), lines
    assert lines[2].startswith(f"{script}:{culprit}:5: note: help: make aten::mul_.Tensor out "
                               "of place"), lines


def test_sarif_is_valid_and_points_at_the_culprit(buggy_trace):
    script, trace = buggy_trace
    proc = replay("--format", "sarif", trace)
    assert proc.returncode == 1, proc.stderr
    log = json.loads(proc.stdout)
    validate_sarif(log)
    [run] = log["runs"]
    assert run["tool"]["driver"]["name"] == "torchrr"
    rules = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert {"version", "silent", "detached", "freed", "unpack_hook", "cached_mutated"} <= set(rules)
    assert run["invocations"][0]["executionSuccessful"] is True
    [result] = run["results"]
    assert result["ruleId"] == "version" and rules[result["ruleIndex"]] == "version"
    location = result["locations"][0]["physicalLocation"]
    # The recorded path is absolute: a file URI that names it.
    assert urlsplit(location["artifactLocation"]["uri"]).scheme == "file"
    assert location["artifactLocation"]["uri"] == script.as_uri()
    assert location["region"]["startLine"] == marker_line(script, "CULPRIT")
    assert location["region"]["startColumn"] == 5
    victim = result["relatedLocations"][0]["physicalLocation"]
    assert victim["region"]["startLine"] == marker_line(script, "VICTIM")
    node = result["relatedLocations"][1]["logicalLocations"][0]
    assert node["name"] == "SigmoidBackward0"
    properties = result["properties"]
    assert properties["count"] == 3 and properties["backward_passes"] == [0, 1, 2], properties
    assert properties["kind"] == "version" and properties["backward_pass"] == 0


def test_sarif_of_an_unreadable_trace_is_a_valid_failed_invocation(tmp_path, buggy_trace):
    _, trace = buggy_trace
    not_a_trace = tmp_path / "notes.trr"
    not_a_trace.write_text("not a trace\n")
    proc = replay("--format", "sarif", trace, not_a_trace)
    assert proc.returncode == 3, proc.stderr
    log = json.loads(proc.stdout)
    validate_sarif(log)
    invocations = log["runs"][0]["invocations"]
    assert [i["executionSuccessful"] for i in invocations] == [True, False]
    [notification] = invocations[1]["toolExecutionNotifications"]
    assert notification["level"] == "error"
    assert "trace not read (not_a_trace)" in notification["message"]["text"]
    # The readable trace's result is still there.
    assert [r["ruleId"] for r in log["runs"][0]["results"]] == ["version"]


def test_json_and_short_stay_aliases(buggy_trace):
    _, trace = buggy_trace
    assert replay("--json", trace).stdout == replay("--format", "json", trace).stdout
    assert replay("--short", trace).stdout == replay("--format", "short", trace).stdout
    assert replay("--json", "--format", "gnu", trace).returncode == 2


def replay_on_a_terminal(trace, env):
    """`torchrr replay --color auto TRACE` with its stdout a terminal (a pty): what it printed."""
    import os
    import pty

    controller, terminal = pty.openpty()
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    proc = subprocess.run([cli(), "replay", "--color", "auto", str(trace)], stdout=terminal,
                          stderr=subprocess.DEVNULL, env={**full_env, **env}, timeout=60)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the terminal's other side is closed and drained.
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    assert proc.returncode == 1
    return b"".join(chunks).decode()


def test_no_color_and_a_dumb_terminal_turn_colour_off(buggy_trace):
    _, trace = buggy_trace
    assert "\x1b[" in replay_on_a_terminal(trace, {"TERM": "xterm"})
    for env in ({"NO_COLOR": "1", "TERM": "xterm"}, {"TERM": "dumb"}):
        shown = replay_on_a_terminal(trace, env)
        assert "saved tensor modified in place" in shown and "\x1b[" not in shown, env
    # An empty NO_COLOR is no request (no-color.org).
    assert "\x1b[" in replay_on_a_terminal(trace, {"NO_COLOR": "", "TERM": "xterm"})
