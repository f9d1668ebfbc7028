# EXPECT kind=version op=aten::mul_ node=CompiledFunctionBackward raised=1 victim_prefix=Torch-Compiled tags=compile,inductor,graph_break
# torch.compile (inductor), with a graph break: the second compiled region saves its output for
# backward (AOTAutograd's ctx.save_for_backward), and the program modifies that output in place.
# The victim is that second region, which f calls where the graph broke, named by the line inside
# it that saved the output.
import torch


def f(x, w):
    h = torch.tanh(x @ w)
    torch._dynamo.graph_break()
    return torch.sigmoid(h)  # VICTIM


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
y = torch.compile(f)(x * 2, w)
y.mul_(2)  # CULPRIT
y.sum().backward()
