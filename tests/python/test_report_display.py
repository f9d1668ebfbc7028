"""How a Report shows itself: str() (the text report), IPython's pretty printer, a notebook's
HTML (the report page inline), and the one-line str() of violations and ops."""
import os
import re
import subprocess

import pytest

import torchrr
from conftest import PYTORCH_INPLACE, cli, needs_build
from test_api import THIS, line_of, sigmoid_bug


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    path = tmp_path_factory.mktemp("display") / "bug.trr"
    with pytest.raises(RuntimeError, match=PYTORCH_INPLACE):
        with torchrr.record(path):
            sigmoid_bug()
    return path


@needs_build
def test_str_is_the_text_report(trace):
    report = torchrr.replay(trace)
    expected = subprocess.run([cli(), "replay", "--color", "never", str(trace)],
                              capture_output=True, text=True)
    assert expected.returncode == 1, expected.stderr
    assert str(report) == expected.stdout
    assert f"{THIS}:{line_of('CULPRIT')}" in str(report)
    pretty = pytest.importorskip("IPython.lib.pretty")
    assert pretty.pretty(report) == str(report)


@needs_build
def test_violation_and_op_in_one_line(trace):
    v = torchrr.replay(trace).violations[0]
    assert str(v.culprit) == f"aten::add_.Tensor at {THIS}:{line_of('CULPRIT')} in sigmoid_bug"
    assert str(v) == (f"version: aten::add_.Tensor at {THIS}:{line_of('CULPRIT')} in sigmoid_bug "
                      f"modified what SigmoidBackward0 saved (aten::sigmoid at "
                      f"{THIS}:{line_of('VICTIM')} in sigmoid_bug)")


@needs_build
def test_user_frames_say_they_are_python(trace):
    # The JSON's user_frame has only file, line and function; the rest is its stack frame's.
    v = torchrr.replay(trace).violations[0]
    for op in (v.culprit, v.victim):
        assert op.user_frame.python and not op.user_frame.framework, op.user_frame
        assert op.user_frame.file == THIS


@needs_build
def test_html_is_the_report_page_inline(trace):
    before = sorted(os.listdir(trace.parent))
    page = subprocess.run([cli(), "report", str(trace), "-o", "-"], capture_output=True,
                          text=True, cwd=trace.parent)
    assert page.returncode == 0, page.stderr
    assert page.stdout.startswith("<!DOCTYPE html>")
    inline = torchrr.replay(trace)._repr_html_()
    assert sorted(os.listdir(trace.parent)) == before, "a page was written beside the trace"
    # The page's body, as `report` wrote it, in a div whose class scopes the page's style.
    body = re.search(r"<body>\n(.*)</body>", page.stdout, re.S).group(1)
    assert inline.startswith('<div class="torchrr-report">\n<style>')
    assert body.strip() in inline
    assert f"{THIS}:{line_of('CULPRIT')}" in inline and "<svg" in inline
    style = re.search(r"<style>(.*?)</style>", inline, re.S).group(1)
    selectors = [rule.split("{")[0].strip() for rule in style.split("}") if "{" in rule]
    assert selectors and all(s.startswith(".torchrr-report") for s in selectors), selectors
    # Nothing to run and nothing to fetch: no script, no link, no URL but SVG's namespaces.
    assert not re.search(r"<script|<link|<iframe|<img|\bon\w+=", inline, re.I)
    urls = set(re.findall(r"https?://[^\"' )]+", inline))
    assert urls <= {"http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink"}, urls


@needs_build
def test_without_the_trace_the_summary(trace, tmp_path):
    copy = tmp_path / "gone.trr"
    copy.write_bytes(trace.read_bytes())
    report = torchrr.replay(copy)
    copy.unlink()
    text = str(report)
    assert text == report.summary()
    assert text.splitlines() == [str(report.violations[0]),
                                 "1 violation (8 ops, 3 node executions in 1 backward pass)"]
    assert report._repr_html_().startswith('<pre class="torchrr-report">version: aten::add_')


@needs_build
def test_report_to_stdout_writes_no_file(trace, tmp_path):
    proc = subprocess.run([cli(), "report", str(trace), "-o", "-"], capture_output=True,
                          text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("</html>")
    assert os.listdir(tmp_path) == []
