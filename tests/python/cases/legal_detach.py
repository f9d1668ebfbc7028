# EXPECT violations=0 exit=0
# Legal: out-of-place detach() leaves the saved tensor in its graph, and detach_() of a saved
# output is fine (autograd unpacks an output with its own node).
import torch

x = torch.randn(8, requires_grad=True)
a = x * 2
b = a.sin()
c = a.detach()
e = x.exp()
f = e * 3
e.detach_()
(b + f + c).sum().backward()
