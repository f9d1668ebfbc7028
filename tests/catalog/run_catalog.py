#!/usr/bin/env python3
"""Records every case of catalog_case with `torchrr record`, replays it, and checks the report.

    run_catalog.py --torchrr build/bin/torchrr --catalog build/bin/catalog_case \
        [--source tests/catalog/catalog.cc] [--expected tests/catalog/expected.tsv] \
        [--keep DIR] [CASE ...]

Per category (from `catalog_case --list`):
  bug     the program exits 1 with PyTorch's in-place error; replay exits 1; the first violation
          is of kind "version", raised by PyTorch, with the node and versions of expected.tsv,
          its culprit's user frame on the `// CULPRIT(name)` line of catalog.cc and its victim's
          on the `// VICTIM(name)` line; `// LATER(name)` lines are the later culprits, in order;
          `// CALLER(name)` lines must appear in the culprit's stack. PyTorch's own message must
          agree with expected.tsv on the versions and the node it names.
  legal   the program exits 0; replay exits 0 with no violation.
  silent  the program exits 0 (PyTorch sees nothing); replay exits 1 and the first violation is
          of kind "silent", with the node, versions and lines as for a bug.
Every trace must read whole (status "ok") with no data-loss record, and in SPEC.md's order: each
string, frame, stack and tensor a record names defined before it, each node execution naming its
node (but for a node that another node's backward runs, as CopySlices runs the one it wraps).

Prints one line per case, `PASS name` or `FAIL name: reason; reason`, then `N passed, M failed`.
Exit status: 0 when every case passed, 1 otherwise, 2 on bad usage or missing files.
Python 3 standard library only.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = re.compile(r"//\s*(CULPRIT|VICTIM|LATER|CALLER)\(([A-Za-z0-9_]+)\)")
PYTORCH_ERROR = "modified by an inplace operation"
# "[CPUFloatType [4, 8]], which is output 0 of AddBackward0, is at version 1; expected version 0"
PYTORCH_MESSAGE = re.compile(
    r"modified by an inplace operation: \[[^\]]*\[[^\]]*\]\]"
    r"(?:, which is output \d+ of (?P<node>[^,]+),)? is at version (?P<current>\d+); "
    r"expected version (?P<saved>\d+) instead")
RUN_TIMEOUT_S = 300


def scan_markers(source):
    """Returns {case: {kind: [line, ...]}} for the markers of catalog.cc, lines from 1."""
    markers = {}
    with open(source, encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            for kind, name in MARKER.findall(text):
                markers.setdefault(name, {}).setdefault(kind, []).append(number)
    return markers


def read_expected(path):
    """Returns {case: (node, saved, current, pytorch_names_node or None)}."""
    expected = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#") or line.startswith("name\t"):
                continue
            fields = line.split("\t")
            if len(fields) != 5:
                raise ValueError(f"{path}: bad line (want 5 tab-separated fields): {line!r}")
            name, node, saved, current, names = fields
            expected[name] = (node, int(saved), int(current), None if names == "-" else names)
    return expected


def frame_line(op):
    """Returns (file, line) of an Op's user frame, or None."""
    if not op or not op.get("user_frame"):
        return None
    frame = op["user_frame"]
    return frame.get("file") or "", frame.get("line")


def check_op_line(errors, what, op, want_line, source_name):
    where = frame_line(op)
    if where is None:
        errors.append(f"{what}: no user frame (op {op.get('op') if op else None})")
        return
    file, line = where
    if not file.endswith(source_name) or line != want_line:
        errors.append(f"{what} at {os.path.basename(file)}:{line} ({op.get('op')}), "
                      f"expected {source_name}:{want_line}")


def forward_op_name(node):
    """How torch 2.13 and later name `node` in their messages: without a Backward<digits>
    suffix, keeping digits other than "0" (AddBackward1 is Add1; replayer.h's PytorchNodeName)."""
    match = re.fullmatch(r"(.*)Backward(\d*)", node or "")
    return match[1] + ("" if match[2] == "0" else match[2]) if match else node


def check_violation(errors, case, category, v, marks, expected, source_name, pytorch_node):
    want_kind = "version" if category == "bug" else "silent"
    if v.get("kind") != want_kind:
        errors.append(f"first violation is of kind {v.get('kind')!r}, expected {want_kind!r}")
    node, saved, current, names = expected
    got_node = (v.get("backward_node") or {}).get("name")
    if got_node != node:
        errors.append(f"backward_node {got_node!r}, expected {node!r}")
    if (v.get("saved_version"), v.get("current_version")) != (saved, current):
        errors.append(f"versions {v.get('saved_version')}->{v.get('current_version')}, "
                      f"expected {saved}->{current}")
    if category == "bug":
        if v.get("pytorch_raised") is not True:
            errors.append("pytorch_raised is not true")
        # As the recording torch worded it: expected.tsv's node, or its forward op's name.
        worded = pytorch_node if pytorch_node in (names, forward_op_name(names)) else names
        want_names = None if names is None else f"output 0 of {worded}"
        if v.get("pytorch_names") != want_names:
            errors.append(f"pytorch_names {v.get('pytorch_names')!r}, expected {want_names!r}")
    elif v.get("pytorch_raised") is not False:
        errors.append("pytorch_raised is not false for a silent write")

    culprit = v.get("culprit")
    check_op_line(errors, "culprit", culprit, marks["CULPRIT"][0], source_name)
    check_op_line(errors, "victim", v.get("victim"), marks["VICTIM"][0], source_name)
    later = v.get("later_culprits") or []
    want_later = marks.get("LATER", [])
    if len(later) != len(want_later):
        errors.append(f"{len(later)} later culprit(s), expected {len(want_later)}")
    else:
        for i, (op, line) in enumerate(zip(later, want_later)):
            check_op_line(errors, f"later_culprits[{i}]", op, line, source_name)
    if culprit and marks.get("CALLER"):
        stack_lines = {f.get("line") for f in culprit.get("stack") or []
                       if (f.get("file") or "").endswith(source_name)}
        missing = [line for line in marks["CALLER"] if line not in stack_lines]
        if missing:
            errors.append(f"culprit stack lacks the caller line(s) {missing}")


def check_pytorch_message(errors, stderr, expected):
    """Checks that expected.tsv agrees with what PyTorch itself printed."""
    match = PYTORCH_MESSAGE.search(stderr)
    if not match:
        errors.append("PyTorch's message not recognised on stderr")
        return
    node, saved, current, names = expected
    if (int(match["saved"]), int(match["current"])) != (saved, current):
        errors.append(f"expected.tsv says {saved}->{current}, PyTorch says "
                      f"{match['saved']}->{match['current']}")
    if match["node"] not in (names, forward_op_name(names)):
        errors.append(f"expected.tsv says PyTorch names {names!r}, PyTorch names "
                      f"{match['node']!r}")


def check_trace_order(errors, torchrr, trace):
    """SPEC.md's order, on the records as written: every string, frame, stack and tensor a record
    names is defined before it, and every node execution names its node (but for one that another
    node's backward runs, as CopySlices runs the node it wraps)."""
    try:
        dump = subprocess.run([torchrr, "dump", "--json", trace], capture_output=True, text=True,
                              timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        errors.append(f"dump timed out after {RUN_TIMEOUT_S} s")
        return
    if dump.returncode != 0:
        last = (dump.stderr.strip().splitlines() or ["<no stderr>"])[-1]
        errors.append(f"dump exit {dump.returncode}: {last[:200]}")
        return
    defined = {"string": {0}, "frame": set(), "stack": {0}, "tensor": {0}, "node": set()}
    problems = []
    ops = {}
    unnamed = []  # Ops of executions that name no node.

    def problem(text):
        if len(problems) < 3:  # The first few say enough.
            problems.append(text)

    def need(kind, ident, what):
        if ident not in defined[kind]:
            problem(f"{what} names {kind} {ident} before its definition")

    for line in dump.stdout.splitlines():
        r = json.loads(line)
        kind = r.get("kind")
        if kind == "string":
            defined["string"].add(r["id"])
        elif kind == "frame":
            for field in ("function", "file", "library"):
                need("string", r.get(field, 0), f"frame {r['id']}")
            defined["frame"].add(r["id"])
        elif kind == "stack":
            for frame in r.get("frames", []):
                need("frame", frame, f"stack {r['id']}")
            defined["stack"].add(r["id"])
        elif kind == "tensor":
            defined["tensor"].add(r["tensor"])
        elif kind == "node":
            need("string", r.get("name", 0), f"node {r['node']}")
            for saved in r.get("saved", []):
                need("string", saved.get("name", 0), f"node {r['node']}")
            defined["node"].add(r["node"])
        elif kind == "op":
            ops[r["op"]] = r
            what = f"op {r['op']}"
            need("string", r.get("name", 0), what)
            need("string", r.get("overload", 0), what)
            need("stack", r.get("stack", 0), what)
            for use in r.get("inputs", []) + r.get("outputs", []):
                need("tensor", use.get("tensor", 0), what)
        elif kind == "node_exec":
            if not r.get("node"):
                unnamed.append(r.get("op"))
            else:
                need("node", r["node"], f"the execution in op {r.get('op')}")
        elif kind == "error":
            need("string", r.get("type", 0), "an error record")
    # Only a node run by another node's backward (CopySlices runs the node it wraps) has none, or
    # a node called directly in grad mode, outside autograd's engine (torch.compile wraps a
    # compiled region's outputs in a DelayedError node that it calls).
    for op in unnamed:
        record = ops.get(op) or {}
        parent = ops.get(record.get("parent"))
        in_backward = parent and parent.get("scope") == "backward_function"
        if not in_backward and not record.get("grad_mode"):
            problem(f"the execution in op {op} names no node")
    errors.extend(problems)


def run_case(args, case, category, markers, expected, trace_dir, source_name):
    """Returns the list of reasons the case failed (empty when it passed)."""
    errors = []
    marks = markers.get(case, {})
    if category in ("bug", "silent"):
        if case not in expected:
            return [f"no line in {os.path.basename(args.expected)}"]
        for kind in ("CULPRIT", "VICTIM"):
            if len(marks.get(kind, [])) != 1:
                return [f"{len(marks.get(kind, []))} // {kind}({case}) markers, expected 1"]
    elif marks:
        return [f"a legal case carries markers {sorted(marks)}"]

    trace = os.path.join(trace_dir, case + ".trr")
    try:
        record = subprocess.run([args.torchrr, "record", "-o", trace, "--", args.catalog, case],
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [f"record timed out after {RUN_TIMEOUT_S} s"]
    want_rc = 1 if category == "bug" else 0
    if record.returncode != want_rc:
        last = (record.stderr.strip().splitlines() or ["<no stderr>"])[-1]
        errors.append(f"record exit {record.returncode}, expected {want_rc}: {last[:200]}")
    has_error = PYTORCH_ERROR in record.stderr
    if category == "bug":
        if not has_error:
            errors.append("PyTorch's in-place error not on stderr")
        else:
            check_pytorch_message(errors, record.stderr, expected[case])
    elif has_error:
        errors.append("PyTorch raised the in-place error in a case that must not raise")
    if not os.path.exists(trace):
        errors.append("no trace written")
        return errors

    try:
        replay = subprocess.run([args.torchrr, "replay", "--json", trace],
                                capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return errors + [f"replay timed out after {RUN_TIMEOUT_S} s"]
    want_rc = 0 if category == "legal" else 1
    if replay.returncode != want_rc:
        errors.append(f"replay exit {replay.returncode}, expected {want_rc}")
    try:
        report = json.loads(replay.stdout)
    except json.JSONDecodeError as e:
        last = (replay.stderr.strip().splitlines() or ["<no stderr>"])[-1]
        return errors + [f"replay printed no JSON ({e}): {last[:200]}"]

    status = (report.get("trace") or {}).get("status")
    if status != "ok":
        errors.append(f"trace status {status!r}: {(report.get('trace') or {}).get('message')}")
    if report.get("data_loss_records"):
        errors.append(f"{report['data_loss_records']} data-loss record(s)")
    check_trace_order(errors, args.torchrr, trace)
    violations = report.get("violations") or []
    if category == "legal":
        if violations:
            v = violations[0]
            errors.append(f"{len(violations)} violation(s), first: {v.get('kind')} in "
                          f"{(v.get('backward_node') or {}).get('name')}, culprit at "
                          f"{frame_line(v.get('culprit'))}")
        return errors
    if not violations:
        return errors + ["no violation reported"]
    match = PYTORCH_MESSAGE.search(record.stderr)
    check_violation(errors, case, category, violations[0], marks, expected[case], source_name,
                    match["node"] if match else None)
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--torchrr", required=True, help="the torchrr CLI")
    parser.add_argument("--catalog", required=True, help="the catalog_case program")
    parser.add_argument("--source", default=os.path.join(HERE, "catalog.cc"))
    parser.add_argument("--expected", default=os.path.join(HERE, "expected.tsv"))
    parser.add_argument("--keep", metavar="DIR", help="write the traces here and keep them")
    parser.add_argument("cases", nargs="*", help="cases to run (default: all)")
    args = parser.parse_args()
    for path in (args.torchrr, args.catalog, args.source, args.expected):
        if not os.path.exists(path):
            print(f"run_catalog: {path}: no such file", file=sys.stderr)
            return 2

    listing = subprocess.run([args.catalog, "--list"], capture_output=True, text=True)
    if listing.returncode != 0:
        print(f"run_catalog: {args.catalog} --list exited {listing.returncode}", file=sys.stderr)
        return 2
    cases = [line.split() for line in listing.stdout.splitlines() if line.strip()]
    known = {name for name, _ in cases}
    unknown = [name for name in args.cases if name not in known]
    if unknown:
        print(f"run_catalog: unknown case(s) {unknown}", file=sys.stderr)
        return 2
    if args.cases:
        cases = [(name, category) for name, category in cases if name in args.cases]

    markers = scan_markers(args.source)
    expected = read_expected(args.expected)
    source_name = os.path.basename(args.source)
    stale = sorted((set(markers) | set(expected)) - known)
    passed = failed = 0
    if stale and not args.cases:
        print(f"FAIL catalog: markers or expectations for no case: {stale}")
        failed += 1

    with tempfile.TemporaryDirectory(prefix="torchrr-catalog-") as scratch:
        trace_dir = args.keep or scratch
        os.makedirs(trace_dir, exist_ok=True)
        for name, category in cases:
            if category not in ("bug", "legal", "silent"):
                errors = [f"unknown category {category!r}"]
            else:
                errors = run_case(args, name, category, markers, expected, trace_dir,
                                  source_name)
            if errors:
                failed += 1
                print(f"FAIL {name} ({category}): " + "; ".join(errors), flush=True)
            else:
                passed += 1
                print(f"PASS {name} ({category})", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
