# EXPECT kind=version op=aten::add_ node=TanhBackward0 victim_op=aten::tanh raised=1 tags=compile,aot_eager,graph_break
# torch.compile (aot_eager) with a graph break: the second of the two compiled regions modifies in
# place a tensor that tanh saved inside it; the trace of that region's backward raises.
import torch


def f(x, w):
    h = torch.relu(x @ w)
    torch._dynamo.graph_break()
    t = torch.tanh(h * 3)  # VICTIM
    t.add_(1)  # CULPRIT
    return t * h


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
torch.compile(f, backend="aot_eager")(x, w).sum().backward()
