"""A bug in a layer's forward bites in every layer built from it and at every step: the report is
one diagnostic that names the modules (their path from the model, their class) and the steps, and
each op names the nn.Module it ran under, through nn.Sequential, nn.ModuleList and
torch.compile alike."""
import json
import subprocess
import sys
import textwrap

import torchrr
from conftest import cli, marker_line, needs_build, record_warm

pytestmark = needs_build

# Two decoder-like layers in a ModuleList under a Sequential, four steps; the layer's forward
# halves its linear's output through .data after SiLU saved it (silent: PyTorch raises nothing).
LAYERS = textwrap.dedent("""\
    import torch
    from torch import nn
    torch.manual_seed(0)
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.act = nn.SiLU()
        def forward(self, x):
            x = self.fc(x)
            h = self.act(x)  # VICTIM
            x.data.mul_(0.5)  # CULPRIT
            return h
    class Decoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Layer(), Layer()])
        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x
    model = nn.Sequential(nn.Linear(8, 8), Decoder())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    """)


def _replay(trace, *flags):
    return subprocess.run([cli(), "replay", *flags, str(trace)], capture_output=True, text=True,
                          timeout=60)


def _diagnostics(text):
    return sum(line.startswith("error:") for line in text.splitlines())


def test_one_diagnostic_names_its_modules_and_steps(tmp_path):
    script = tmp_path / "layers.py"
    script.write_text(LAYERS)
    trace = tmp_path / "layers.trr"
    proc = record_warm(trace, [sys.executable, script], flags=("--quiet",))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(_replay(trace, "--json").stdout)
    violations = report["violations"]
    assert len(violations) == 8, [v["culprit"]["user_frame"] for v in violations]
    culprit_line = marker_line(script, "CULPRIT")
    assert {v["culprit"]["user_frame"]["line"] for v in violations} == {culprit_line}
    assert sorted(v["step"] for v in violations) == [0, 0, 1, 1, 2, 2, 3, 3]
    assert {v["culprit"]["module"] for v in violations} == {"1.layers.0 (Layer)",
                                                           "1.layers.1 (Layer)"}
    assert {v["victim"]["module"] for v in violations} == {"1.layers.0.act (SiLU)",
                                                          "1.layers.1.act (SiLU)"}
    [group] = report["groups"]
    assert group["count"] == 8 and group["steps"] == [0, 1, 2, 3]
    assert sorted(group["modules"]) == ["1.layers.0 (Layer)", "1.layers.1 (Layer)"]

    text = _replay(trace).stdout
    assert _diagnostics(text) == 1, text
    assert "8 times: in modules 1.layers.0-1 (Layer); steps 0-3; first at step 0" in text, text
    assert f"layers.py:{culprit_line} in Layer.forward, in 1.layers." in text, text
    assert "8 violations at 1 place" in text, text
    assert _diagnostics(_replay(trace, "--all").stdout) == 8

    # The Python API sees the same.
    api = torchrr.replay(trace)
    assert api.groups[0]["count"] == 8
    assert api.violations[0].culprit.module.endswith("(Layer)")
    assert sorted(v.step for v in api.violations) == [0, 0, 1, 1, 2, 2, 3, 3]


# torch.compile'd layers: the hooks do nothing while dynamo traces, so the graph is unchanged
# (no break), and the ops of the eager parts still name their module.
COMPILED = textwrap.dedent("""\
    import torch
    from torch import nn
    import torch._dynamo
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(8, 8), nn.SiLU(), nn.Linear(8, 1))
        def forward(self, x):
            y = self.body(x).sigmoid()  # VICTIM
            y.mul_(2)  # CULPRIT
            return y
    model = Net()
    model.body = torch.compile(model.body, backend="aot_eager")
    try:
        model(torch.randn(4, 8)).sum().backward()
    finally:
        print("graph breaks:", sum(torch._dynamo.utils.counters["graph_break"].values()))
    """)


def test_compiled_modules_are_unchanged_and_eager_ops_named(tmp_path):
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED)
    trace = tmp_path / "compiled.trr"
    proc = record_warm(trace, [sys.executable, script], flags=("--quiet",))
    assert "graph breaks: 0" in proc.stdout, proc.stdout + proc.stderr
    # torch's warning about global module hooks is about torchrr's own: not the program's output.
    assert "global hooks" not in proc.stderr, proc.stderr
    report = torchrr.replay(trace)
    # AOTAutograd's pass over the region while compiling is torch.compile's, not the program's.
    assert (report.backward_passes, report.raw["compile_passes"]) == (1, 1), report.raw
    [violation] = report.violations
    assert violation.culprit.user_frame.line == marker_line(script, "CULPRIT")
    assert violation.victim.user_frame.line == marker_line(script, "VICTIM")
    # The outermost module: named by its class alone; the compiled one by the module it wraps.
    assert violation.culprit.module == "(Net)"
    assert violation.victim.module == "(Net)"
    assert report.raw["violations"][0]["tensor"]["shape"] == [4, 1]


# Activation checkpointing recomputes a layer from backward, with no module running on the
# thread: its ops are named as in the forward, not by the layer's class alone.
CHECKPOINTED = textwrap.dedent("""\
    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint
    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
        def forward(self, x):
            return torch.sigmoid(self.fc(x))
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([Layer(), Layer()])
        def forward(self, x):
            for layer in self.layers:
                x = checkpoint(layer, x, use_reentrant=False)
            return x
    Net()(torch.randn(4, 8, requires_grad=True)).sum().backward()
    """)


def test_recomputed_layers_keep_their_module_paths(tmp_path):
    script = tmp_path / "checkpointed.py"
    script.write_text(CHECKPOINTED)
    trace = tmp_path / "checkpointed.trr"
    proc = record_warm(trace, [sys.executable, script], flags=("--quiet",))
    assert proc.returncode == 0, proc.stderr
    dump = subprocess.run([cli(), "dump", "--json", str(trace)], capture_output=True, text=True,
                          timeout=60)
    strings, after_backward, sigmoids = {}, False, []
    for line in dump.stdout.splitlines()[1:]:
        record_ = json.loads(line)
        if record_["kind"] == "string":
            strings[record_["id"]] = record_["text"]
        elif record_["kind"] == "op":
            after_backward |= record_["scope"] == "backward_function"
            if strings.get(record_["name"]) == "aten::sigmoid":
                sigmoids.append((after_backward, strings.get(record_["module_path"])))
    # Two in the forward, two recomputed in backward, each under its own layer.
    assert sorted(sigmoids) == [(False, "layers.0 (Layer)"), (False, "layers.1 (Layer)"),
                                (True, "layers.0 (Layer)"), (True, "layers.1 (Layer)")], sigmoids


# A module called from a method of the module that owns it other than forward (Lightning's
# training_step, a model's compute_loss): no module runs around it, and its path is the one the
# user reads in that method (`net.2`), not the one under the called module alone (`2`).
CALLED_FROM_A_METHOD = textwrap.dedent("""\
    import torch
    from torch import nn
    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
        def training_step(self, x):
            return self.net(x).sum()  # VICTIM
    model = Model()
    loss = model.training_step(torch.randn(4, 8))
    with torch.no_grad():
        model.net[2].weight.mul_(0.5)  # CULPRIT
    def helper(net, x):
        return net(x).sum()
    helper(model.net, torch.randn(4, 8))
    loss.backward()
    """)


def test_a_module_called_from_its_owners_method_is_named_under_it(tmp_path):
    script = tmp_path / "method.py"
    script.write_text(CALLED_FROM_A_METHOD)
    trace = tmp_path / "method.trr"
    proc = record_warm(trace, [sys.executable, script], flags=("--quiet",))
    assert proc.returncode != 0 and "modified by an inplace operation" in proc.stderr
    [violation] = torchrr.replay(trace).violations
    assert violation.culprit.user_frame.line == marker_line(script, "CULPRIT")
    assert violation.victim.user_frame.line == marker_line(script, "VICTIM")
    assert violation.victim.module == "net.2 (Linear)"
