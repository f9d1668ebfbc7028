"""Each recording option is one row of recording_options.def: every row reaches the recorder
from `torchrr record` (its flag sets the row's variable, as the row's text) and from Python (its
keyword, through torchrr_start_with), and what the rows say goes together is refused alike."""
import os
import re
import subprocess

import pytest

from conftest import REPO, needs_build, record

import torchrr

pytestmark = needs_build

DEF = REPO / "recorder" / "include" / "torchrr" / "recording_options.def"
FIELDS = ("type", "field", "default", "environment", "flag", "flag_value", "flag_scale",
          "keyword", "least", "most", "example", "value_name", "help")


def _arguments(text):
    """A macro call's arguments, split at the commas outside brackets and strings."""
    args, depth, current, quote = [], 0, "", None
    for ch in text:
        if quote:
            current += ch
            if ch == quote and not current.endswith("\\" + quote):
                quote = None
        elif ch in "\"'":
            quote = ch
            current += ch
        elif ch in "({[":
            depth += 1
            current += ch
        elif ch in ")}]":
            depth -= 1
            current += ch
        elif ch == "," and depth == 0:
            args.append(current.strip())
            current = ""
        else:
            current += ch
    args.append(current.strip())
    return args


def _literal(arg):
    """A C string literal (adjacent pieces joined) as text; nullptr as None; other text as is."""
    if arg == "nullptr":
        return None
    pieces = re.findall(r'"((?:[^"\\]|\\.)*)"', arg)
    return "".join(pieces) if pieces else arg


def _number(arg):
    """1, uint64_t{1} << 20, size_t{256} << 20."""
    value = re.sub(r"\w+\{(\d+)\}", r"\1", arg).replace("UINT64_MAX", str(2**64 - 1))
    return eval(value, {"__builtins__": {}})  # noqa: S307 (integer literals and << only)


def rows():
    text = re.sub(r"//[^\n]*", "", DEF.read_text())
    found = []
    for match in re.finditer(r"^TORCHRR_OPTION\((.*?)\)\s*$", text, re.M | re.S):
        row = dict(zip(FIELDS, (_literal(a) for a in _arguments(match.group(1)))))
        row["flag_scale"] = _number(row["flag_scale"])
        found.append(row)
    return found


ROWS = rows()


def test_the_table_parses():
    # A row this parser misread would make every check below vacuous.
    assert len(ROWS) >= 14
    assert {r["keyword"] for r in ROWS} >= {"keep_last", "spill", "steps", "verify_saved"}
    for row in ROWS:
        assert row["environment"].startswith("TORCHRR_") and row["flag"].startswith("--"), row


def _flag_arguments(row, spill):
    """The `torchrr record` arguments that give `row` its example, and the variable's text."""
    if row["flag_value"] is not None:
        return [row["flag"]], row["flag_value"]
    if row["keyword"] == "spill":
        return [row["flag"], str(spill)], str(spill)
    if row["flag_scale"] != 1:
        example = int(row["example"])
        assert example % row["flag_scale"] == 0, row
        return [row["flag"], str(example // row["flag_scale"])], row["example"]
    return [row["flag"], row["example"]], row["example"]


def _variables_under_record(tmp_path, name, flags):
    out = tmp_path / f"{name}.trr"
    proc = record(out, ["env"], flags=["--native", *flags])
    assert proc.returncode == 0, proc.stderr
    return dict(line.split("=", 1) for line in proc.stdout.splitlines()
                if line.startswith("TORCHRR_"))


def test_each_flag_sets_its_rows_variable(tmp_path):
    spill = tmp_path / "spill"
    # --steps excludes --keep-last, which --spill needs: two runs hold every row.
    runs = {"steps": [r for r in ROWS if r["keyword"] == "steps"],
            "rest": [r for r in ROWS if r["keyword"] != "steps"]}
    for name, run_rows in runs.items():
        flags, expected = [], {}
        for row in run_rows:
            arguments, text = _flag_arguments(row, spill)
            flags += arguments
            expected[row["environment"]] = text
        variables = _variables_under_record(tmp_path, name, flags)
        for variable, text in expected.items():
            assert variables.get(variable) == text, (variable, variables)
    assert spill.is_dir()  # Created by `torchrr record`, as its help says.


def test_a_flag_not_given_sets_no_variable(tmp_path):
    # The recorder's defaults are the table's; the CLI passes on only what was asked.
    variables = _variables_under_record(tmp_path, "none", [])
    assert set(variables) <= {"TORCHRR_OUTPUT", "TORCHRR_TARGET_PID", "TORCHRR_RECORDER_PID"}


def _keyword_value(row, spill):
    """A Python value that gives `row` its example, and the recorder's text for it."""
    if row["type"] == "bool":
        return row["example"] == "1", row["example"]
    if row["flag_value"] is not None:
        return True, row["flag_value"]
    if row["keyword"] == "steps":
        first, last = row["example"].split(":")
        return (int(first), int(last)), row["example"]
    if row["keyword"] == "spill":
        return str(spill), str(spill)
    return int(row["example"]), row["example"]


@pytest.mark.parametrize("row", ROWS, ids=[r["keyword"] for r in ROWS])
def test_each_keyword_reaches_the_recorder(row, tmp_path):
    value, text = _keyword_value(row, tmp_path / "spill")
    given = {row["keyword"]: value}
    if row["keyword"] == "spill":
        given["keep_last"] = 2
    effect = torchrr.options_in_effect(tmp_path / "t.trr", **given)
    assert effect[row["keyword"]] == text
    others = {r["keyword"] for r in ROWS} - set(given)
    defaults = torchrr.options_in_effect(tmp_path / "t.trr")
    assert {k: effect[k] for k in others} == {k: defaults[k] for k in others}
    if row["type"] == "bool":  # A switch is its bool, whatever its flag sets.
        for value in (False, True):
            assert torchrr.options_in_effect(**{row["keyword"]: value})[row["keyword"]] == \
                str(int(value))
    elif row["flag_value"] is not None:  # False is the default.
        assert torchrr.options_in_effect(**{row["keyword"]: False})[row["keyword"]] == \
            defaults[row["keyword"]]


def test_python_defaults_are_a_python_processs():
    # C++ stacks are off in a process that runs Python, as under `torchrr record`.
    assert torchrr.options_in_effect()["native_stacks"] == "0"
    assert torchrr.options_in_effect(native_stacks=True)["native_stacks"] == "1"


@pytest.mark.parametrize("options, why", [
    ({"steps": (1, 2), "keep_last": 2}, "steps excludes keep_last"),
    ({"spill": "/nonexistent/spill"}, "spill needs keep_last"),
    ({"keep_last": -1}, "keep_last=-1: expected a number"),
    ({"steps": (5, 2)}, "B is before A"),
    ({"max_buffered_bytes": 0}, "expected a number from 1"),
    ({"verify_saved": "maybe"}, "verify_saved=maybe: expected 0 or 1"),
    ({"keep_last_steps": 3}, "unknown option keep_last_steps"),
])
def test_refused_options_raise_before_anything_starts(options, why, tmp_path):
    trace = tmp_path / "t.trr"
    with pytest.raises(ValueError, match=re.escape(why)):
        torchrr.start(trace, **options)
    assert not torchrr.recording() and not trace.exists()
    assert not os.path.exists("/nonexistent/spill")


def test_the_cli_refuses_what_the_relations_refuse(tmp_path):
    for flags, why in ((["--steps", "1:2", "--keep-last", "2"], "excludes"),
                       (["--spill", str(tmp_path / "s")], "--keep-last")):
        proc = subprocess.run([str(torchrr._native.cli_path()), "record", "-o",
                               str(tmp_path / "t.trr"), *flags, "--", "true"],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and why in proc.stderr, proc.stderr
        assert not (tmp_path / "s").exists()


def test_python_reads_a_switch_as_the_recorder_does(monkeypatch):
    """torchrr/_env_switch.py's values for on are ParseSwitch's (recording_options.cc), and
    nothing else is on: the sitecustomize and the recorder agree on TORCHRR_FOLLOW_FORKS."""
    from torchrr import _env_switch
    source = (REPO / "recorder" / "src" / "options" / "recording_options.cc").read_text()
    parse = re.search(r"ParseSwitch\(std::string_view text\) \{\n(.*?)\n\}", source, re.S)
    on_line = next(line for line in parse.group(1).splitlines() if "return true" in line)
    assert tuple(re.findall(r'text == "([^"]*)"', on_line)) == _env_switch.ON
    for value, on in [("1", True), ("yes", True), ("on", True), ("TRUE", False), (" 1", False),
                      ("0", False), ("", False)]:
        monkeypatch.setenv("TORCHRR_FOLLOW_FORKS", value)
        assert _env_switch.switch_on("TORCHRR_FOLLOW_FORKS") is on, value
