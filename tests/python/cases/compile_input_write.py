# EXPECT kind=version op=aten::add_ node=CompiledFunctionBackward raised=1 victim_prefix=Torch-Compiled tags=compile,aot_eager,fullgraph
# torch.compile (aot_eager, fullgraph): the compiled region saves its input for backward, and the
# program modifies that input in place before backward.
import torch


def f(x, w):
    return torch.sigmoid(x @ w) * x


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
h = x * 2
y = torch.compile(f, backend="aot_eager", fullgraph=True)(h, w)  # VICTIM
h.add_(1)  # CULPRIT
y.sum().backward()
