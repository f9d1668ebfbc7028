"""replay(): the native ``torchrr replay --json`` report as Python objects.

The classes mirror replayer/SCHEMA.md (schema_version 1) field for field; every object also keeps
the JSON it came from in ``.raw``, so fields added later are reachable before this file knows them.
``None`` means "not known / not applicable", as ``null`` in the JSON.
"""
from __future__ import annotations

import html
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from . import _native


class ReplayError(Exception):
    """The trace could not be replayed. ``exit_code`` is the CLI's (3 unreadable or not a trace,
    4 truncated, 5 corrupt, 6 newer format, 7 other; see replayer/SCHEMA.md), ``message`` its
    one-line explanation."""

    def __init__(self, path: str, exit_code: int, message: str):
        super().__init__(f"{path}: {message} (torchrr replay exit {exit_code})")
        self.path = path
        self.exit_code = exit_code
        self.message = message


@dataclass
class Frame:
    function: Optional[str]
    file: Optional[str]
    line: Optional[int]
    library: Optional[str] = None
    python: bool = False
    framework: bool = False
    raw: dict = field(default_factory=dict, repr=False)
    # For a line of code torch generated (torch.compile's FX graphs), the generated line itself
    # (file, line, function only); the fields above are then the user's line it came from.
    generated: Optional["Frame"] = None

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["Frame"]:
        if d is None:
            return None
        return cls(d.get("function"), d.get("file"), d.get("line"), d.get("library"),
                   bool(d.get("python", False)), bool(d.get("framework", False)), d,
                   cls.from_json(d.get("generated")))

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


@dataclass
class FunctionContext:
    """The Python ``torch.autograd.Function`` whose own code ran an op: ``name`` its class,
    ``backward`` whether in its backward (else its forward), ``called_from`` the program's first
    line outside the Function that ran it (the ``.apply(...)`` call; in backward, the
    ``backward()`` call), None when the stack shows none."""
    name: str
    backward: bool = False
    called_from: Optional[Frame] = None

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["FunctionContext"]:
        if d is None:
            return None
        return cls(d.get("name", ""), bool(d.get("backward", False)),
                   Frame.from_json(d.get("called_from")))


@dataclass
class Op:
    """An OpRecord: ``op`` is the ATen op name (``aten::mul_``), ``user_frame`` the innermost
    frame outside framework code, ``stack`` all frames innermost first. With ``hook`` set it is
    no op but a saved_tensors_hooks unpack hook (``op`` None, ``id`` 0): ``user_frame`` is where
    the hook was defined. ``module``: the nn.Module it ran under, ``"model.layers.1.mlp.act_fn
    (SiLU)"`` (None when none ran, or the trace does not say). ``function``: for an op a Python
    autograd.Function's own forward or backward ran, that Function (None otherwise)."""
    id: int
    op: Optional[str]
    overload: str = ""
    detail: Optional[str] = None
    thread: int = 0
    user_frame: Optional[Frame] = None
    stack: list = field(default_factory=list)
    raw: dict = field(default_factory=dict, repr=False)
    hook: bool = False
    module: Optional[str] = None
    function: Optional[FunctionContext] = None

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["Op"]:
        if d is None:
            return None
        stack = [Frame.from_json(f) for f in d.get("stack", [])]
        return cls(d.get("id", 0), d.get("op"), d.get("overload", ""), d.get("detail"),
                   d.get("thread", 0), _user_frame(d.get("user_frame"), stack), stack, d,
                   d.get("hook", False), d.get("module"),
                   FunctionContext.from_json(d.get("function")))

    @property
    def name(self) -> str:
        """``aten::mul_.Tensor``: the op with its overload; ``unpack hook`` for a hook."""
        if self.hook:
            return "unpack hook"
        return f"{self.op}.{self.overload}" if self.overload else str(self.op)

    def __str__(self) -> str:
        """``aten::mul_.Tensor at train.py:66 in step``; the op alone without a user frame."""
        return f"{self.name} at {self.user_frame}" if self.user_frame else self.name


def _user_frame(d: Optional[dict], stack: list) -> Optional[Frame]:
    """The op's user frame. The JSON gives it only file, line and function; its kind (python,
    framework, library, generated) is that of the same frame in the stack, which it is taken from
    (replayer/SCHEMA.md: the first frame that is not framework code)."""
    frame = Frame.from_json(d)
    if frame is None or "python" in frame.raw:
        return frame
    same = next((f for f in stack if f is not None and not f.framework and
                 (f.file, f.line, f.function) == (frame.file, frame.line, frame.function)), None)
    if same is not None:
        frame.library, frame.python, frame.framework = same.library, same.python, same.framework
        frame.generated = frame.generated or same.generated
    return frame


@dataclass
class BackwardNode:
    id: int
    name: Optional[str]
    sequence_nr: Optional[int] = None
    forward_thread: Optional[int] = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["BackwardNode"]:
        if d is None:
            return None
        return cls(d.get("id", 0), d.get("name"), d.get("sequence_nr"), d.get("forward_thread"), d)


@dataclass
class Tensor:
    id: int
    name: Optional[str]
    list_index: Optional[int] = None
    shape: list = field(default_factory=list)
    dtype: Optional[str] = None
    device: Optional[str] = None
    storage: int = 0
    version_counter: int = 0
    is_output: bool = False
    is_leaf: bool = False
    output_nr: int = 0
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["Tensor"]:
        if d is None:
            return None
        return cls(d.get("id", 0), d.get("name"), d.get("list_index"), list(d.get("shape", [])),
                   d.get("dtype"), d.get("device"), d.get("storage", 0),
                   d.get("version_counter", 0), bool(d.get("is_output", False)),
                   bool(d.get("is_leaf", False)), d.get("output_nr", 0), d)


@dataclass
class Candidate:
    """For a silent write found by fingerprint: an op that wrote into the saved bytes
    (``role == "wrote"``) or made a tensor over them (``"aliased"``) between the save and the use."""
    op: Optional[Op]
    role: str

    @classmethod
    def from_json(cls, d: dict) -> "Candidate":
        return cls(Op.from_json(d), d.get("role", ""))


@dataclass
class Violation:
    """A saved tensor that broke backward. kind: ``"version"`` (its version counter moved:
    PyTorch raises), ``"silent"`` (it changed where PyTorch does not see it: PyTorch raises
    nothing), ``"detached"`` (``detach_()`` after the save), ``"freed"`` (an earlier backward pass
    freed it: no ``retain_graph``), ``"unpack_hook"`` (backward failed on what a
    saved_tensors_hooks unpack hook returned) or ``"cached_mutated"`` (an output selective
    activation checkpointing cached was modified before the recomputation); replayer/SCHEMA.md has every field. culprit: the op
    that wrote it (for ``unpack_hook``, the hook: ``culprit.hook``, where it was defined); victim:
    the forward op that saved it; backward_node: the node that needed it.
    For ``silent``, evidence says how it was found: ``"aliased_write"`` (a recorded write through
    ``.data`` or another alias: the culprit), ``"fingerprint"`` (``--verify-saved``: its bytes'
    fingerprints differ and nothing wrote through the saved tensor; candidates and kernels list
    what touched them in between, and the first candidate that wrote them through another tensor
    over the same memory, if any, is the culprit), ``"counter_reset"`` (its counter was set back
    after the write) or ``"unchecked_save"`` (its counter moved where PyTorch does not check: a
    saved-tensor hook kept the tensor itself, or activation checkpointing recomputed it: then
    ``recomputed``). fingerprint: ``{"at_save": "0x..", "at_use": "0x.."}`` when they changed.
    recomputing: for a checkpoint's input, the node whose saved tensors backward was recomputing
    from it. The fields of the newer kinds (``freed_by_pass``, ``counter_reset``) are in ``raw``."""
    kind: str
    culprit: Optional[Op]
    later_culprits: list
    victim: Optional[Op]
    backward_node: Optional[BackwardNode]
    saved_version: Optional[int]
    current_version: Optional[int]
    tensor: Optional[Tensor]
    pytorch_raised: bool
    pytorch_message: Optional[str]
    pytorch_names: Optional[str] = None
    simulated: bool = False
    backward_pass: Optional[int] = None
    node_exec_op: Optional[int] = None
    evidence: Optional[str] = None
    fingerprint: Optional[dict] = None
    candidates: list = field(default_factory=list)
    kernels: list = field(default_factory=list)
    recomputing: Optional[BackwardNode] = None
    recomputed: bool = False
    raw: dict = field(default_factory=dict, repr=False)
    # The training step of its backward pass (replayer/SCHEMA.md: `step`), None when unknown.
    step: Optional[int] = None
    # Reentrant checkpointing: not saved, read by the block in forward and by its recomputation
    # after the write (replayer/SCHEMA.md: `read_by_recompute`).
    read_by_recompute: bool = False

    @classmethod
    def from_json(cls, d: dict) -> "Violation":
        return cls(d.get("kind"), Op.from_json(d.get("culprit")),
                   [Op.from_json(o) for o in d.get("later_culprits", [])],
                   Op.from_json(d.get("victim")), BackwardNode.from_json(d.get("backward_node")),
                   d.get("saved_version"), d.get("current_version"),
                   Tensor.from_json(d.get("tensor")), bool(d.get("pytorch_raised", False)),
                   d.get("pytorch_message"), d.get("pytorch_names"),
                   bool(d.get("simulated", False)), d.get("backward_pass"),
                   d.get("node_exec_op"), d.get("evidence"), d.get("fingerprint"),
                   [Candidate.from_json(c) for c in d.get("candidates", [])],
                   list(d.get("kernels", [])), BackwardNode.from_json(d.get("recomputing")),
                   bool(d.get("recomputed", False)), d, d.get("step"),
                   bool(d.get("read_by_recompute", False)))

    def __str__(self) -> str:
        """One line: ``version: aten::mul_.Tensor at train.py:66 in step modified what
        SigmoidBackward0 saved (aten::sigmoid at train.py:65 in step)``."""
        culprit = f"{self.culprit} modified" if self.culprit else "modified"
        node = self.backward_node.name if self.backward_node else "backward"
        victim = f" ({self.victim})" if self.victim else ""
        return f"{self.kind}: {culprit} what {node} saved{victim}"


@dataclass
class GradientCut:
    """Where the gradient stopped: backward raised "does not require grad" (``raised``), or
    trainable parameters got no gradient from a backward that ran. cause: ``"no_grad"``,
    ``"inference_mode"``, ``"detach"``, ``"item"``, ``"numpy"``, ``"reentrant_checkpoint"``,
    ``"no_backward"`` or ``"no_parameter"``; op: the op that cut the path, at its line;
    checkpoint: for a reentrant checkpoint, its call; loss: the op that made the tensor backward
    was called on (raised only); parameters: ``[{"id", "name", "module", "shape"}]``, the first
    of ``parameter_count``; summary: ``"48 lora_A/lora_B in layers 0-11"``; help: what to
    change (replayer/SCHEMA.md, ``gradient_cuts``)."""
    cause: str
    raised: bool
    op: Optional[Op]
    checkpoint: Optional[Op]
    loss: Optional[Op]
    message: Optional[str]
    parameters: list
    parameter_count: int
    summary: str
    help: str
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: dict) -> "GradientCut":
        return cls(d.get("cause", ""), bool(d.get("raised", False)), Op.from_json(d.get("op")),
                   Op.from_json(d.get("checkpoint")), Op.from_json(d.get("loss")),
                   d.get("message"), list(d.get("parameters", [])),
                   d.get("parameter_count", 0), d.get("summary", ""), d.get("help", ""), d)

    def __str__(self) -> str:
        """One line: ``gradient cut (no_grad): aten::linear at train.py:12 in forward; 2 fc``."""
        at = self.checkpoint or self.op
        where = f": {at}" if at else ""
        kept = f"; {self.summary}" if self.summary else ""
        return f"gradient cut ({self.cause}){where}{kept}"


@dataclass
class NonFinite:
    """The first NaN or Inf that reached the loss, a gradient or a weight. cause:
    ``"overflow"``, ``"domain"``, ``"masked_row"``, ``"where_trap"``, ``"data"``,
    ``"optimizer"`` or ``"other"``; nan: a NaN (else an Inf); op: the op that made it from finite
    inputs, at its line (for a backward node, the node; for ``"data"``, the first op that read
    it); forward: for a backward node, the op that made it; became_nan: where its Inf turned into
    a NaN; dtype, dtype_max, input_max_abs: the output's dtype, its largest finite value, the
    inputs' largest finite magnitude; step; reached: ``"the loss"``, ``"a gradient"`` or ``"a
    weight"``; later_ops: the ops whose non-finite outputs follow from it; help: what to change
    (replayer/SCHEMA.md, ``non_finite``)."""
    cause: str
    nan: bool
    op: Optional[Op]
    backward: bool
    forward: Optional[Op]
    became_nan: Optional[Op]
    dtype: str
    dtype_max: float
    input_max_abs: float
    step: Optional[int]
    reached: str
    later_ops: int
    steps: int
    help: str
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: Optional[dict]) -> Optional["NonFinite"]:
        if not d:
            return None
        return cls(d.get("cause", ""), bool(d.get("nan", False)), Op.from_json(d.get("op")),
                   bool(d.get("backward", False)), Op.from_json(d.get("forward")),
                   Op.from_json(d.get("became_nan")), d.get("dtype", ""),
                   float(d.get("dtype_max", 0)), float(d.get("input_max_abs", 0)), d.get("step"),
                   d.get("reached", ""), d.get("later_ops", 0), d.get("steps", 0),
                   d.get("help", ""), d)

    def __str__(self) -> str:
        """One line: ``first NaN (domain): aten::log at train.py:12 in forward; reached the
        loss``."""
        at = self.forward if self.backward and self.forward else self.op
        where = f": {at}" if at else ""
        return (f"first {'NaN' if self.nan else 'Inf'} ({self.cause}){where}; reached "
                f"{self.reached}")


@dataclass
class Report:
    """The whole report. ``trace`` is the reader's verdict: ``{"path", "status": "ok" |
    "truncated" | "corrupt", "message", "warnings"}``."""
    schema_version: int
    violations: list
    ops: int = 0
    records: int = 0
    tensors: int = 0
    nodes: int = 0
    node_executions: int = 0
    backward_passes: int = 0
    version_bumps: int = 0
    data_loss_records: int = 0
    warnings: list = field(default_factory=list)
    trace: dict = field(default_factory=dict)
    raw: dict = field(default_factory=dict, repr=False)
    # `torchrr replay`'s exit code for this report: 0 clean, 1 violations or an unexplained error,
    # 4 truncated, 5 corrupt, 8 an incomplete recording, 10 a trace with no op, 15 a gradient cut,
    # 16 a NaN or Inf that reached the loss, a gradient or a weight (README).
    exit_code: int = 0
    # The trace replay() read (absolute), and the directory it ran in, whose source files the
    # text and the page quote: str() and the notebook's view render from them.
    path: Optional[str] = None
    cwd: Optional[str] = field(default=None, repr=False, compare=False)
    # The renderings, made on first use. Guarded by nothing: rendering twice is harmless.
    _text: Optional[str] = field(default=None, init=False, repr=False, compare=False)
    _html: Optional[str] = field(default=None, init=False, repr=False, compare=False)

    @property
    def recording(self) -> dict:
        """Whether the recording covers the run: ``{"complete", "empty", "stopped",
        "records_lost", "steps"}`` (replayer/SCHEMA.md)."""
        return dict(self.raw.get("recording") or {})

    @property
    def groups(self) -> list:
        """The violations that are one diagnostic (same kind, culprit line and victim line):
        ``[{"violations": [index, ...], "count", "steps", "modules"}]`` (replayer/SCHEMA.md)."""
        return list(self.raw.get("groups") or [])

    @property
    def program_error(self) -> Optional[dict]:
        """The error the program ended with when torchrr does not explain it (not about saved
        tensors): ``{"type", "message", "op"}``, or None."""
        return self.raw.get("program_error")

    @property
    def gradient_cuts(self) -> list:
        """Where the gradient stopped (GradientCut), in the order found; empty when every
        trainable parameter a backward could reach got its gradient."""
        return [GradientCut.from_json(c) for c in self.raw.get("gradient_cuts") or []]

    @property
    def non_finite(self) -> Optional[NonFinite]:
        """The first NaN or Inf that reached the loss, a gradient or a weight, or None."""
        return NonFinite.from_json(self.raw.get("non_finite"))

    @property
    def scaler_skipped_steps(self) -> int:
        """Steps whose gradients a GradScaler found non-finite and skipped (not an error)."""
        return int(self.raw.get("scaler_skipped_steps") or 0)

    @classmethod
    def from_json(cls, d: dict) -> "Report":
        return cls(d.get("schema_version", 0),
                   [Violation.from_json(v) for v in d.get("violations", [])],
                   d.get("ops", 0), d.get("records", 0), d.get("tensors", 0), d.get("nodes", 0),
                   d.get("node_executions", 0), d.get("backward_passes", 0),
                   d.get("version_bumps", 0), d.get("data_loss_records", 0),
                   list(d.get("warnings", [])), dict(d.get("trace") or {}), d)

    def __str__(self) -> str:
        """The text report, as ``torchrr replay --color never PATH`` prints it. Rendered once from
        the trace (a run of the CLI), then cached; when the trace is gone or cannot be rendered,
        a short summary made from the JSON (summary())."""
        if self._text is None:
            text = self._render("replay", "--color", "never")
            self._text = text if text else self.summary()
        return self._text

    def _repr_pretty_(self, p, cycle) -> None:
        """IPython's display: the text report."""
        p.text("Report(...)" if cycle else str(self))

    def _repr_html_(self) -> str:
        """A notebook's display: the content of ``torchrr report PATH -o page.html``'s page inline
        (its timeline and graphs are inline SVG; it has no script and loads nothing), with its
        style scoped to it. Written to no file. When the trace is gone, the summary, preformatted."""
        if self._html is None:
            page = self._render("report", "-o", "-")
            self._html = _inline_page(page) if page else \
                f'<pre class="torchrr-report">{html.escape(self.summary())}</pre>'
        return self._html

    def _render(self, verb: str, *options: str) -> Optional[str]:
        """``torchrr VERB OPTIONS... PATH``'s stdout; None when there is no trace to run it on or
        it wrote nothing (the CLI's own stderr is dropped)."""
        path = self.path or self.trace.get("path")
        if not path or not os.path.exists(path):
            return None
        cwd = self.cwd if self.cwd and os.path.isdir(self.cwd) else None
        try:
            proc = subprocess.run([_native.cli_path(), verb, *options, path], capture_output=True,
                                  text=True, errors="replace", cwd=cwd, timeout=_RENDER_TIMEOUT_S)
        except (OSError, RuntimeError, subprocess.TimeoutExpired):
            return None
        return proc.stdout or None

    def summary(self) -> str:
        """A few lines made from the JSON alone (no trace needed): the verdict of each
        violation, the program's unexplained error, whether the recording is whole, and the
        counts."""
        lines = [str(v) for v in self.violations]
        lines += [str(c) for c in self.gradient_cuts]
        if self.non_finite:
            lines.append(str(self.non_finite))
        error = self.program_error
        if error:
            lines.append(f"the program raised {error.get('type')}: {error.get('message')}, "
                         "which torchrr does not explain")
        recording = self.recording
        if recording.get("empty"):
            lines.append("the trace holds no op: it says nothing of the run")
        elif recording and not recording.get("complete", True):
            lines.append("the recording is incomplete")
        if self.trace.get("status") not in (None, "ok"):
            lines.append(f"the trace is {self.trace['status']}: {self.trace.get('message')}")
        count = len(self.violations)
        lines.append(f"{count} violation{'' if count == 1 else 's'} ({self.ops} ops, "
                     f"{self.node_executions} node executions in {self.backward_passes} backward "
                     f"pass{'' if self.backward_passes == 1 else 'es'})")
        return "\n".join(lines) + "\n"


# How long str() or a notebook waits for the CLI to render a report (the page runs Graphviz's dot
# for up to 20 graphs, each under its own time limit) before it shows the summary instead.
_RENDER_TIMEOUT_S = 300

_STYLE = re.compile(r"<style>(.*?)</style>", re.S)
_BODY = re.compile(r"<body>(.*)</body>", re.S)


def _inline_page(page: str) -> str:
    """The HTML report page's body in a ``<div class="torchrr-report">``, its style rules scoped
    to that div so that they do not restyle the notebook around it (``body`` becomes the div)."""
    body = _BODY.search(page)
    if body is None:
        return f'<pre class="torchrr-report">{html.escape(page)}</pre>'
    style = _STYLE.search(page)
    rules = []
    for rule in (style.group(1) if style else "").split("}"):
        selectors, brace, declarations = rule.partition("{")
        if not brace:
            continue
        scoped = [".torchrr-report" if s.strip() == "body" else f".torchrr-report {s.strip()}"
                  for s in selectors.split(",")]
        rules.append(f"{', '.join(scoped)} {{{declarations}}}")
    return (f'<div class="torchrr-report">\n<style>\n' + "\n".join(rules) + "\n</style>\n"
            + body.group(1).strip() + "\n</div>\n")


def replay(path: str | os.PathLike) -> Report:
    """Replays the trace at ``path`` with ``torchrr replay --json`` and returns its Report.

    A truncated or corrupt trace still gives a Report when anything could be analysed (its
    ``trace["status"]`` says so), as do an incomplete recording and a trace with no op:
    ``report.exit_code`` and ``report.recording`` tell which. Raises FileNotFoundError when ``path`` does not exist and
    ReplayError when the trace cannot be replayed (not a trace, unreadable, newer format).
    Never imports torch.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"torchrr: no trace at {path}")
    proc = subprocess.run([_native.cli_path(), "replay", "--json", path],
                          capture_output=True, text=True)
    document = None
    if proc.stdout.strip():
        try:
            document = json.loads(proc.stdout)
        except json.JSONDecodeError:
            document = None
    # Every exit code the CLI writes a report for (README, exit codes).
    if proc.returncode in (0, 1, 4, 5, 8, 10, 15, 16) and isinstance(document, dict) and \
            "violations" in document:
        report = Report.from_json(document)
        report.exit_code = proc.returncode
        report.path, report.cwd = os.path.abspath(path), os.getcwd()
        return report
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    message = lines[-1] if lines else f"no report (exit {proc.returncode})"
    raise ReplayError(path, proc.returncode, message)
