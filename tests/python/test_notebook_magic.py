"""%load_ext torchrr and the %%torchrr cell magic, in a notebook executed as
`jupyter nbconvert --execute` does (nbclient, on the .venv's ipykernel): the verdict must be in
the magic cell's own output, before the error the cell raised."""
import subprocess
import sys

import pytest

from conftest import needs_build

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (requirements.txt)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (requirements.txt)")

BUG = """%%torchrr bug.trr
import torch
x = torch.randn(6, requires_grad=True)
y = x.sigmoid()
y.mul_(2)
y.sum().backward()"""
# The culprit's line in the cell, counting the %%torchrr line as 1.
CULPRIT_LINE = 5

CLEAN = """%%torchrr --quiet
z = torch.randn(3, requires_grad=True)
(z * 2).sum().backward()
z.grad.sum().item()"""


def test_importing_torchrr_imports_no_ipython():
    code = "import sys, torchrr; print([m for m in ('torch', 'IPython') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@needs_build
def test_the_verdict_is_below_the_cell(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell("%load_ext torchrr"),
                      nbformat.v4.new_code_cell(BUG), nbformat.v4.new_code_cell(CLEAN)]
    client = nbclient.NotebookClient(notebook, timeout=120, startup_timeout=60,
                                     kernel_name="python3", allow_errors=True,
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    nbformat.write(notebook, tmp_path / "executed.ipynb")  # For a failure's post-mortem.

    outputs = notebook.cells[1].outputs
    kinds = [o.output_type for o in outputs]
    assert "display_data" in kinds and kinds[-1] == "error", kinds
    assert kinds.index("display_data") < kinds.index("error")
    error = outputs[-1]
    assert error.ename == "RuntimeError" and "modified by an inplace operation" in error.evalue
    verdict = next(o for o in outputs if o.output_type == "display_data")
    text, html = verdict.data["text/plain"], verdict.data["text/html"]
    assert f":{CULPRIT_LINE} in <module>" in text and "aten::mul_" in text, text
    assert "y.mul_(2)" in text and "1 violation" in text, text
    assert html.startswith('<div class="torchrr-report">'), html[:200]
    assert f":{CULPRIT_LINE} in &lt;module&gt;" in html and "aten::mul_" in html
    assert (tmp_path / "bug.trr").exists()

    # A clean cell under --quiet shows nothing of torchrr, only its result; its trace is named
    # after the cell's execution count.
    outputs = notebook.cells[2].outputs
    assert [o.output_type for o in outputs] == ["execute_result"], outputs
    assert outputs[0].data["text/plain"] == "6.0"
    count = notebook.cells[2].execution_count
    assert (tmp_path / f"torchrr-cell-{count}.trr").exists()


def test_the_magic_line_gives_record_keywords():
    pytest.importorskip("IPython")
    from IPython.core.error import UsageError

    from torchrr._ipython import _parse

    assert _parse("", "torchrr-cell-3.trr") == ("torchrr-cell-3.trr", {}, False)
    assert _parse("out.trr --verify-saved --keep-last 2 --quiet", "d") == \
        ("out.trr", {"verify_saved": True, "keep_last": 2}, True)
    assert _parse("--steps 1: --all-ops", "d") == ("d", {"steps": (1, None), "all_ops": True},
                                                   False)
    assert _parse("--steps :4", "d")[1] == {"steps": (None, 4)}
    for bad in ("--steps 4", "--steps a:b", "--keep-last x", "--no-such-option", "a.trr b.trr"):
        with pytest.raises(UsageError, match="%%torchrr"):
            _parse(bad, "d")
