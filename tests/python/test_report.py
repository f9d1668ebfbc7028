"""`torchrr report`: one self-contained HTML page (nothing fetched) with each violation as the
replay prints it, the autograd graph around it drawn by Graphviz, and the step's timeline with the
save, the write and the use marked; checked as text, and as a browser renders it (headless
Chromium) when one is installed, for a small script's trace and for `make demo`'s own report
(tools/demo.sh run against this build into a temporary folder)."""
import html as html_text
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest

from conftest import cli, marker_line, needs_build
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
    # As root in a container: no sandbox (it needs user namespaces), no GPU, and no /dev/shm,
    # which containers often make too small for Chromium's shared memory.
    return subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox",
                           "--disable-dev-shm-usage",
                           f"--user-data-dir={tmp_path / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def rendered_dom(page, tmp_path):
    """The DOM Chromium builds from `page`, after asserting it loaded with nothing on the
    console. The report holds no script, so any console line (a script's message, an uncaught
    exception, a load the page was refused) is a fault."""
    proc = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", Path(page).as_uri(),
                    tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    console = [line for line in proc.stderr.splitlines()
               if re.search(r":CONSOLE[:(]", line) or "Uncaught" in line]
    assert console == [], console
    return proc.stdout


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
    dom = rendered_dom(out, tmp_path)
    assert f"{script}:{bug_line}" in dom
    assert "<svg" in dom


@needs_chromium
def test_chromium_console_is_seen(tmp_path):
    page = tmp_path / "noisy.html"
    page.write_text('<html><body><script>console.error("broken")</script></body></html>')
    with pytest.raises(AssertionError, match="broken"):
        rendered_dom(page, tmp_path)


@pytest.fixture(scope="module")
def made_demo(tmp_path_factory):
    """The output folder of tools/demo.sh run as `make demo` runs it (the PEFT sample with
    inplace_activation), with this build's CLI and this Python."""
    directory = tmp_path_factory.mktemp("demo")
    env = dict(os.environ, TORCHRR=str(cli()), PY=sys.executable, DEMO_DIR=str(directory),
               DEMO="peft", BUG="inplace_activation")
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("TORCHRR_OUTPUT", "TORCHRR_RECORDER_PID", "RANK"):
        env.pop(name, None)
    proc = subprocess.run([str(REPO / "tools" / "demo.sh")], capture_output=True, text=True,
                          timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"The report: {directory / 'report.html'}" in proc.stdout, proc.stdout[-3000:]
    # The record step names the lines itself, before any replay command.
    recorded = proc.stdout.split("== The whole replay")[0]
    script = REPO / "samples" / "python" / "peft_lora.py"
    assert re.search(r"^torchrr: \d+ violations? in ", recorded, re.M), recorded[-3000:]
    bug_line = marker_line(script, r"BUG\(inplace_activation\)")
    assert f"  culprit: {script}:{bug_line} " in recorded, recorded[-3000:]
    # After the replay, the fix's patch and its check; the sample itself is not written.
    fixed = proc.stdout.split("== The fix")[1].split("== The bug report")[0]
    assert "act = act.mul(gate)  # BUG(inplace_activation)" in fixed, fixed
    assert "with this patch: backward ran" in fixed and "0 violations" in fixed, fixed
    assert not list(script.parent.glob("*.orig")), "the demo applied the patch"
    return directory


@needs_build
@needs_dot
@needs_chromium
def test_chromium_renders_the_demo_report(made_demo, tmp_path):
    script = REPO / "samples" / "python" / "peft_lora.py"
    bug_line = marker_line(script, r"BUG\(inplace_activation\)")
    code = script.read_text().splitlines()[bug_line - 1].strip()
    dom = rendered_dom(made_demo / "report.html", tmp_path)
    assert f"{script.name}:{bug_line}" in dom, "the culprit's line is not on the page"
    assert html_text.escape(code, quote=False) in dom, f"the culprit's code {code!r} is not there"
    assert re.search(r'<div class="graph">\s*<svg\b', dom), "no graph drawn"


@needs_build
def test_demo_trace_replays_with_code_elsewhere(made_demo, tmp_path):
    """The demo's trace moved to a fresh folder, its paths naming a checkout that exists nowhere
    (as on the machine of whoever receives it): the replay quotes the code from the trace."""
    script = REPO / "samples" / "python" / "peft_lora.py"
    bug_line = marker_line(script, r"BUG\(inplace_activation\)")
    code = script.read_text().splitlines()[bug_line - 1].strip()
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    shutil.copy(made_demo / "peft_lora.trr", fresh / "received.trr")
    moved = fresh / "moved.trr"
    proc = subprocess.run([cli(), "redact", fresh / "received.trr", "-o", moved, "--map",
                           f"{REPO}=/nonexistent/checkout"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    replay = subprocess.run([cli(), "replay", moved], capture_output=True, text=True,
                            timeout=120, cwd=fresh)
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert f"/nonexistent/checkout/samples/python/peft_lora.py:{bug_line}" in replay.stdout, \
        replay.stdout
    assert code in replay.stdout, f"the culprit's code {code!r} is not quoted"


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


@needs_build
@needs_dot
def test_one_graph_per_site(tmp_path):
    # A loop that repeats its bug each step: one graph for the site, the other violations point
    # to it (each drawing is a run of dot).
    script = tmp_path / "loop.py"
    script.write_text(
        "import torch\n"
        "for step in range(5):\n"
        "    x = torch.randn(4, requires_grad=True)\n"
        "    y = torch.sigmoid(x)\n"
        "    y.mul_(2)  # BUG\n"
        "    try:\n"
        "        y.sum().backward()\n"
        "    except RuntimeError:\n"
        "        pass\n")
    trace = tmp_path / "run.trr"
    proc = subprocess.run([cli(), "record", "--quiet", "-o", str(trace), "--", sys.executable,
                           str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "r.html"
    proc = report(trace, out)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert html.count('<div class="graph">') == 1, html.count('<div class="graph">')
    assert html.count("the same site as violation 1: its graph is drawn there") == 4
    assert html.count('<pre class="repro">') == 1, "one reproducer for the site"
    assert html.count("the same site as violation 1: its reproducer is there") == 4


@needs_build
def test_the_page_carries_the_reproducer_and_the_fix(tmp_path):
    script = tmp_path / "bug.py"
    script.write_text("import torch\n"
                      "x = torch.randn(4, requires_grad=True)\n"
                      "y = torch.sigmoid(x)\n"
                      "y.mul_(2)  # scale\n"
                      "y.sum().backward()\n")
    trace = tmp_path / "bug.trr"
    subprocess.run([cli(), "record", "--quiet", "-o", str(trace), "--", sys.executable,
                    str(script)], capture_output=True, text=True, timeout=120)
    fixed = subprocess.run([cli(), "fix", "--json", str(trace)], capture_output=True, text=True,
                           timeout=120, cwd=tmp_path)
    assert fixed.returncode == 0, fixed.stderr
    fix_json = tmp_path / "fix.json"
    fix_json.write_text(fixed.stdout)
    out = tmp_path / "r.html"
    proc = subprocess.run([cli(), "report", str(trace), "-o", str(out), "--fix", str(fix_json)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    html = out.read_text()
    assert_self_contained(html)
    assert "<script" not in html
    # The fix as a diff: the culprit line removed, its out-of-place form added.
    assert '<span class="del">-y.mul_(2)  # scale</span>' in html, html
    assert '<span class="add">+y = y.mul(2)  # scale</span>' in html
    # The reproducer: shown, and as a data: link whose text is the script `repro` writes.
    link = re.search(r'href="data:text/x-python;charset=utf-8,([^"]*)"', html)
    assert link, "no link to save the reproducer"
    saved = urllib.parse.unquote(link.group(1))
    made = subprocess.run([cli(), "repro", str(trace), "-o", "-"], capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0 and saved == made.stdout
    assert html_text.escape(saved.splitlines()[0], quote=False) in html
    # A document that is not fix's is refused.
    fix_json.write_text("[1, 2]")
    bad = subprocess.run([cli(), "report", str(trace), "-o", str(out), "--fix", str(fix_json)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--fix" in bad.stderr
