"""`torchrr report`: one self-contained HTML page (nothing fetched) with each violation as the
replay prints it, the autograd graph around it drawn by Graphviz, and the step's timeline with the
save, the write and the use marked; checked as text, and as a browser renders it (headless
Chromium) when one is installed."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import cli, needs_build
from demo_like import record_demo_like

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
# The SVG and XLink namespaces are names, not addresses anything is fetched from.
NAMESPACES = ("http://www.w3.org/2000/svg", "http://www.w3.org/1999/xlink")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_dot = pytest.mark.skipif(shutil.which("dot") is None,
                               reason="Graphviz's dot is not installed (apt install graphviz)")
needs_chromium = pytest.mark.skipif(CHROMIUM is None,
                                    reason="no chromium to render the page (apt install chromium)")


def report(trace, out, env=None):
    return subprocess.run([cli(), "report", str(trace), "-o", str(out)], capture_output=True,
                          text=True, timeout=120, env=env)


def assert_self_contained(html):
    stripped = html
    for namespace in NAMESPACES:
        stripped = stripped.replace(namespace, "")
    assert not re.search(r"https?://|<script[^>]*\bsrc=|<link\b|@import|url\(", stripped), \
        "the page refers to something outside itself"


def chromium(*args, tmp_path):
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    directory = tmp_path_factory.mktemp("report")
    trace, script, bug_line, victim_line = record_demo_like(directory)
    out = directory / "report.html"
    proc = report(trace, out)
    assert proc.returncode == 0, proc.stderr
    return out, trace, script, bug_line, victim_line


@needs_build
@needs_dot
def test_demo_like_page(demo_report):
    out, trace, script, bug_line, victim_line = demo_report
    html = out.read_text()
    assert_self_contained(html)
    replay = subprocess.run([cli(), "replay", "--color", "never", str(trace)],
                            capture_output=True, text=True).stdout
    # Each violation reads as the replay prints it (HTML-escaped), from its "error:" line on.
    first = replay[replay.index("error:"):].split("\n\n")[0]
    first = first.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    assert first in html.replace("&#39;", "'").replace("&quot;", '"'), first
    assert f"{script}:{bug_line}" in html
    graph = html.split('<div class="graph">', 1)[1]
    assert graph.lstrip().startswith("<svg"), "no graph drawn"
    assert "culprit: aten::mul_.Tensor" in graph and "victim: aten::sigmoid" in graph
    assert f"{script.name}:{bug_line}" in graph and "SigmoidBackward0" in graph
    timeline = html.split('<svg xmlns="http://www.w3.org/2000/svg" class="timeline"', 1)[1]
    for mark in ("save", "write", "use"):
        assert f'class="mark {mark}"' in timeline, f"no {mark} mark on the timeline"
    assert "#34d399" in timeline, "the optimizer step is not on the timeline"


@needs_build
def test_without_dot_the_page_says_so(demo_report, tmp_path):
    _, trace, script, bug_line, _ = demo_report
    out = tmp_path / "report.html"
    env = dict(os.environ, PATH=str(tmp_path / "empty-bin"))
    proc = report(trace, out, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "dot not found" in proc.stderr, proc.stderr
    html = out.read_text()
    assert "Graph not drawn: dot not found (install graphviz)" in html
    assert f"{script}:{bug_line}" in html


@needs_build
@needs_dot
@needs_chromium
def test_chromium_renders_it(demo_report, tmp_path):
    out, _, script, bug_line, _ = demo_report
    proc = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", out.as_uri(),
                    tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"{script}:{bug_line}" in proc.stdout
    assert "<svg" in proc.stdout
    errors = [line for line in proc.stderr.splitlines()
              if "Uncaught" in line or re.search(r"CONSOLE.*error|console error", line, re.I)]
    assert errors == [], errors


@needs_dot
def test_goldens(tmp_path):
    for name in ("v1_1.trr", "v1_2.trr"):
        out = tmp_path / (name + ".html")
        proc = report(GOLDEN / name, out)
        assert proc.returncode == 0, proc.stderr
        html = out.read_text()
        assert_self_contained(html)
        replay = subprocess.run([cli(), "replay", "--color", "never", str(GOLDEN / name)],
                                capture_output=True, text=True).stdout
        assert replay.strip().splitlines()[-1] in html, "no summary line"


@pytest.mark.parametrize("hostile", sorted((GOLDEN / "errors").glob("*.trr")),
                         ids=lambda p: p.name)
def test_hostile_traces(hostile, tmp_path):
    out = tmp_path / "r.html"
    proc = report(hostile, out)
    assert proc.returncode in (0, 3, 4, 5, 6), proc.stderr
    if proc.returncode in (3, 6):
        return
    html = out.read_bytes().decode("utf-8")  # Raises on bytes that are not UTF-8.
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]", html), "a raw control character"
    assert_self_contained(html)
    assert html.rstrip().endswith("</html>")


def test_bad_input(tmp_path):
    errors = GOLDEN / "errors"
    out = tmp_path / "r.html"
    proc = report(errors / "not_a_trace.trr", out)
    assert proc.returncode == 3 and not out.exists(), proc.stderr
    for name, code in (("truncated.trr", 4), ("corrupt.trr", 5)):
        assert report(errors / name, out).returncode == code, name
        assert "</html>" in out.read_text()
    copy = tmp_path / "copy.trr"
    copy.write_bytes((GOLDEN / "v1_2.trr").read_bytes())
    proc = report(copy, copy)
    assert proc.returncode == 2 and "overwrite" in proc.stderr, proc.stderr
    assert copy.read_bytes() == (GOLDEN / "v1_2.trr").read_bytes(), "the trace was overwritten"
