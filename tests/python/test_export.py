"""`torchrr export --chrome-trace`: the output is checked against the Trace Event format's
documented rules (the JSON object form that Perfetto's UI and chrome://tracing open), strictly,
on a recorded demo-like trace and on the golden traces, and carries the ops, the backward nodes
and the violation with its culprit's line."""
import json
import math
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import cli, needs_build
from demo_like import record_demo_like

REPO = Path(__file__).resolve().parents[2]
GOLDENS = sorted((REPO / "tests" / "golden").glob("*.trr"))

# Phases this checker knows; an exporter that writes another one fails.
PHASES = {"X", "B", "E", "i", "I", "M", "s", "t", "f", "C"}
METADATA_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index",
                  "process_labels"}
EPSILON = 1e-6  # Microseconds: timestamps are written as decimal fractions.


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value):
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def check_trace_events(text):
    """Every problem of `text` as a Trace Event file, one string each; [] when none."""
    problems = []
    try:
        document = json.loads(text, parse_constant=_reject_constant)
    except ValueError as error:
        return [f"not strict JSON: {error}"]
    if not isinstance(document, dict) or not isinstance(document.get("traceEvents"), list):
        return ["not the object form: no traceEvents array"]
    if document.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        problems.append(f"displayTimeUnit {document['displayTimeUnit']!r}")
    slices = defaultdict(list)   # (pid, tid) -> [(start, end)]
    open_slices = defaultdict(list)
    flow_starts, flow_ends = {}, {}
    for n, event in enumerate(document["traceEvents"]):
        where = f"event {n}"
        if not isinstance(event, dict):
            problems.append(f"{where}: not an object")
            continue
        phase = event.get("ph")
        where = f"event {n} ({phase} {event.get('name')!r})"
        if phase not in PHASES:
            problems.append(f"{where}: unknown phase")
            continue
        if not _is_int(event.get("pid")) or not _is_int(event.get("tid")):
            problems.append(f"{where}: pid and tid must be integers")
        if not isinstance(event.get("name"), str):
            problems.append(f"{where}: no name string")
        if "args" in event and not isinstance(event["args"], dict):
            problems.append(f"{where}: args is not an object")
        if "cat" in event and not isinstance(event["cat"], str):
            problems.append(f"{where}: cat is not a string")
        if phase == "M":
            if event.get("name") not in METADATA_NAMES:
                problems.append(f"{where}: unknown metadata")
            elif event["name"].endswith("_name") and not isinstance(
                    event.get("args", {}).get("name"), str):
                problems.append(f"{where}: no args.name")
            continue
        ts = event.get("ts")
        if not _is_number(ts) or ts < 0:
            problems.append(f"{where}: ts {ts!r} is not a non-negative number")
            continue
        track = (event.get("pid"), event.get("tid"))
        if phase == "X":
            dur = event.get("dur")
            if not _is_number(dur) or dur < 0:
                problems.append(f"{where}: dur {dur!r} is not a non-negative number")
            else:
                slices[track].append((ts, ts + dur, n))
        elif phase == "B":
            open_slices[track].append(ts)
        elif phase == "E":
            if not open_slices[track]:
                problems.append(f"{where}: E without B")
            elif open_slices[track].pop() > ts:
                problems.append(f"{where}: E before its B")
        elif phase in ("i", "I"):
            if event.get("s", "t") not in ("g", "p", "t"):
                problems.append(f"{where}: scope {event.get('s')!r}")
        elif phase in ("s", "t", "f"):
            if not (_is_int(event.get("id")) or isinstance(event.get("id"), str)):
                problems.append(f"{where}: flow without an id")
                continue
            if phase == "f" and event.get("bp", "e") != "e":
                problems.append(f"{where}: bp {event.get('bp')!r}")
            key = (event.get("cat"), event.get("name"), event["id"])
            table = flow_starts if phase == "s" else flow_ends if phase == "f" else None
            if table is not None:
                if key in table:
                    problems.append(f"{where}: flow {key} {phase} twice")
                table[key] = (ts, track)
        elif phase == "C" and not all(_is_number(v) for v in event.get("args", {}).values()):
            problems.append(f"{where}: counter values must be numbers")
    for track, stack in open_slices.items():
        if stack:
            problems.append(f"track {track}: {len(stack)} B without E")
    # Complete slices of a track nest or follow each other: no partial overlap.
    for track, spans in slices.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for start, end, n in spans:
            while stack and stack[-1][1] <= start + EPSILON:
                stack.pop()
            if stack and end > stack[-1][1] + EPSILON:
                problems.append(f"event {n}: slice on {track} overlaps event {stack[-1][2]} "
                                f"without nesting")
            stack.append((start, end, n))
    # Flows: every start has its end and every end its start; each binds to a slice of its track.
    for key in flow_starts.keys() ^ flow_ends.keys():
        problems.append(f"flow {key}: {'no end' if key in flow_starts else 'no start'}")
    for key in flow_starts.keys() & flow_ends.keys():
        (s_ts, s_track), (f_ts, f_track) = flow_starts[key], flow_ends[key]
        for ts, track, what in ((s_ts, s_track, "start"), (f_ts, f_track, "end")):
            if not any(a - EPSILON <= ts <= b + EPSILON for a, b, _ in slices[track]):
                problems.append(f"flow {key}: {what} at {ts} is in no slice of {track}")
    return problems


def export(trace, out):
    return subprocess.run([cli(), "export", "--chrome-trace", str(trace), "-o", str(out)],
                          capture_output=True, text=True, timeout=120)


def exported_events(trace, directory):
    """The events of `trace` exported, after checking the export succeeded and is valid."""
    out = Path(directory) / "run.json"
    proc = export(trace, out)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert check_trace_events(text) == []
    return json.loads(text)["traceEvents"]


def test_checker_catches_what_it_checks():
    good = {"traceEvents": [
        {"ph": "X", "name": "a", "ts": 0, "dur": 10, "pid": 1, "tid": 1},
        {"ph": "X", "name": "b", "ts": 2, "dur": 3, "pid": 1, "tid": 1},
        {"ph": "s", "name": "l", "cat": "c", "id": 1, "ts": 3, "pid": 1, "tid": 1},
        {"ph": "X", "name": "k", "ts": 20, "dur": 1, "pid": 1, "tid": 9},
        {"ph": "f", "bp": "e", "name": "l", "cat": "c", "id": 1, "ts": 20, "pid": 1, "tid": 9},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "t"}}]}
    assert check_trace_events(json.dumps(good)) == []
    broken = [
        ({"ph": "X", "name": "a", "ts": -1, "dur": 1, "pid": 1, "tid": 1}, "ts -1"),
        ({"ph": "X", "name": "a", "ts": 1, "pid": 1, "tid": 1}, "dur None"),
        ({"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": "1", "tid": 1}, "integers"),
        ({"ph": "X", "name": "a", "ts": 5, "dur": 10, "pid": 1, "tid": 1}, "overlaps"),
        ({"ph": "s", "name": "x", "cat": "c", "id": 7, "ts": 1, "pid": 1, "tid": 1}, "no end"),
        ({"ph": "Q", "name": "a", "ts": 1, "pid": 1, "tid": 1}, "unknown phase"),
        ({"ph": "E", "name": "a", "ts": 1, "pid": 1, "tid": 3}, "E without B"),
    ]
    for event, expected in broken:
        problems = check_trace_events(json.dumps(
            {"traceEvents": good["traceEvents"] + [event]}))
        assert any(expected in p for p in problems), (event, problems)
    assert check_trace_events('{"traceEvents": [{"ph": "X", "ts": NaN}]}')


@pytest.mark.parametrize("golden", GOLDENS, ids=lambda p: p.name)
def test_goldens_export_to_valid_trace_events(golden, tmp_path):
    events = exported_events(golden, tmp_path)
    replay = json.loads(subprocess.run([cli(), "replay", "--json", str(golden)],
                                       capture_output=True, text=True).stdout)
    violations = [e for e in events if e["ph"] == "i" and e["cat"] == "violation"]
    assert len(violations) == len(replay["violations"])
    assert {"backward", "autograd"} <= {e.get("cat") for e in events if e["ph"] == "X"}
    kernels = [e for e in events if e["ph"] == "X" and e["cat"] in ("kernel", "memcpy")]
    flows = [e for e in events if e["ph"] == "f"]
    assert len(flows) == len(kernels) > 0, "each launched kernel and copy has its flow"
    assert all(e["tid"] != flows[0]["tid"] or e in kernels for e in events if e["ph"] == "X"), \
        "a stream's track holds only its kernels and copies"


def test_damaged_traces_export_what_verifies(tmp_path):
    errors = REPO / "tests" / "golden" / "errors"
    for name, code in (("truncated.trr", 4), ("corrupt.trr", 5), ("not_a_trace.trr", 3)):
        out = tmp_path / (name + ".json")
        proc = export(errors / name, out)
        assert proc.returncode == code, (name, proc.returncode, proc.stderr)
        if code != 3:
            assert check_trace_events(out.read_text()) == [], name
    # The Chrome trace is export's one format: naming it is not required.
    proc = subprocess.run([cli(), "export", str(errors / "truncated.trr"), "-o",
                           str(tmp_path / "x.json")], capture_output=True, text=True)
    assert proc.returncode == 4, proc.stderr
    assert check_trace_events((tmp_path / "x.json").read_text()) == []
    copy = tmp_path / "copy.trr"
    copy.write_bytes(GOLDENS[-1].read_bytes())
    proc = export(copy, copy)
    assert proc.returncode == 2 and "overwrite" in proc.stderr, proc.stderr
    assert copy.read_bytes() == GOLDENS[-1].read_bytes(), "the trace was overwritten"


@pytest.mark.parametrize("hostile", sorted((REPO / "tests" / "golden" / "errors").glob("*.trr")),
                         ids=lambda p: p.name)
def test_hostile_traces_give_valid_json(hostile, tmp_path):
    out = tmp_path / "run.json"
    proc = export(hostile, out)
    assert proc.returncode in (0, 3, 4, 5, 6), proc.stderr
    if proc.returncode not in (3, 6):
        # read_text() raises on bytes that are not UTF-8.
        assert check_trace_events(out.read_text(encoding="utf-8")) == []


@needs_build
def test_demo_like_trace(tmp_path):
    trace, script, bug_line, victim_line = record_demo_like(tmp_path)
    events = exported_events(trace, tmp_path)
    culprit_slices = [e for e in events if e["ph"] == "X" and e["name"] == "aten::mul_.Tensor"
                      and e["args"].get("location", "").startswith(f"{script}:{bug_line} ")]
    assert culprit_slices, "no slice for the culprit at its line"
    write = culprit_slices[0]["args"]["inputs"][0]
    assert write["version"] == "0->1" and write["type"] == "float32[4, 16]", write
    randn = [e["args"].get("values") for e in events if e["ph"] == "X"
             and e["name"] == "aten::randn"]
    assert {"position": 0, "value": "[4, 16]"} in randn[0], randn
    nodes = {e["name"] for e in events if e["ph"] == "X" and e["cat"] == "autograd"}
    assert "SigmoidBackward0" in nodes or "MulBackward0" in nodes, nodes
    violations = [e for e in events if e["ph"] == "i"]
    assert violations, "no violation instant"
    args = violations[0]["args"]
    assert args["culprit"] == "aten::mul_.Tensor"
    assert args["culprit_location"].startswith(f"{script}:{bug_line} in mlp_forward"), args
    assert args["victim_location"].startswith(f"{script}:{victim_line} "), args
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert any(n.startswith("thread ") for n in names), names
