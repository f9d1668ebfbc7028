# EXPECT violations=0 exit=0 tags=compile,aot_eager,fullgraph
# Legal under torch.compile (aot_eager, fullgraph): in-place ops inside the compiled function
# (functionalized by AOTAutograd), and writes to a clone of its output.
import torch


def f(x, w):
    h = x @ w
    h.add_(1)
    h.mul_(2)
    return torch.sigmoid(h)


w = torch.randn(8, 8, requires_grad=True)
x = torch.randn(4, 8, requires_grad=True)
y = torch.compile(f, backend="aot_eager", fullgraph=True)(x * 2, w)
z = y.clone()
z.add_(1)
(y.sum() + z.sum()).backward()
