# EXPECT kind=version op=aten::add_ node=CompiledFunctionBackward raised=1 victim_prefix=Torch-Compiled tags=compile,aot_eager,fullgraph
# torch.compile (aot_eager, fullgraph): the compiled region saves its input for backward, and the
# program modifies that input in place before backward. The victim is the region, named by the
# line inside it that backward uses the input for.
import torch


def f(x, w):
    return torch.sigmoid(x @ w) * x  # VICTIM


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
h = x * 2
y = torch.compile(f, backend="aot_eager", fullgraph=True)(h, w)
h.add_(1)  # CULPRIT
y.sum().backward()
