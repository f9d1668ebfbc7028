"""`torchrr fix`: planted bugs recorded with the CLI get the patch of their culprit line, and
`fix --check` proves it by re-running the program on patched copies (clean replay, exit 0)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import cli, needs_build, record

pytestmark = needs_build

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"

# name: (the program, the lines the patch removes, the lines it adds).
PLANTED = {
    "mul_after_sigmoid": (
        """
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
        y.mul_(2)  # scale
        y.sum().backward()
        """, ["y.mul_(2)  # scale"], ["y = y.mul(2)  # scale"]),
    "iadd": (
        """
        a = torch.randn(4, requires_grad=True)
        x = torch.exp(a)
        x += a * 2
        x.sum().backward()
        """, ["x += a * 2"], ["x = x + (a * 2)"]),
    "relu_module": (
        """
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
                self.act = nn.ReLU(inplace=True)  # the activation

            def forward(self, x):
                return self.act(torch.sigmoid(self.lin(x)))


        Net()(torch.randn(2, 4)).sum().backward()
        """, ["        self.act = nn.ReLU(inplace=True)  # the activation"],
        ["        self.act = nn.ReLU(inplace=False)  # the activation"]),
    "dropout_in_sequential": (
        """
        model = nn.Sequential(nn.Linear(4, 4), nn.Sigmoid(),
                              nn.Dropout(0.5, inplace=True))
        model(torch.randn(2, 4)).sum().backward()
        """, ["                      nn.Dropout(0.5, inplace=True))"],
        ["                      nn.Dropout(0.5, inplace=False))"]),
    "data_write": (
        """
        x = torch.randn(8, requires_grad=True)
        y = torch.sigmoid(x)
        y.data.mul_(2)
        y.sum().backward()
        """, ["y.data.mul_(2)"], ["y = y.mul(2)"]),
    "functional_inplace": (
        """
        x = torch.randn(4, requires_grad=True)
        h = torch.tanh(x)
        F.relu(h, inplace=True)
        h.sum().backward()
        """, ["F.relu(h, inplace=True)"], ["h = F.relu(h, inplace=False)"]),
    "indexed_write": (
        """
        x = torch.randn(4, requires_grad=True)
        y = torch.exp(x)
        y[0] = 0
        y.sum().backward()
        """, [], ["y = y.clone()"]),
    "helper_argument": (
        """
        def rescale(t):
            t.mul_(0.5)


        x = torch.randn(4, requires_grad=True)
        e = torch.exp(x)
        rescale(e)
        e.sum().backward()
        """, ["e = torch.exp(x)"], ["e = torch.exp(x).clone()"]),
    "optimizer_between": (
        """
        model = nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x = torch.randn(3, 4, requires_grad=True)
        model(x).sum().backward()
        loss = model(x).sum()
        opt.step()
        loss.backward()
        """, ["loss.backward()"], ["loss.backward()"]),
    "clamp_under_no_grad": (
        """
        w = torch.randn(4, requires_grad=True)
        loss = (w * w).sum()
        with torch.no_grad():
            w.clamp_(-1, 1)  # a parameter constraint
        loss.backward()
        """, ["loss.backward()"], ["loss.backward()"]),
    # An activation written under no_grad: made out of place there it would lose its history,
    # and moved after backward() the loss would not see it; it is cloned where it is made.
    "activation_under_no_grad": (
        """
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
        with torch.no_grad():
            y.clamp_(0.1, 0.9)  # keep it in range
        y.sum().backward()
        """, ["y = torch.sigmoid(x)"], ["y = torch.sigmoid(x).clone()"]),
    # The same, into a tensor a later call saved as its input: that call is passed a clone.
    "saved_input_under_no_grad": (
        """
        x = torch.randn(2, 4, requires_grad=True)
        w = torch.randn(4, 4, requires_grad=True)
        h = x * 2
        y = torch.mm(h, w)
        with torch.no_grad():
            h.clamp_(max=1)  # keep it in range
        y.sum().backward()
        """, ["y = torch.mm(h, w)"], ["y = torch.mm(h.clone(), w)"]),
    "two_culprits": (
        """
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
        z = torch.tanh(x)
        y.mul_(2)
        z.add_(1)
        (y + z).sum().backward()
        """, ["y.mul_(2)", "z.add_(1)"], ["y = y.mul(2)", "z = z.add(1)"]),
    # A cache of tables that each layer's call fills again, after the layer before saved a view
    # of it: the clone goes where the layer takes its view (the op records say which line).
    "shared_cache": (
        """
        class Rope:
            def __init__(self):
                self.cache = torch.zeros(2, 8, 4)

            def tables(self, n, scale):
                self.cache[:, :n] = torch.ones(2, n, 4) * scale
                return self.cache[:, :n]


        def layer(x, rope, scale):
            tables = rope.tables(x.shape[0], scale)
            cos = tables[0]
            return x * cos


        rope = Rope()
        x = torch.randn(8, 4, requires_grad=True)
        layer(layer(x, rope, 1.0), rope, 2.0).sum().backward()
        """, ["    tables = rope.tables(x.shape[0], scale)"],
        ["    tables = rope.tables(x.shape[0], scale).clone()"]),
    # Gradient accumulation's step and zero_grad(), taken before backward() in their if: they
    # move together, so that the micro-batches' gradients are summed, stepped on, then cleared.
    "step_in_an_if": (
        """
        w = torch.randn(4, requires_grad=True)
        opt = torch.optim.SGD([w], lr=0.1)
        for i in range(4):
            loss = (w * w).sum()
            if i % 2 == 1:
                opt.step()
                opt.zero_grad()
            loss.backward()
        """, ["    loss.backward()"], ["    loss.backward()"]),
}


def write_program(tmp_path, name, body):
    directory = tmp_path / name
    directory.mkdir()
    script = directory / f"{name}.py"
    script.write_text(HEADER + textwrap.dedent(body).lstrip("\n"))
    return script


def record_program(tmp_path, name, body):
    script = write_program(tmp_path, name, body)
    trace = tmp_path / f"{name}.trr"
    proc = record(trace, [sys.executable, script.name], cwd=script.parent)
    assert trace.exists(), proc.stderr
    return script, trace


def fix(*args, cwd=None, env=None, timeout=300):
    return subprocess.run([cli(), "fix", *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, **(env or {})})


def files_under(directory):
    """{relative path: bytes} of every file under `directory`."""
    return {str(p.relative_to(directory)): p.read_bytes()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def changed_lines(diff):
    removed = [line[1:] for line in diff.splitlines()
               if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in diff.splitlines()
             if line.startswith("+") and not line.startswith("+++")]
    return removed, added


@pytest.mark.parametrize("name", sorted(PLANTED))
def test_the_patch_rewrites_the_culprit_line_and_the_check_is_clean(tmp_path, name):
    body, removed, added = PLANTED[name]
    script, trace = record_program(tmp_path, name, body)
    before = script.read_text()

    proc = fix(trace, cwd=script.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"a/{script.name}" in proc.stdout, proc.stdout
    diff_removed, diff_added = changed_lines(proc.stdout)
    assert diff_removed == removed, proc.stdout
    assert all(line in diff_added for line in added), proc.stdout

    check = fix("--check", trace, cwd=script.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "with this patch: backward ran" in check.stdout and "0 violations" in check.stdout
    assert script.read_text() == before, "--check wrote the user's file"


# PyTorch raised nothing for a silent write, so a clean replay is not enough: the patched program's
# gradients are compared with those it computes with every saved tensor kept as saved (the
# out-of-place program's). The patch's are the same; the unpatched program's differ.
def test_a_silent_violations_patch_gives_the_out_of_place_gradients(tmp_path):
    script, trace = record_program(tmp_path, "data_write", PLANTED["data_write"][0])
    check = fix("--check", trace, cwd=script.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "and its gradients equal those with every saved tensor kept as saved" in check.stdout


def test_gradients_a_silent_write_changed_differ_from_the_out_of_place_ones(tmp_path):
    from torchrr import _fix_check
    script = write_program(tmp_path, "data_write", PLANTED["data_write"][0])
    run = _fix_check.Rerun(trace="", command=[sys.executable, str(script)],
                           cwd=str(script.parent), env=dict(os.environ))
    document = {"violations": [{"kind": "silent", "backward_pass": 0}]}
    same, line = _fix_check.compare_gradients(run, document, 120, str(tmp_path))
    assert same is False and "backward pass 0, leaf 0 (8)" in line, line


# A sum of n elements each off by a relative e is off by up to e times the L2 norm times sqrt(n):
# a gradient whose terms cancel (sum near 0) compares within that, and a sum further off does not.
def test_gradient_sums_compare_within_the_norm_times_the_root_of_the_element_count():
    from torchrr import _fix_check
    n = 10_000
    ones = [[n], 0.0, float(n)]  # +1 and -1 alternating: sum 0, sum of squares n.
    assert _fix_check._close(ones, [[n], 0.5, float(n)])
    assert not _fix_check._close(ones, [[n], 5.0, float(n)])
    assert not _fix_check._close(ones, [[n + 1], 0.0, float(n)])
    assert _fix_check._close([[], 2.0, 4.0], [[], 2.0, 4.0])
    assert _fix_check._close(None, None) and not _fix_check._close(None, ones)


# A backward pass that reaches fewer leaves in one run than in the other is not equal, even when
# one run reaches none (nothing to compare leaf by leaf).
def test_a_backward_pass_that_reaches_other_leaves_differs(monkeypatch, tmp_path):
    from torchrr import _fix_check
    leaves = {False: [[]], True: [[[[4], 1.0, 1.0]]]}
    monkeypatch.setattr(_fix_check, "_gradients",
                        lambda run, passes, snapshot, timeout, workdir: (leaves[snapshot], ""))
    run = _fix_check.Rerun(trace="", command=[sys.executable, "x.py"], cwd=str(tmp_path), env={})
    document = {"violations": [{"kind": "silent", "backward_pass": 0}]}
    same, line = _fix_check.compare_gradients(run, document, 1, str(tmp_path))
    assert same is False and "backward pass 0 reached 0 leaves, and 1 with" in line, line


def test_a_culprit_in_library_code_gets_a_clone_at_the_users_line(tmp_path):
    library = tmp_path / "lib" / "site-packages"
    library.mkdir(parents=True)
    (library / "scalelib.py").write_text("def mul_(t):\n    t.mul_(0.5)\n")
    script = write_program(tmp_path, "user", """
        import scalelib

        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x)
        scalelib.mul_(y)
        y.sum().backward()
        """)
    trace = tmp_path / "user.trr"
    record(trace, [sys.executable, script.name], cwd=script.parent,
           env={"PYTHONPATH": str(library)})
    # The re-run finds the library as the recorded run did.
    proc = fix("--check", trace, cwd=script.parent, env={"PYTHONPATH": str(library)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert changed_lines(proc.stdout) == (["y = torch.sigmoid(x)"],
                                          ["y = torch.sigmoid(x).clone()"]), proc.stdout
    assert "0 violations" in proc.stdout


def test_a_file_edited_since_the_recording_is_patched_where_the_line_went(tmp_path):
    body, _, _ = PLANTED["mul_after_sigmoid"]
    script, trace = record_program(tmp_path, "edited", body)
    script.write_text("# a line added since\n" + script.read_text())
    proc = fix(trace, cwd=script.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "changed since it was recorded" in proc.stdout
    assert f"{script}:7 as recorded is line 8 now" in proc.stdout, proc.stdout
    assert changed_lines(proc.stdout) == (["y.mul_(2)  # scale"], ["y = y.mul(2)  # scale"])


def test_json_gives_the_edits_as_data(tmp_path):
    script, trace = record_program(tmp_path, "two", PLANTED["two_culprits"][0])
    proc = fix("--json", trace)
    assert proc.returncode == 0, proc.stderr
    edits = json.loads(proc.stdout)["edits"]
    assert [(e["first_line"], e["old"], e["new"], e["certain"]) for e in edits] == [
        (8, "y.mul_(2)\n", "y = y.mul(2)\n", True), (9, "z.add_(1)\n", "z = z.add(1)\n", True)]
    assert all(e["file"] == str(script) for e in edits)
    assert sorted(i for e in edits for i in e["violations"]) == [0, 1]

    checked = fix("--json", "--check", trace, cwd=script.parent)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    check = json.loads(checked.stdout)["check"]
    assert check["exit_code"] == 0 and "0 violations" in check["lines"][0], check


def test_a_legal_program_gets_no_patch(tmp_path):
    script, trace = record_program(tmp_path, "legal", """
        x = torch.randn(4, requires_grad=True)
        y = torch.sigmoid(x).clone()
        y.mul_(2)
        y.sum().backward()
        """)
    proc = fix(trace)
    assert proc.returncode == 0, proc.stderr
    assert "nothing to fix" in proc.stdout and "---" not in proc.stdout


# Two losses backward through one graph, the first freeing it: keeping the graph or running the
# forward again is the program's intent, not a rewrite.
BACKWARD_TWICE = """
        x = torch.randn(4, requires_grad=True)
        h = torch.sigmoid(x)
        h.sum().backward()
        (h * 2).sum().backward()
        """


def test_a_rewrite_that_is_not_certain_lists_the_choices(tmp_path):
    script, trace = record_program(tmp_path, "twice", BACKWARD_TWICE)
    proc = fix(trace)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "not certain" in proc.stdout and "  - " in proc.stdout
    assert "---" not in proc.stdout, "an uncertain rewrite must not be proposed as a patch"


def test_a_reader_that_stops_early_ends_fix_without_a_traceback(tmp_path):
    _, trace = record_program(tmp_path, "piped", PLANTED["mul_after_sigmoid"][0])
    proc = subprocess.Popen([cli(), "fix", str(trace)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # As `| head -0` does, before fix has written anything.
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + 13 and b"Traceback" not in err, err.decode()


def test_apply_writes_the_checked_patch_with_a_backup(tmp_path):
    body, _, _ = PLANTED["mul_after_sigmoid"]
    script, trace = record_program(tmp_path, "apply", body)
    before = script.read_text()
    proc = fix("--apply", trace, cwd=script.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "y = y.mul(2)  # scale" in script.read_text()
    assert (script.parent / "apply.py.orig").read_text() == before


def test_check_refuses_when_the_script_is_gone(tmp_path):
    body, _, _ = PLANTED["mul_after_sigmoid"]
    script, trace = record_program(tmp_path, "gone", body)
    proc = fix(trace)  # The patch is made from the recorded lines alone.
    assert proc.returncode == 0 and "y = y.mul(2)" in proc.stdout, proc.stdout + proc.stderr
    script.unlink()
    proc = fix("--check", trace)
    assert proc.returncode == 11, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "cannot re-run" in proc.stderr, proc.stderr


CASES = sorted((Path(__file__).parent / "cases").glob("*.py"))


@pytest.mark.parametrize("case", CASES, ids=[c.stem for c in CASES])
def test_every_catalog_bug_is_fixed_and_every_legal_case_left_alone(tmp_path, case):
    flags = ["--verify-saved"] if "verify_saved=1" in case.read_text().splitlines()[0] else []
    trace = tmp_path / f"{case.stem}.trr"
    record(trace, [sys.executable, case.name], cwd=case.parent, flags=flags, timeout=300)
    assert trace.exists()
    proc = fix("--check", trace, cwd=tmp_path, timeout=600)
    if "nothing to fix" in proc.stdout:
        assert proc.returncode == 0 and "---" not in proc.stdout
        assert "violations=0" in case.read_text().splitlines()[0] or \
            case.stem.startswith("legal_"), f"{case.stem}: a planted bug got no fix"
    else:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "with this patch: backward ran" in proc.stdout and "0 violations" in proc.stdout


def _replay(trace, *flags):
    return subprocess.run([cli(), "replay", *flags, str(trace)], capture_output=True, text=True,
                          timeout=60)


def test_replay_ends_pointing_at_fix_when_a_culprit_line_is_python(tmp_path):
    body, _, _ = PLANTED["mul_after_sigmoid"]
    _, trace = record_program(tmp_path, "mul_after_sigmoid", body)
    hint = f"try: torchrr fix {trace} --check ("
    text = _replay(trace).stdout
    assert text.splitlines()[-1].startswith(hint), text
    short = _replay(trace, "--short").stdout
    assert hint in short and short.splitlines()[-1].startswith("the whole report:"), short
    assert "try: torchrr fix" not in _replay(trace, "--json").stdout


def test_replay_points_at_fix_only_where_it_has_a_rewrite_to_try(tmp_path):
    # A clean run has nothing to fix; a freed graph's first backward() may keep it.
    _, twice = record_program(tmp_path, "twice", BACKWARD_TWICE)
    _, legal = record_program(tmp_path, "legal", """
        x = torch.randn(4, requires_grad=True)
        torch.sigmoid(x).clone().mul_(2).sum().backward()
        """)
    text = _replay(legal).stdout
    assert "no saved tensor was modified" in text and "try: torchrr fix" not in text, text
    text = _replay(twice).stdout
    assert "1 violation" in text and "try: torchrr fix" in text, text


def test_check_reruns_a_command_recorded_as_python_dash_m(tmp_path):
    body, removed, added = PLANTED["mul_after_sigmoid"]
    package = tmp_path / "work" / "trainer"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    main = package / "__main__.py"
    main.write_text(HEADER + textwrap.dedent(body).lstrip("\n"))
    trace = tmp_path / "module.trr"
    record(trace, [sys.executable, "-m", "trainer"], cwd=package.parent)
    before = main.read_text()
    check = fix("--check", trace, cwd=tmp_path)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "with this patch: backward ran" in check.stdout and "0 violations" in check.stdout
    assert main.read_text() == before, "--check wrote the user's file"
    # A module that is not in the working directory the trace shows (an installed one) is not
    # copied, so it is not re-run.
    shutil.move(package, tmp_path / "elsewhere")
    gone = fix("--check", trace, cwd=tmp_path)
    assert gone.returncode == 11 and "trainer" in gone.stderr, gone.stdout + gone.stderr


# A training loop that never ends: only --steps (or --timeout) ends its re-run.
FOREVER = """
    w = torch.ones(4, requires_grad=True)
    opt = torch.optim.SGD([w], lr=0.1)
    while True:
        y = torch.sigmoid(w * 2)
        y.mul_(2)  # scale
        y.sum().backward()
        opt.step()
        opt.zero_grad()
    """


def test_steps_stops_the_rerun_after_its_first_steps(tmp_path):
    script, trace = record_program(tmp_path, "forever", FOREVER)
    before = files_under(tmp_path)
    check = fix("--check", "--steps", 3, "--timeout", 120, trace, cwd=script.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    assert ("with this patch, in the first 3 steps: backward ran (3 passes), 0 violations"
            in check.stdout.splitlines()), check.stdout
    assert files_under(tmp_path) == before, "--check wrote beside the user's files"
    zero = fix("--check", "--steps", 0, trace, cwd=script.parent)
    assert zero.returncode == 2 and "--steps" in zero.stderr, zero.stdout + zero.stderr


def test_steps_beyond_the_programs_end_is_a_whole_run(tmp_path):
    body, _, _ = PLANTED["mul_after_sigmoid"]
    script, trace = record_program(tmp_path, "short", body)
    check = fix("--check", "--steps", 5, trace, cwd=script.parent)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "with this patch: backward ran (1 pass), 0 violations" in check.stdout.splitlines(), \
        check.stdout


def test_a_rerun_past_the_timeout_is_stopped(tmp_path):
    script, trace = record_program(tmp_path, "forever", FOREVER)
    # More steps than it reaches in 3 s: by default the re-run would stop after the violation's.
    check = fix("--check", "--timeout", 3, "--steps", 1000000, trace, cwd=script.parent,
                timeout=120)
    assert check.returncode == 1, check.stdout + check.stderr
    assert "with this patch: the program ran past --timeout 3s" in check.stdout.splitlines(), \
        check.stdout
    copies = [cmdline for cmdline in _command_lines() if "torchrr-fix-" in cmdline and
              "forever.py" in cmdline]
    assert not copies, f"the re-run is still running: {copies}"


def _command_lines():
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
        except OSError:
            pass
    return lines
