"""`torchrr redact` and `torchrr info`'s privacy section: a redacted trace replays to the same
verdicts (file basenames, lines, functions; only directories differ), and none of the redacted
names is left in it, searched in its raw bytes, in every chunk decompressed, and as a word in
every string it holds."""
import getpass
import json
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import cli, needs_build
from demo_like import record_demo_like

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden"
CHUNK_HEADER = struct.Struct("<4sHHII8s")  # format/SPEC.md, "Chunk".
# A name this short occurs by chance in compressed or binary bytes, so it is searched for only
# as a word in the trace's strings.
SHORTEST_BYTE_SEARCH = 4


def run(*args, **kwargs):
    return subprocess.run([cli(), *map(str, args)], capture_output=True, text=True, timeout=120,
                          **kwargs)


def decompressed_chunks(path):
    """Every chunk's payload of `path`, decompressed (zstd's command line), concatenated."""
    data = Path(path).read_bytes()
    assert data[:8] == b"TORCHRR\0"
    pos, frames = 16, []
    while pos + CHUNK_HEADER.size <= len(data) and data[pos:pos + 4] == b"TRRC":
        _, _, _, compressed, _, _ = CHUNK_HEADER.unpack_from(data, pos)
        pos += CHUNK_HEADER.size
        frames.append(data[pos:pos + compressed])
        pos += compressed
    assert frames, f"{path}: no chunk"
    # zstd decompresses concatenated frames into their concatenated contents.
    return subprocess.run(["zstd", "-dcq"], input=b"".join(frames), capture_output=True,
                          check=True).stdout


def trace_strings(path):
    """Every string of every record and of the file info (`torchrr dump --json`)."""
    out = run("dump", "--json", path)
    assert out.returncode == 0, out.stderr
    strings = []

    def walk(value):
        if isinstance(value, str):
            strings.append(value)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
    for line in out.stdout.splitlines():
        walk(json.loads(line))
    return strings


def assert_gone(path, anywhere=(), words=()):
    """No name of `anywhere` occurs in `path`, and no name of `words` as a word (redact replaces
    host and user names only as words): searched in its raw bytes, in every chunk decompressed,
    and in every string it holds."""
    raw = Path(path).read_bytes()
    plain = decompressed_chunks(path)
    strings = trace_strings(path)
    for name, as_word in [(n, False) for n in anywhere] + [(n, True) for n in words]:
        text = re.escape(name)
        if as_word:
            text = r"(?<![A-Za-z0-9_])" + text + r"(?![A-Za-z0-9_])"
        if len(name.encode()) >= SHORTEST_BYTE_SEARCH:
            pattern = re.compile(text.encode())
            assert not pattern.search(raw), f"{name!r} in the raw bytes"
            assert not pattern.search(plain), f"{name!r} in a decompressed chunk"
        left = [s for s in strings if re.search(text, s)]
        assert not left, f"{name!r} left in {left[:3]}"


def verdicts(path):
    """`torchrr replay --json`, with every path cut to its basename and the trace's own path
    dropped: what must not change when directories are redacted."""
    proc = run("replay", "--json", path)
    assert proc.returncode in (0, 1, 4, 5, 8, 10), proc.stderr
    document = json.loads(proc.stdout)
    document.pop("trace", None)

    def strip(value):
        if isinstance(value, str):
            return re.sub(r"[^\s'\"]*/", "", value)
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items()}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    return proc.returncode, strip(document)


needs_zstd = pytest.mark.skipif(shutil.which("zstd") is None,
                                reason="zstd's command line is not installed (apt install zstd)")


@needs_zstd
def test_golden_with_home_paths(tmp_path):
    original = GOLDEN / "errors" / "source_paths.trr"
    info = json.loads(run("info", "--json", original).stdout)["privacy"]
    assert info["host"] == "golden-host"
    assert info["home_directories"] == ["/home/ana"] and info["user_names"] == ["ana"]
    assert info["absolute_paths"] >= 1
    out = tmp_path / "redacted.trr"
    proc = run("redact", original, "-o", out, "--map", "project=proj")
    assert proc.returncode == 0, proc.stderr
    assert verdicts(out) == verdicts(original)
    assert_gone(out, anywhere=["/home/ana", "project"], words=["ana", "golden-host"])
    assert "~/proj/train.py" in trace_strings(out)
    assert run("replay", out).returncode == run("replay", original).returncode
    redacted_info = json.loads(run("info", "--json", out).stdout)["privacy"]
    assert redacted_info["host"] == "<host>" and redacted_info["home_directories"] == []


@needs_zstd
@pytest.mark.parametrize("name", ["v1_0.trr", "v1_1.trr", "v1_2.trr"])
def test_goldens_replay_the_same(name, tmp_path):
    out = tmp_path / "redacted.trr"
    proc = run("redact", GOLDEN / name, "-o", out, "--drop-values")
    assert proc.returncode == 0, proc.stderr
    assert verdicts(out) == verdicts(GOLDEN / name)
    assert_gone(out, words=["golden-host"])
    dump = run("dump", "--json", out).stdout
    assert '"values":[{' not in dump.replace(" ", ""), "an argument value was kept"


def test_bad_input(tmp_path):
    errors = GOLDEN / "errors"
    out = tmp_path / "out.trr"
    proc = run("redact", errors / "not_a_trace.trr", "-o", out)
    assert proc.returncode == 3 and not out.exists(), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    for name, code in (("truncated.trr", 4), ("corrupt.trr", 5)):
        proc = run("redact", errors / name, "-o", out)
        assert proc.returncode == code, (name, proc.stderr)
        assert "only the" in proc.stderr, proc.stderr
        assert run("info", out).returncode == 0, f"{name}: the redacted copy is not whole"
    proc = run("redact", GOLDEN / "v1_2.trr", "-o", out, "--map", "no-equals-sign")
    assert proc.returncode == 2 and "OLD=NEW" in proc.stderr, proc.stderr
    copy = tmp_path / "copy.trr"
    shutil.copy(GOLDEN / "v1_2.trr", copy)
    proc = run("redact", copy, "-o", copy)
    assert proc.returncode == 2, proc.stderr
    assert copy.read_bytes() == (GOLDEN / "v1_2.trr").read_bytes()


@pytest.mark.parametrize("hostile", sorted((GOLDEN / "errors").glob("*.trr")),
                         ids=lambda p: p.name)
def test_hostile_traces(hostile, tmp_path):
    out = tmp_path / "out.trr"
    proc = run("redact", hostile, "-o", out)
    read_code = run("info", hostile).returncode
    assert proc.returncode == read_code, proc.stderr
    if read_code in (3, 6):
        assert not out.exists()
    else:
        assert run("info", out).returncode == 0, "the redacted copy is not a whole trace"
        assert verdicts(out)[1]["violations"] == verdicts(hostile)[1]["violations"]


@needs_build
@needs_zstd
def test_demo_like_trace(tmp_path):
    # The script lives under a home directory of its own and a directory named to be mapped, so
    # that its recorded paths hold both.
    home = tmp_path / "home-of-torchrr-test"
    project = home / "secret-project-x7"
    trace, script, bug_line, _ = record_demo_like(project, cwd=project, env={"HOME": str(home)})
    privacy = json.loads(run("info", "--json", trace).stdout)["privacy"]
    assert privacy["absolute_paths"] > 0 and privacy["argument_values"] > 0, privacy
    text = run("info", trace).stdout
    assert "privacy:" in text and "host name:" in text, text
    out = tmp_path / "redacted.trr"
    proc = run("redact", trace, "-o", out, "--map", "secret-project-x7=project", "--drop-values",
               env={"HOME": str(home), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    before_code, before = verdicts(trace)
    after_code, after = verdicts(out)
    assert (after_code, after) == (before_code, before)
    culprit = after["violations"][0]["culprit"]["user_frame"]
    assert (culprit["file"], culprit["line"]) == (script.name, bug_line)
    raw_culprit = json.loads(run("replay", "--json", out).stdout)["violations"][0]["culprit"]
    assert raw_culprit["user_frame"]["file"] == f"~/project/{script.name}", raw_culprit
    assert_gone(out, anywhere=[str(home), "secret-project-x7"],
                words=[privacy["host"], getpass.getuser()])
